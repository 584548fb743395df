-- reserve: a task's admission under a rate limit per key, rate.lua's GCRA
-- on the server's clock, that takes the task's turn when it is over the
-- limit instead of asking it to come back and try (rate.go's Reserve): a
-- task delayed once is admitted when it comes back on its turn, so it is
-- dequeued at most twice.
--
-- KEYS[1]  the rate key, prefix{K}:rate: "<TAT> <T> <B>" (rate.lua)
-- KEYS[2]  the task's turn, prefix{K}:rate:task:<task>: Unix µs
-- ARGV[1]  the emission interval T, µs (>= 1)
-- ARGV[2]  the burst B (>= 1)
-- ARGV[3]  late: how long after its turn a task coming back is still
--          admitted on it, µs; later, its turn is gone (it was counted and
--          not used) and it asks afresh
--
-- Returns {wait, at, now}, µs:
--   wait 0   admitted, counted; at is the admission's time on the limit's
--            schedule: now, or the turn it came back on
--   wait>0   its turn is at (now + wait): counted now, kept in KEYS[2]
--            until late after it; come back then
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local late = tonumber(ARGV[3])
local turn = redis.call('GET', KEYS[2])
if turn then
  turn = tonumber(turn)
  if now < turn then
    return {turn - now, turn, now}
  end
  redis.call('DEL', KEYS[2])
  if now - turn <= late then
    return {0, turn, now}
  end
end
local tat = tonumber(string.match(redis.call('GET', KEYS[1]) or '0', '^%d+')) or 0
if tat < now then
  tat = now
end
local nextTat = tat + interval
local at = nextTat - burst * interval
redis.call('SET', KEYS[1], string.format('%.0f %.0f %d', nextTat, interval, burst), 'PX', math.ceil((nextTat - now) / 1000))
if at <= now then
  return {0, now, now}
end
redis.call('SET', KEYS[2], string.format('%.0f', at), 'PX', math.ceil((at - now + late) / 1000) + 1000)
return {at - now, at, now}
