-- next_waiter: after a release, take the resource's longest waiting task.
--
-- KEYS[1]  waiters of the resource  lockstep:{R}:waiters
-- ARGV[1]  the task that just released the lock, as a waiter (it waits no
--          more), or "" on a second call
--
-- Returns {member, score} of the removed waiter, or {} when none waits.
if ARGV[1] ~= '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
end
return redis.call('ZPOPMIN', KEYS[1])
