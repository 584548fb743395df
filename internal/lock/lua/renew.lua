-- renew: extend the lock's ttl only if it still holds our token.
--
-- KEYS[1]  lock key
-- KEYS[2]  reentrancy hash (ignored when ARGV[3] is "")
-- KEYS[3]  fencing counter (its TTL renewed too: it outlives the lock)
-- ARGV[1]  token
-- ARGV[2]  new ttl in milliseconds
-- ARGV[3]  "1" when the lease is reentrant (the hash expires with the lock)
-- ARGV[4]  the fencing counter's new ttl in milliseconds (ttl + fence ttl)
-- KEYS[4]  (a permit k > 0 only) the resource's limit hash lockstep:{R}:limit,
--          which lives at least as long as the counter (lib.lua)
--
-- Returns
--   1   renewed
--   0   the key is gone: the lease expired
--  -1   the key holds another token: the lock was taken over (left alone)
local cur = redis.call('GET', KEYS[1])
if not cur then
  return 0
end
if cur ~= ARGV[1] then
  return -1
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[3], ARGV[4])
if KEYS[4] and redis.call('PTTL', KEYS[4]) < tonumber(ARGV[4]) then
  redis.call('PEXPIRE', KEYS[4], ARGV[4])
end
if ARGV[3] ~= '' then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return 1
