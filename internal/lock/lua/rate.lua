-- rate: one admission under a rate limit per key, by GCRA (the generic cell
-- rate algorithm) on the server's clock (rate.go).
--
-- The key holds the theoretical arrival time (TAT): when the key would be
-- back to a full burst. An admission at now moves it to max(TAT, now) + T;
-- it is allowed when that, less the burst's B emission intervals, is not
-- after now. So over any window w at most w/T + B are admitted.
--
-- Reserve (a task that can come back later): an admission over the rate
-- takes the task's turn instead of asking it to come back and try: counted
-- now, kept in the turn's key; the task asking again on its turn, up to late
-- after it, is admitted without asking the limit again, so it is dequeued at
-- most twice.
--
-- WaitAllow (a caller that waits for its turn where it is): an admission
-- over the rate takes the next turn the same way, counted now, and returns
-- the wait until it, which the caller waits out: callers are admitted in the
-- order their calls ran here, with one call each.
--
-- One or more admissions per call, in order, all at one server time: on one
-- server, concurrent admissions share a call (batch.go). For the i-th, four
-- values and one key (two for a reserve), after those of the ones before:
-- KEYS     the rate key, prefix{K}:rate: "<TAT> <T> <B>", the TAT in Unix
--          microseconds and the limit it was counted under (T and B, as in
--          ARGV), so that a reader (rate.go's Rates) can tell the burst left
-- KEYS     (reserve only) the task's turn, prefix{K}:rate:task:<task>: Unix µs
-- ARGV     the emission interval T = Per/N, microseconds (>= 1)
-- ARGV     the burst B (>= 1)
-- ARGV     (reserve) late: how long after its turn a task coming back is
--          still admitted on it, µs; later, its turn is gone (it was counted
--          and not used) and it asks afresh; 0 otherwise
-- ARGV     "allow", "wait" (WaitAllow) or "reserve"
--
-- Returns {wait, at, now} per admission (for one, that reply alone), in
-- microseconds:
--   wait 0  admitted and counted (the TAT moved; the key expires when its
--           TAT passes, since from then on it says what no key says); at is
--           the admission's time on the limit's schedule: now, or the turn
--           the task came back on
--   wait>0  not admitted: "allow" writes nothing, and an admission that much
--           later would be allowed; "reserve" took the task's turn at
--           (now + wait), counted now; "wait" took the caller's
--   now     the server's time of the decision (TIME)
-- (time and rate: lua/lib.lua, prepended by scripts.go; take.lua decides a
-- task's rate with its lock through the same function)
local replies, k = {}, 1
for i = 1, #ARGV, 4 do
  local mode, turnkey = ARGV[i + 3], nil
  if mode == 'reserve' then
    turnkey = KEYS[k + 1]
  end
  replies[#replies + 1] = rate(KEYS[k], turnkey, tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), mode ~= 'allow')
  k = k + (turnkey and 2 or 1)
end
if #replies == 1 then
  return replies[1]
end
return replies
