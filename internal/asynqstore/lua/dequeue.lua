-- dequeue: asynq's dequeue of one task from a queue (asynq v0.26.0's
-- layout, internal/rdb there: paused key, pending and active lists, lease
-- zset, task hash), which also records the task in the holds set of the
-- worker's process, in the same step: a worker killed at any moment after
-- it took a task from asynq leaves a record for a recoverer (see
-- internal/jobs/recovery.go) instead of a task that only asynq's lease
-- brings back.
--
-- KEYS[1]  pending list   asynq:{<queue>}:pending
-- KEYS[2]  paused key     asynq:{<queue>}:paused
-- KEYS[3]  active list    asynq:{<queue>}:active
-- KEYS[4]  lease zset     asynq:{<queue>}:lease
-- KEYS[5]  holds set of this worker's process; none on a Cluster (another
--          slot): the task is then not recorded here, only its worker noted
-- ARGV[1]  the lease's expiry, Unix seconds
-- ARGV[2]  the task hash's key prefix, asynq:{<queue>}:t:
-- ARGV[3]  the record's text before the task id
-- ARGV[4]  the record's text after the task id
-- ARGV[5]  the worker's process (host:pid), kept in the task hash's field
--          lockstep:worker: whose delivery the task is while it is active
--          (recover.lua, Holds), since only a dequeue makes a task active
--
-- Returns the task's encoded message, or nil when the queue is paused or
-- empty. A task id that JSON would escape is not recorded (the record names
-- it inside a JSON string): such a task comes back by asynq's lease.
if redis.call('EXISTS', KEYS[2]) == 1 then
  return nil
end
local id = redis.call('RPOPLPUSH', KEYS[1], KEYS[3])
if not id then
  return nil
end
local key = ARGV[2] .. id
redis.call('HSET', key, 'state', 'active', 'lockstep:worker', ARGV[5])
redis.call('HDEL', key, 'pending_since')
redis.call('ZADD', KEYS[4], ARGV[1], id)
if KEYS[5] and not string.find(id, '[%c"\\<>&\128-\255]') then
  redis.call('SADD', KEYS[5], ARGV[3] .. id .. ARGV[4])
end
return redis.call('HGET', key, 'msg')
