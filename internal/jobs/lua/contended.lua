-- contended: a task found its lock busy. Count it, and put the task among
-- the resource's waiters, so that the next holder's release wakes it.
--
-- KEYS[1]  counter of the task      lockstep:{R}:contended:<queue>:<task id>
-- KEYS[2]  waiters of the resource  lockstep:{R}:waiters  (zset: task -> first contention, Unix ms)
-- ARGV[1]  ttl of both keys in milliseconds, refreshed on every call
-- ARGV[2]  the task as a waiter: JSON ["<queue>", "<task id>"]
-- ARGV[3]  now, Unix milliseconds
--
-- Returns {count, ahead}: count is 1 the first time; ahead is the number of
-- tasks that have waited longer.
--
-- The count drives the requeue backoff (it grows with repeated contention).
-- It lives in Redis, not in the task, because asynq gives a handler no way to
-- change its own task, and not in the worker, because the next delivery may
-- go to another worker. A waiter keeps its first place (NX) when it contends
-- again. Both keys expire on their own once the resource cools down.
local n = redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], 'NX', ARGV[3], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return {n, redis.call('ZRANK', KEYS[2], ARGV[2])}
