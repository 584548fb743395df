-- rate: one admission under a rate limit per key, by GCRA (the generic cell
-- rate algorithm) on the server's clock (rate.go).
--
-- The key holds the theoretical arrival time (TAT): when the key would be
-- back to a full burst. An admission at now moves it to max(TAT, now) + T;
-- it is allowed when that, less the burst's B emission intervals, is not
-- after now. So over any window w at most w/T + B are admitted.
--
-- KEYS[1]  the rate key, prefix{K}:rate: "<TAT> <T> <B>", the TAT in Unix
--          microseconds and the limit it was counted under (T and B, as in
--          ARGV), so that a reader (rate.go's Rates) can tell the burst left
-- ARGV[1]  the emission interval T = Per/N, microseconds (>= 1)
-- ARGV[2]  the burst B (>= 1)
--
-- Returns {wait, now}, both in microseconds:
--   wait 0  admitted now and counted (the TAT moved; the key expires when
--           its TAT passes, since from then on it says what no key says)
--   wait>0  the time until an admission would be allowed; nothing written
--   now     the server's time of the decision (TIME)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tat = tonumber(string.match(redis.call('GET', KEYS[1]) or '0', '^%d+')) or 0
if tat < now then
  tat = now
end
local nextTat = tat + interval
local at = nextTat - tonumber(ARGV[2]) * interval
if at > now then
  return {at - now, now}
end
redis.call('SET', KEYS[1], string.format('%.0f %.0f %d', nextTat, interval, tonumber(ARGV[2])), 'PX', math.ceil((nextTat - now) / 1000))
return {0, now}
