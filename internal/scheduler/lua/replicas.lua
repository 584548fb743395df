-- replicas: a scheduler replica's heartbeat; returns the live replicas, among which each schedule
-- has a first claimer (rendezvous hashing).
--
-- KEYS[1]  replicas  lockstep:{schedules}:replicas    zset: replica id -> last heartbeat (this server's ms)
-- KEYS[2]  file      lockstep:{schedules}:file        hash: name -> definition of a file schedule
-- KEYS[3]  declared  lockstep:{schedules}:file:<id>   set: the file schedules this replica declares
-- ARGV[1]  replica id
-- ARGV[2]  expiry in milliseconds: a replica without a heartbeat for this long is gone
-- ARGV[3]  "1" heartbeat, "0" leave (a clean stop)
-- ARGV[4]  prefix of the declared sets: "lockstep:{schedules}:file:"
--
-- A replica that is gone (expired, or leaving) takes its declarations with it: the file schedules
-- that no live replica declares any more leave the registry (KEYS[2]). The declared sets live ten
-- expiries past the last heartbeat, so that those of replicas that all died are gone by the time
-- a new one registers (register.lua prunes then).
--
-- Returns {new, id...}: new is 1 when this replica was not live before this heartbeat (it starts,
-- or it was gone, its declarations with it: it registers again), then the ids of the live
-- replicas, sorted.
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local new = 0
if ARGV[3] == '1' then
  new = redis.call('ZADD', KEYS[1], now_ms, ARGV[1])
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[2]) * 10)
end
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms - tonumber(ARGV[2]))
if ARGV[3] ~= '1' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  table.insert(gone, ARGV[1])
end
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms - tonumber(ARGV[2]))
  local live = redis.call('ZRANGE', KEYS[1], 0, -1)
  for _, id in ipairs(gone) do
    local declared = ARGV[4] .. id
    for _, name in ipairs(redis.call('SMEMBERS', declared)) do
      if not live_declares(ARGV[4], live, name) then
        redis.call('HDEL', KEYS[2], name)
      end
    end
    redis.call('DEL', declared)
  end
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 10)
local out = redis.call('ZRANGE', KEYS[1], 0, -1)
table.insert(out, 1, new)
return out
