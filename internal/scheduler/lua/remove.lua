-- remove: delete a run-time schedule. Its watermark stays (with its TTL): a schedule added again
-- under the name never claims a tick twice.
--
-- KEYS[1]  defs     lockstep:{schedules}:defs
-- KEYS[2]  meta     lockstep:{schedules}:meta
-- KEYS[3]  version  lockstep:{schedules}:version
-- ARGV[1]  name
-- ARGV[2]  pub/sub channel
--
-- Returns {1, version} removed, {0} no such run-time schedule.
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then
  return {0}
end
redis.call('HDEL', KEYS[2], ARGV[1])
local v = redis.call('INCR', KEYS[3])
redis.call('PUBLISH', ARGV[2], v)
return {1, v}
