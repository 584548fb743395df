-- park: move tasks that wait for their fair share from the pending list to
-- asynq's retry set, as asynq's own retry leaves a task (no attempt used:
-- the message and its retry count stay as they are), so that no worker
-- dequeues them before their turn. Only a task still pending moves; one
-- dequeued meanwhile is left to its worker. Its retry score is the fallback
-- that brings it back should its turn never be given (the fair state lost);
-- a turn given brings it back at once (wake.lua).
--
-- This follows asynq v0.26's layout (internal/rdb): the task hash's state,
-- the pending list and the retry zset, all under the queue's hash tag.
--
-- KEYS[1]  pending list  asynq:{<queue>}:pending
-- KEYS[2]  retry zset    asynq:{<queue>}:retry
-- ARGV[1]  the task hash's key prefix, asynq:{<queue>}:t:
-- ARGV[2]  the fallback retry time, Unix seconds
-- ARGV[3..] task ids
--
-- Returns the ids of the tasks moved.
local moved = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local task = ARGV[1] .. id
  if redis.call('HGET', task, 'state') == 'pending' and redis.call('LREM', KEYS[1], -1, id) == 1 then
    redis.call('ZADD', KEYS[2], ARGV[2], id)
    redis.call('HSET', task, 'state', 'retry')
    moved[#moved + 1] = id
  end
end
return moved
