-- recover: bring back at once the task of a worker that died holding its
-- lock (the lock has expired or was released since), instead of after
-- asynq's own lease and recoverer: an active task leaves the active list
-- and its lease, a handed-on task (claimed in the retry set) leaves the
-- retry set, and either goes to the head of its queue, pending. Any other
-- state (completed, archived, pending, scheduled, gone) is left alone, and
-- so is a task in the retry set when ARGV[3] is "active" (a task its dead
-- worker held no lock for: in the retry set, asynq has it again).
-- An active task that a later dequeue delivered to another worker than the
-- dead one (the task hash's lockstep:worker, dequeue.lua) is that worker's
-- and is left alone too: the dead worker's record of it was a leftover.
--
-- This follows asynq v0.26's layout (internal/rdb): the task hash's state,
-- the active list, the lease and retry zsets and the pending list, all under
-- the queue's hash tag.
--
-- KEYS[1]  task hash     asynq:{<queue>}:t:<task id>
-- KEYS[2]  active list   asynq:{<queue>}:active
-- KEYS[3]  lease zset    asynq:{<queue>}:lease
-- KEYS[4]  retry zset    asynq:{<queue>}:retry
-- KEYS[5]  pending list  asynq:{<queue>}:pending
-- ARGV[1]  task id
-- ARGV[2]  now, Unix nanoseconds (pending_since)
-- ARGV[3]  "active": recover an active task only
-- ARGV[4]  the dead worker's process (host:pid); an active task stamped by
--          another process's dequeue is left alone ("" or no stamp: not checked)
--
-- Returns the task's encoded message when recovered, 0 when left alone.
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'active' then
  local by = redis.call('HGET', KEYS[1], 'lockstep:worker')
  if by and ARGV[4] ~= '' and by ~= ARGV[4] then
    return 0
  end
  if redis.call('LREM', KEYS[2], 0, ARGV[1]) == 0 then
    return 0
  end
  redis.call('ZREM', KEYS[3], ARGV[1])
elseif state == 'retry' and ARGV[3] ~= 'active' then
  local group = redis.call('HGET', KEYS[1], 'group')
  if (group and group ~= '') or redis.call('ZREM', KEYS[4], ARGV[1]) == 0 then
    return 0
  end
else
  return 0
end
redis.call('RPUSH', KEYS[5], ARGV[1])
redis.call('HSET', KEYS[1], 'state', 'pending', 'pending_since', ARGV[2])
return redis.call('HGET', KEYS[1], 'msg')
