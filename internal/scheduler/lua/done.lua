-- done: mark claimed ticks of one second T done once their tasks are in the queue, or drop them.
-- Like claims, the dones of ticks finished together go out as one call per Cluster slot.
--
-- For the i-th tick (i = 1..n), with k = 2 * (i - 1):
-- KEYS[k+1]  state    lockstep:{schedule:N}:state    hash: p:<T> = "<lease end ms> <token>" while T is pending
-- KEYS[k+2]  history  lockstep:{schedule:N}:history  list of tick records (JSON), newest first
-- ARGV[1]    how many records a history keeps: it is trimmed to that many when it holds twice as
--            many, so that a push rarely costs a trim too
-- ARGV[2]    ttl of a history in milliseconds, set when it is created or trimmed (claim.lua sets
--            it daily)
-- ARGV[3]    T in Unix seconds
-- ARGV[3+i]  the i-th record to push to its history if T was pending
--
-- Returns one removed per tick, in order: 1 if T was pending and is no more (its lease ends with
-- it, whoever held it: the tick is done, since its task exists), 0 if another replica marked or
-- dropped it already. Safe to repeat.
local keep = tonumber(ARGV[1])
local field = 'p:' .. ARGV[3]
local out = {}
for i = 1, #KEYS / 2 do
  local state, history = KEYS[2 * i - 1], KEYS[2 * i]
  local removed = redis.call('HDEL', state, field)
  if removed == 1 then
    local n = redis.call('LPUSH', history, ARGV[3 + i])
    if n > 2 * keep then
      redis.call('LTRIM', history, 0, keep - 1)
    end
    if n == 1 or n > 2 * keep then
      redis.call('PEXPIRE', history, ARGV[2])
    end
  end
  out[i] = removed
end
return out
