-- claim: record that one back end serves a key prefix (Locker.ClaimPrefix),
-- unless another one does. Two back ends on one prefix would each grant the
-- same resource's permits: a limit-2 resource held four times.
--
-- KEYS[1]  the prefix's claim   lockstep:backend
-- ARGV[1]  the back end's name (lock.backend: redis, redlock or etcd)
-- ARGV[2]  ttl in milliseconds (the claimer renews it while it runs)
--
-- Returns the name of the back end that serves the prefix now: ARGV[1]
-- (claimed or renewed), or the other one (left alone).
local v = redis.call('GET', KEYS[1])
if v and v ~= ARGV[1] then
  return v
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ARGV[1]
