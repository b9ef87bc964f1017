-- Delete a record whatever its state (an operator resolving an unknown outcome).
-- KEYS[1] record key. Returns 1 when there was one, else 0.
return redis.call('DEL', KEYS[1])
