-- Extend the lease of an in-progress record, fenced by its token (guarantees 2 and 3).
-- KEYS[1] record key; ARGV[1] token, ARGV[2] lease in ms. Returns 1, or 0 when fenced out.
-- Uncommitted, the lease is the key's TTL; committed, the key lives for the retention and the
-- lease is the l field.
local v = redis.call('HMGET', KEYS[1], 't', 's')
if v[1] ~= ARGV[1] then
  return 0
end
if v[2] == '0' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if v[2] == '2' then
  local now = redis.call('TIME')
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  redis.call('HSET', KEYS[1], 'l', ms + tonumber(ARGV[2]))
  return 1
end
return 0
