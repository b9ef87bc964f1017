-- Declare the in-progress request's side effects committed, fenced by its token, and extend
-- its lease. From then on the record is never taken over: the key lives until the end of its
-- retention (x, set by reserve.lua) and the lease moves into the l field.
-- KEYS[1] record key; ARGV[1] token, ARGV[2] lease in ms. Returns 1, or 0 when fenced out.
local v = redis.call('HMGET', KEYS[1], 't', 's', 'x')
if v[1] ~= ARGV[1] or (v[2] ~= '0' and v[2] ~= '2') then
  return 0
end
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('HSET', KEYS[1], 's', '2', 'l', ms + tonumber(ARGV[2]))
redis.call('PEXPIREAT', KEYS[1], v[3])
return 1
