-- claim: complete the task a hand-off chain just ran, and claim the next one
-- it was handed to, in asynq v0.26's layout (internal/rdb), under the
-- queue's hash tag. Both tasks wait in asynq's retry set while a chain owns
-- them: their score (Unix seconds) is their lease. A chain that dies leaves
-- the task to come back when the score passes, through asynq's own
-- forwarder.
--
-- KEYS[1]  retry zset              asynq:{<queue>}:retry
-- KEYS[2]  finished task's hash    asynq:{<queue>}:t:<id>
-- KEYS[3]  processed today         asynq:{<queue>}:processed:<yyyy-mm-dd>
-- KEYS[4]  processed total         asynq:{<queue>}:processed
-- KEYS[5]  unique key of the finished task (or any key of the queue's tag)
-- KEYS[6]  next task's hash        asynq:{<queue>}:t:<id>
-- KEYS[7]  completed zset          asynq:{<queue>}:completed
-- ARGV[1]  finished task id, or "" for none
-- ARGV[2]  expiry of the daily counter (Unix s)
-- ARGV[3]  "1": the finished task has a unique key (KEYS[5])
-- ARGV[4]  next task id, or "" for none
-- ARGV[5]  lease of the next task: its new retry score (Unix s)
-- ARGV[6]  the finished task's retention ends (Unix s), or "" for none
-- ARGV[7]  the finished task's message with its completion time, when it
--          has a retention (asynq keeps it completed until then)
--
-- Returns {done, claimed, msg}:
--   done     1 the finished task was completed as asynq's Done does
--            (deleted, or kept completed for its retention); 0 it
--            was no longer ours (its lease had passed and asynq took it back)
--   claimed   1 claimed, msg is its encoded message
--            -1 still active: on its way to the retry set
--             2 pending: on its way to a worker (its retry time came, or a
--               recoverer brought it back) that will take the lock
--             0 gone, done or grouped: not ours to run
local done = 0
if ARGV[1] ~= '' and redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  if ARGV[6] ~= '' then
    redis.call('ZADD', KEYS[7], ARGV[6], ARGV[1])
    redis.call('HSET', KEYS[2], 'msg', ARGV[7], 'state', 'completed')
  else
    redis.call('DEL', KEYS[2])
  end
  if redis.call('INCR', KEYS[3]) == 1 then
    redis.call('EXPIREAT', KEYS[3], ARGV[2])
  end
  redis.call('INCR', KEYS[4])
  if ARGV[3] == '1' and redis.call('GET', KEYS[5]) == ARGV[1] then
    redis.call('DEL', KEYS[5])
  end
  done = 1
end
if ARGV[4] == '' then
  return {done, 0}
end
local t = redis.call('HMGET', KEYS[6], 'state', 'msg')
if t[1] == 'active' then
  return {done, -1}
end
if t[1] == 'pending' then
  return {done, 2}
end
-- CH counts a changed score; an unchanged one (the lease equals its retry
-- time) is the rare case that needs a look.
if t[1] ~= 'retry' or (redis.call('ZADD', KEYS[1], 'XX', 'CH', ARGV[5], ARGV[4]) == 0
    and not redis.call('ZSCORE', KEYS[1], ARGV[4])) then
  return {done, 0}
end
return {done, 1, t[2]}
