-- backfilled: a backfill records the tick it has just enqueued in the schedule's history and
-- counts it for the scheduler replicas' /metrics, in one step.
--
-- KEYS[1]  state    lockstep:{schedule:N}:state    hash: backfilled = backfilled ticks that no
--                                                  replica has counted yet (besides the watermark
--                                                  and the pending ticks, claim.lua)
-- KEYS[2]  history  lockstep:{schedule:N}:history  list of tick records (JSON), newest first
-- ARGV[1]  the tick's record
-- ARGV[2]  how many records the history keeps
-- ARGV[3]  ttl of state and history in milliseconds, set on a key that has none (a schedule
--          that no replica has claimed a tick of yet)
--
-- The replica that sweeps the schedule takes the count (HGET and HDEL in one MULTI) and adds it to
-- its lockstep_scheduler_ticks_total{result="backfilled"}, so the sum over replicas counts each
-- backfilled tick once.
--
-- Returns the count not yet taken, this tick included.
redis.call('LPUSH', KEYS[2], ARGV[1])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[2]) - 1)
redis.call('PEXPIRE', KEYS[2], ARGV[3])
local n = redis.call('HINCRBY', KEYS[1], 'backfilled', 1)
if redis.call('PTTL', KEYS[1]) < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return n
