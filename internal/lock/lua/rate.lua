-- rate: one admission under a rate limit per key, by GCRA (the generic cell
-- rate algorithm) on the server's clock (rate.go).
--
-- The key holds the theoretical arrival time (TAT): when the key would be
-- back to a full burst. An admission at now moves it to max(TAT, now) + T;
-- it is allowed when that, less the burst's B emission intervals, is not
-- after now. So over any window w at most w/T + B are admitted.
--
-- With KEYS[2] (Reserve: a task that can come back later), an admission
-- over the rate takes the task's turn instead of asking it to come back and
-- try: counted now, kept in KEYS[2]; the task asking again on its turn, up
-- to late after it, is admitted without asking the limit again, so it is
-- dequeued at most twice.
--
-- With ARGV[3] "wait" and no KEYS[2] (WaitAllow: a caller that waits for
-- its turn where it is), an admission over the rate takes the next turn the
-- same way, counted now, and returns the wait until it, which the caller
-- waits out: callers are admitted in the order their calls ran here, with
-- one call each.
--
-- KEYS[1]  the rate key, prefix{K}:rate: "<TAT> <T> <B>", the TAT in Unix
--          microseconds and the limit it was counted under (T and B, as in
--          ARGV), so that a reader (rate.go's Rates) can tell the burst left
-- KEYS[2]  (Reserve only) the task's turn, prefix{K}:rate:task:<task>: Unix µs
-- ARGV[1]  the emission interval T = Per/N, microseconds (>= 1)
-- ARGV[2]  the burst B (>= 1)
-- ARGV[3]  (Reserve only) late: how long after its turn a task coming back
--          is still admitted on it, µs; later, its turn is gone (it was
--          counted and not used) and it asks afresh; (WaitAllow) "wait"
--
-- Returns {wait, at, now}, in microseconds:
--   wait 0  admitted and counted (the TAT moved; the key expires when its
--           TAT passes, since from then on it says what no key says); at is
--           the admission's time on the limit's schedule: now, or the turn
--           the task came back on
--   wait>0  not admitted: without KEYS[2] nothing is written and an
--           admission that much later would be allowed; with it, the task's
--           turn is at (now + wait), counted now; with "wait", the caller's
--   now     the server's time of the decision (TIME)
-- (time and rate: lua/lib.lua, prepended by scripts.go; take.lua decides a
-- task's rate with its lock through the same function)
local late = 0
if KEYS[2] then
  late = tonumber(ARGV[3])
end
return rate(KEYS[1], KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]), late, KEYS[2] ~= nil or ARGV[3] == 'wait')
