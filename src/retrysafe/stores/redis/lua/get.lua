-- Read a record in one round trip. KEYS[1] record key.
-- Returns nil when absent; {0, fingerprint, lease ms} in progress; {3, fingerprint, lease ms}
-- in progress with its effects committed; {2, fingerprint, response} completed (the shapes
-- reserve.lua returns for a key it did not win).
local v = redis.call('HMGET', KEYS[1], 's', 'f', 'r', 'l')
if not v[1] then
  return nil
end
if v[1] == '1' then
  return {2, v[2], v[3]}
end
if v[1] == '2' then
  local now = redis.call('TIME')
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  return {3, v[2], math.max(0, tonumber(v[4]) - ms)}
end
return {0, v[2], redis.call('PTTL', KEYS[1])}
