-- Read a record in one round trip. KEYS[1] record key.
-- Returns nil when absent; {0, fingerprint, pttl_ms} in progress; {2, fingerprint, response}
-- completed (the same shapes as reserve.lua).
local v = redis.call('HMGET', KEYS[1], 's', 'f', 'r')
if not v[1] then
  return nil
end
if v[1] == '1' then
  return {2, v[2], v[3]}
end
return {0, v[2], redis.call('PTTL', KEYS[1])}
