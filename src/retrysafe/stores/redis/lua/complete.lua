-- Store the response of an in-progress record (committed or not) and keep it for the
-- retention, fenced by its token; a completed record is never overwritten (once only).
-- KEYS[1] record key; ARGV[1] token, ARGV[2] response, ARGV[3] retention in ms.
-- Returns 1, or 0 when fenced out. The same completion sent again (same token, same response:
-- its first reply was lost) answers 1 and writes the retention again, so a WAIT after it
-- covers the first.
local v = redis.call('HMGET', KEYS[1], 't', 's')
if v[1] ~= ARGV[1] then
  return 0
end
if v[2] == '1' then
  if redis.call('HGET', KEYS[1], 'r') ~= ARGV[2] then
    return 0
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
if v[2] ~= '0' and v[2] ~= '2' then
  return 0
end
redis.call('HSET', KEYS[1], 's', '1', 'r', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
