-- begin: a demo run's fenced "begin", before it works. It records that the
-- holder of fence has started, so that from now on no lower fence can commit:
-- a stale holder (paused, cut off) is refused as soon as the next holder has
-- begun, not only once it has finished.
--
-- KEYS[1]  the order's record   lockstep:demo:order:<order_id>  (hash)
-- KEYS[2]  optional: the accepted-writes log   lockstep:demo:writes (stream)
-- ARGV[1]  fence of the run
-- ARGV[2]  task id of the run
-- ARGV[3]  worker id
-- ARGV[4]  approximate cap of the log
-- ARGV[5]  order id
--
-- Returns
--   {1, fence}   begun: the hash's begun field holds fence
--   {0, higher}  refused: a run with a fence >= this one began or committed
local begun = tonumber(redis.call('HGET', KEYS[1], 'begun') or '0')
local committed = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
local fence = tonumber(ARGV[1])
if fence <= begun or fence <= committed then
  return {0, math.max(begun, committed)}
end
redis.call('HSET', KEYS[1], 'begun', ARGV[1], 'begun_task', ARGV[2])
if KEYS[2] then
  local t = redis.call('TIME')
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*',
    'order_id', ARGV[5], 'fence', ARGV[1], 'task_id', ARGV[2], 'worker', ARGV[3],
    'op', 'begin', 'at_ms', tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)))
end
return {1, fence}
