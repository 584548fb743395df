-- pause: pause or resume a schedule, run-time or from the file.
--
-- KEYS[1]  defs     lockstep:{schedules}:defs
-- KEYS[2]  meta     lockstep:{schedules}:meta
-- KEYS[3]  version  lockstep:{schedules}:version
-- KEYS[4]  file     lockstep:{schedules}:file
-- ARGV[1]  name
-- ARGV[2]  "1" pause, "0" resume
-- ARGV[3]  pub/sub channel
-- ARGV[4]  "1" if the caller knows name as a file schedule (it read the config file)
--
-- The meta keeps when the schedule was last paused (paused_ms) and resumed (resumed_ms), server
-- ms: the ticks due between the two that the catch-up policy drops are recorded with reason
-- paused, not catch_up.
--
-- Returns {1, version} changed, {2} it was so already, {0} no such schedule.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 and redis.call('HEXISTS', KEYS[4], ARGV[1]) == 0 and ARGV[4] ~= '1' then
  return {0}
end
local m = {}
local raw = redis.call('HGET', KEYS[2], ARGV[1])
if raw then m = cjson.decode(raw) end
local want = ARGV[2] == '1'
if (m.paused == true) == want then
  return {2}
end
m.paused = want
local now = redis.call('TIME')
m.updated_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
if want then
  m.paused_ms = m.updated_ms
else
  m.resumed_ms = m.updated_ms
end
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(m))
local v = redis.call('INCR', KEYS[3])
redis.call('PUBLISH', ARGV[3], v)
return {1, v}
