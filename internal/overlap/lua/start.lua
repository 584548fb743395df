-- start: a worker holding a schedule's run lock starts the run of one task, or learns that the
-- run has ended meanwhile (a later tick found it ended, or cancelled it: cancel_previous).
--
-- KEYS[1]  runs  lockstep:{schedule:N}:runs  hash: task id -> "q <ms>", "q", "r" or "x <task id>"
--                                           (see tick.lua)
-- ARGV[1]  the task id
--
-- Returns 1 if the run is live: it is marked running ("r"); 0 if it is no run of the schedule any
-- more (gone, or cancelled: "x", removed here): the worker does not run it.
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then
  return 0
end
if string.sub(v, 1, 1) == 'x' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], 'r')
return 1
