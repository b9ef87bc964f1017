-- Take over an in-progress record whose owner is dead (its heartbeat key lapsed), fenced on
-- the very token that was found: if the record changed hands, was committed or completed in
-- between, nothing happens. KEYS[1] record key; ARGV[1] holder token, ARGV[2] fingerprint,
-- ARGV[3] new token, ARGV[4] lease in ms, ARGV[5] retention in ms.
-- Returns 1 when taken over, else 0.
local v = redis.call('HMGET', KEYS[1], 't', 's')
if v[1] ~= ARGV[1] or v[2] ~= '0' then
  return 0
end
local now = redis.call('TIME')
local x = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) + tonumber(ARGV[5])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'f', ARGV[2], 't', ARGV[3], 's', '0', 'x', x)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
