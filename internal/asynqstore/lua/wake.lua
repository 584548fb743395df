-- wake: offer a task that waits for a lock again now, instead of at its
-- retry time: move it from asynq's retry set to the head of its queue, as
-- asynq's forwarder does once the retry time has come. It touches a task only
-- in the retry state, so a task that completed, was archived or runs is never
-- run again by a wake.
--
-- This follows asynq v0.26's layout (forwardCmd in internal/rdb): the task
-- hash's state and group fields, the retry zset and the pending list, all
-- under the queue's hash tag.
--
-- KEYS[1]  task hash     asynq:{<queue>}:t:<task id>
-- KEYS[2]  retry zset    asynq:{<queue>}:retry
-- KEYS[3]  pending list  asynq:{<queue>}:pending
-- ARGV[1]  task id
-- ARGV[2]  now, Unix nanoseconds (pending_since)
-- ARGV[3]  "last": to the end of its queue instead (behind every pending
--          task, as asynq's enqueue puts a task)
--
-- Returns
--    1  moved: the next dequeue takes it
--   -1  still active: it is on its way to the retry set (or contending again)
--    0  anything else (done, pending, grouped): nothing changed
--    2  gone: asynq has no such task (deleted, or completed without retention)
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  return 2
end
if state == 'active' then
  return -1
end
if state ~= 'retry' then
  return 0
end
local group = redis.call('HGET', KEYS[1], 'group')
if group and group ~= '' then
  return 0
end
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then
  return 0
end
-- asynq dequeues from the right: RPUSH puts the task first in line, since the
-- resource it waits for is free now; LPUSH last, as an enqueue does.
if ARGV[3] == 'last' then
  redis.call('LPUSH', KEYS[3], ARGV[1])
else
  redis.call('RPUSH', KEYS[3], ARGV[1])
end
redis.call('HSET', KEYS[1], 'state', 'pending', 'pending_since', ARGV[2])
return 1
