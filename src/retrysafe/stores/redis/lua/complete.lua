-- Store the response of an in-progress record (committed or not) and keep it for the
-- retention, fenced by its token; a completed record is never overwritten (once only).
-- KEYS[1] record key; ARGV[1] token, ARGV[2] response, ARGV[3] retention in ms.
-- Returns 1, or 0 when fenced out.
local v = redis.call('HMGET', KEYS[1], 't', 's')
if v[1] ~= ARGV[1] or (v[2] ~= '0' and v[2] ~= '2') then
  return 0
end
redis.call('HSET', KEYS[1], 's', '1', 'r', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
