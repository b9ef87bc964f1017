-- Delete an in-progress record (committed or not) so a retry can run, fenced by its token.
-- KEYS[1] record key; ARGV[1] token. Returns 1, or 0 when fenced out.
local v = redis.call('HMGET', KEYS[1], 't', 's')
if v[1] ~= ARGV[1] or (v[2] ~= '0' and v[2] ~= '2') then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
