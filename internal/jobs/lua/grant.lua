-- grant: leave the waiter that a held lock was handed to for asynq to
-- deliver (when the hand-off chain cannot run it: the server stops, it lacks
-- the task's handler, or the waiter waits in its worker). The lock's value
-- becomes "g:<waiter>:<token>", which the waiter's take.lua recognises and
-- takes over as its token; no one else can take the lock meanwhile.
--
-- KEYS[1]  lock key   lockstep:{R}
-- ARGV[1]  token the lock was handed on with
-- ARGV[2]  the waiter: JSON ["<queue>", "<task id>"]
-- ARGV[3]  lock ttl in milliseconds
--
-- Returns 1 granted, 0 the lock no longer holds the token.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], 'g:' .. ARGV[2] .. ':' .. ARGV[1], 'PX', ARGV[3])
return 1
