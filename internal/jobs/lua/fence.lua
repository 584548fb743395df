-- fence: the fence rule of internal/lock/lua/acquire.lua, shared by the job
-- server's scripts that take a lock (take.lua, handoff.lua); it is prepended
-- to them, so it is not a script of its own.
--
-- The fence is max(counter + 1, the server's TIME in microseconds), stored
-- back with the counter's TTL refreshed.
local function next_fence(key, ttl)
  local t = redis.call('TIME')
  local fence = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local last = tonumber(redis.call('GET', key) or '0')
  if last >= fence then
    fence = last + 1
  end
  redis.call('SET', key, string.format('%.0f', fence), 'PX', ttl)
  return fence
end
