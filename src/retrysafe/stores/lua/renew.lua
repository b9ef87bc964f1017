-- Extend the lease of an in-progress record, fenced by its token (guarantees 2 and 3).
-- KEYS[1] record key; ARGV[1] token, ARGV[2] lease in ms. Returns 1, or 0 when fenced out.
local v = redis.call('HMGET', KEYS[1], 't', 's')
if v[1] ~= ARGV[1] or v[2] ~= '0' then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
