-- commit: a demo run's fenced final write. Accepted only from the run that
-- began last: a lower fence, or a run that another one began after, is
-- refused. Together with begin.lua this is the pattern to fence one's own
-- store: every write carries the fence, and the store keeps the highest one
-- that began.
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
--   {1, fence}   written: fence, worker, written_ms set; writes + 1
--   {0, begun}   refused: begun is the fence that began since (or 0)
local begun = tonumber(redis.call('HGET', KEYS[1], 'begun') or '0')
if tonumber(ARGV[1]) ~= begun then
  return {0, begun}
end
local t = redis.call('TIME')
local now = tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'worker', ARGV[3], 'written_ms', now, 'task_id', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'writes', 1)
if KEYS[2] then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*',
    'order_id', ARGV[5], 'fence', ARGV[1], 'task_id', ARGV[2], 'worker', ARGV[3],
    'op', 'commit', 'at_ms', now)
end
return {1, tonumber(ARGV[1])}
