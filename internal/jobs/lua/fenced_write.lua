-- fenced_write: the demo job's fenced store. Accept a write only from a
-- holder whose fencing token is not lower than the last one written, so a
-- holder whose lock passed on (paused past its TTL, cut off) cannot overwrite
-- the work of the next one.
--
-- KEYS[1]  the order's record   lockstep:demo:order:<order_id>  (hash)
-- ARGV[1]  fence of the writer
-- ARGV[2]  worker id of the writer
-- ARGV[3]  time of the write, Unix milliseconds
--
-- Returns
--   {1, fence}  written: the hash holds fence, worker, written_ms; writes + 1
--   {0, last}   rejected: last is the higher fence already written
local last = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
local fence = tonumber(ARGV[1])
if fence < last then
  return {0, last}
end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'worker', ARGV[2], 'written_ms', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'writes', 1)
return {1, fence}
