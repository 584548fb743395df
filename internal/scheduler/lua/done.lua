-- done: mark a claimed tick done once its task is in the queue, or drop it.
--
-- KEYS[1]  tick lock   lockstep:{schedule:N}:tick:<T>
-- KEYS[2]  pending     lockstep:{schedule:N}:pending
-- ARGV[1]  T in Unix seconds
-- ARGV[2]  token of the attempt that enqueued ("" to drop a tick without holding it)
-- KEYS[3]  history     lockstep:{schedule:N}:history  list of tick records (JSON), newest first
-- ARGV[3]  the record to push if T was pending
-- ARGV[4]  how many records the history keeps
-- ARGV[5]  ttl of the history in milliseconds
--
-- Returns {removed, held}
--   removed  1 if T was pending (0: another replica marked or dropped it already)
--   held     1 if the token still held the tick, whose lock is then deleted; 0 if its lease had
--            passed to a taker or expired: the tick is done all the same, since its task exists,
--            and a taker's lock is left alone
--
-- Safe to repeat.
local removed = redis.call('ZREM', KEYS[2], ARGV[1])
if removed == 1 then
  redis.call('LPUSH', KEYS[3], ARGV[3])
  redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[4]) - 1)
  redis.call('PEXPIRE', KEYS[3], ARGV[5])
end
if ARGV[2] ~= '' and redis.call('GET', KEYS[1]) == ARGV[2] then
  redis.call('DEL', KEYS[1])
  return {removed, 1}
end
return {removed, 0}
