-- done: mark a claimed tick done once its task is in the queue, or drop it.
--
-- KEYS[1]  tick lock   lockstep:{schedule:N}:tick:<T>
-- KEYS[2]  pending     lockstep:{schedule:N}:pending
-- ARGV[1]  T in Unix seconds
-- ARGV[2]  token of the attempt that enqueued ("" to drop a tick without holding it)
--
-- Returns {removed, held}
--   removed  1 if T was pending (0: another replica marked or dropped it already)
--   held     1 if the token still held the tick, whose lock is then deleted; 0 if its lease had
--            passed to a taker or expired: the tick is done all the same, since its task exists,
--            and a taker's lock is left alone
--
-- Safe to repeat.
local removed = redis.call('ZREM', KEYS[2], ARGV[1])
if ARGV[2] ~= '' and redis.call('GET', KEYS[1]) == ARGV[2] then
  redis.call('DEL', KEYS[1])
  return {removed, 1}
end
return {removed, 0}
