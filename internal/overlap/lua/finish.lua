-- finish: the worker of a run is done with it, before it releases the run lock.
--
-- KEYS[1]  runs  lockstep:{schedule:N}:runs  hash: task id -> "q <ms>", "q", "r" or "x <task id>"
--                                           (see tick.lua)
-- ARGV[1]  the task id
-- ARGV[2]  "1" if asynq will run the task again (it failed with retries left): the run is queued
--          again ("q"), so that it stays live once the run lock is released; "0" if it ended
--
-- Returns 1 if the run was live, 0 if it had ended already (it was cancelled: its "x" mark is
-- removed here).
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then
  return 0
end
if string.sub(v, 1, 1) == 'x' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return 0
end
if ARGV[2] == '1' then
  redis.call('HSET', KEYS[1], ARGV[1], 'q')
else
  redis.call('HDEL', KEYS[1], ARGV[1])
end
return 1
