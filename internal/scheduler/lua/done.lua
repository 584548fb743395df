-- done: mark claimed ticks done once their tasks are in the queue, or drop them. Like claims, the
-- dones of ticks finished together go out as one call per Cluster slot.
--
-- For the i-th tick (i = 1..n), with k = 3 * (i - 1):
-- KEYS[k+1]  tick lock   lockstep:{schedule:N}:tick:<T>
-- KEYS[k+2]  pending     lockstep:{schedule:N}:pending
-- KEYS[k+3]  history     lockstep:{schedule:N}:history   list of tick records (JSON), newest first
-- ARGV[1]    how many records a history keeps
-- ARGV[2]    ttl of a history in milliseconds
-- ARGV[3i]   T in Unix seconds
-- ARGV[3i+1] token of the attempt that enqueued ("" to drop a tick without holding it)
-- ARGV[3i+2] the record to push to the history if T was pending
--
-- Returns one {removed, held} per tick, in order:
--   removed  1 if T was pending (0: another replica marked or dropped it already)
--   held     1 if the token still held the tick, whose lock is then deleted; 0 if its lease had
--            passed to a taker or expired: the tick is done all the same, since its task exists,
--            and a taker's lock is left alone
--
-- Safe to repeat.
local function done(lock, pending, history, t, token, record)
  local removed = redis.call('ZREM', pending, t)
  if removed == 1 then
    redis.call('LPUSH', history, record)
    redis.call('LTRIM', history, 0, tonumber(ARGV[1]) - 1)
    redis.call('PEXPIRE', history, ARGV[2])
  end
  if token ~= '' and redis.call('GET', lock) == token then
    redis.call('DEL', lock)
    return {removed, 1}
  end
  return {removed, 0}
end
local out = {}
for i = 1, #KEYS / 3 do
  local k = 3 * (i - 1)
  out[i] = done(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], ARGV[3 * i], ARGV[3 * i + 1], ARGV[3 * i + 2])
end
return out
