-- Reserve a key, or read the record that holds it: one atomic step (guarantee 1).
-- KEYS[1] record key; ARGV[1] fingerprint, ARGV[2] new token, ARGV[3] lease in ms.
-- The record is a hash: f = fingerprint, t = token, s = state (0 in progress, 1 completed),
-- r = stored response. While in progress the key's TTL is the lease, so a crashed owner's
-- record vanishes when its lease lapses and the next reserve simply creates a new one
-- (takeover); once completed the TTL is the retention.
-- Returns {1} when this call won; {0, fingerprint, pttl_ms} for an in-progress record;
-- {2, fingerprint, response} for a completed one.
local v = redis.call('HMGET', KEYS[1], 's', 'f', 'r')
if not v[1] then
  redis.call('HSET', KEYS[1], 'f', ARGV[1], 't', ARGV[2], 's', '0')
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {1}
end
if v[1] == '1' then
  return {2, v[2], v[3]}
end
return {0, v[2], redis.call('PTTL', KEYS[1])}
