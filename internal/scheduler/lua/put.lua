-- put: add or update a run-time schedule.
--
-- KEYS[1]  defs     lockstep:{schedules}:defs     hash: name -> definition (JSON)
-- KEYS[2]  meta     lockstep:{schedules}:meta     hash: name -> {"since","paused","spec","updated_ms"} (JSON)
-- KEYS[3]  version  lockstep:{schedules}:version  counter of changes
-- KEYS[4]  file     lockstep:{schedules}:file     hash: names of the file schedules replicas run
-- ARGV[1]  name
-- ARGV[2]  definition (JSON, validated by the caller)
-- ARGV[3]  spec: the cron expression and time zone, "<cron>\n<timezone>"
-- ARGV[4]  mode: "add" (the name must be new) or "update" (it must exist)
-- ARGV[5]  pub/sub channel to publish the new version on
--
-- since (Unix seconds, this server's clock) becomes now when the schedule is new or its spec
-- changed, and is kept otherwise; no tick at or before since is due, so a changed cron never
-- replays old ticks. paused is kept.
--
-- Returns {1, version} done, or {0, reason}: "exists" (add), "missing" (update), "file" (add of a
-- file schedule's name).
local old = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[4] == 'add' then
  if old then return {0, 'exists'} end
  if redis.call('HEXISTS', KEYS[4], ARGV[1]) == 1 then return {0, 'file'} end
elseif not old then
  return {0, 'missing'}
end
local now = redis.call('TIME')
local m = {}
local raw = old and redis.call('HGET', KEYS[2], ARGV[1])
if raw then m = cjson.decode(raw) end
if m.spec ~= ARGV[3] or not m.since then
  m.since = tonumber(now[1])
  m.spec = ARGV[3]
end
if not m.paused then m.paused = false end
m.updated_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(m))
local v = redis.call('INCR', KEYS[3])
redis.call('PUBLISH', ARGV[5], v)
return {1, v}
