-- grant: leave a lock that a chain was handed for a task waiter to that
-- task, for asynq to deliver (when the chain cannot run it: the server
-- stops, or it lacks the task's handler). The lock's value becomes
-- "g:<member>:<fence>", which the task's take.lua recognises and takes over;
-- no one else can take the lock meanwhile.
--
-- KEYS[1]  lock key   lockstep:{R}
-- ARGV[1]  token the lock was handed on with
-- ARGV[2]  the task waiter (keys.go)
-- ARGV[3]  lock ttl in milliseconds
-- ARGV[4]  the fence of the hand-off
--
-- Returns 1 granted, 0 the lock no longer holds the token.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], 'g:' .. ARGV[2] .. ':' .. ARGV[4], 'PX', ARGV[3])
return 1
