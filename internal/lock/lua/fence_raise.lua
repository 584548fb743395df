-- fence_raise: Redlock only. Lift this node's fencing counter to the fence the
-- lease was given (the highest counter among the nodes that granted it), but
-- only while this node still holds the lease's token: a later holder can set
-- the key here only after that, so its INCR here returns more than the fence.
--
-- KEYS[1]  lock key            lockstep:{R}
-- KEYS[2]  fencing counter     lockstep:{R}:fence
-- ARGV[1]  token
-- ARGV[2]  fence
-- ARGV[3]  fencing counter ttl in milliseconds
--
-- Returns
--   1   the counter is now at least the fence
--   0   the key no longer holds the token (counter left alone)
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local cur = tonumber(redis.call('GET', KEYS[2]) or '0')
if cur < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
