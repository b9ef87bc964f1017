-- Owner liveness: whether a process's heartbeat key exists. KEYS[1] the heartbeat key
-- (retrysafe-owner:<prefix><instance id>, renewed by that process's heartbeat thread with a
-- short TTL).
-- A script rather than EXISTS so that every store call goes through one path. Returns 1 or 0.
return redis.call('EXISTS', KEYS[1])
