-- Reserve a key, or read the record that holds it: one atomic step (guarantee 1).
-- KEYS[1] record key; ARGV[1] fingerprint, ARGV[2] new token, ARGV[3] lease in ms,
-- ARGV[4] retention in ms; ARGV[5], when given, a lease in ms: a won reservation is created
-- committed at once, as mark_committed.lua leaves it (the proxy, holding an upstream connection,
-- saves the mark's round trip).
-- The record is a hash: f = fingerprint, t = token, s = state (0 in progress, 2 in progress
-- with its effects committed, 1 completed), r = stored response, x = end of retention and
-- l = end of lease (server ms; l only once committed).
-- While in progress the key's TTL is the lease, so a crashed owner's record vanishes when its
-- lease lapses and the next reserve simply creates a new one (takeover). A committed record is
-- never taken over: its TTL is the retention, its lease is kept in l. Completed: the retention.
-- Returns {1} when this call won (also when it finds its own token: see below), else the
-- record as get.lua does plus the holder's token (owner liveness: reserve asks whether that
-- token's owner is alive, and take_over.lua replaces it if not).
local v = redis.call('HMGET', KEYS[1], 's', 'f', 'r', 'l', 't')
if not v[1] then
  local now = redis.call('TIME')
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  local x = ms + tonumber(ARGV[4])
  if ARGV[5] then
    redis.call('HSET', KEYS[1], 'f', ARGV[1], 't', ARGV[2], 's', '2', 'x', x, 'l', ms + tonumber(ARGV[5]))
    redis.call('PEXPIREAT', KEYS[1], x)
  else
    redis.call('HSET', KEYS[1], 'f', ARGV[1], 't', ARGV[2], 's', '0', 'x', x)
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
  end
  return {1}
end
if v[1] == '1' then
  return {2, v[2], v[3]}
end
local t = v[5]
if t == ARGV[2] then
  -- This caller's own reservation: a resent call, or a retry whose first reply was lost. Won
  -- again, its lease restarting now; being a write, it also makes a WAIT after this call
  -- cover the first one, whichever connection that came on.
  if v[1] == '2' then
    local now = redis.call('TIME')
    local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
    redis.call('HSET', KEYS[1], 'l', ms + tonumber(ARGV[5] or ARGV[3]))
  else
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
  end
  return {1}
end
if v[1] == '2' then
  local now = redis.call('TIME')
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  return {3, v[2], math.max(0, tonumber(v[4]) - ms), t}
end
return {0, v[2], redis.call('PTTL', KEYS[1]), t}
