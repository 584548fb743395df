-- grant: let asynq deliver the waiter that a held lock was handed to (when
-- the hand-off chain cannot run it: the server stops, or lacks its handler).
-- Its take.lua then takes the lock over instead of waiting.
--
-- KEYS[1]  lock key   lockstep:{R}
-- KEYS[2]  grant      lockstep:{R}:grant
-- ARGV[1]  token the lock was handed on with
-- ARGV[2]  the waiter: JSON ["<queue>", "<task id>"]
-- ARGV[3]  lock ttl in milliseconds
--
-- Returns 1 granted, 0 the lock no longer holds the token.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
