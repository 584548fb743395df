-- register: a scheduler replica records the file schedules it runs (so that the API and the CLI
-- can list, pause and trigger them without the config file), and the registry forgets the ones no
-- live replica declares any more.
--
-- KEYS[1]  file      lockstep:{schedules}:file        hash: name -> definition (JSON)
-- KEYS[2]  declared  lockstep:{schedules}:file:<id>   set: the names this replica declares
-- KEYS[3]  replicas  lockstep:{schedules}:replicas    zset: replica id -> last heartbeat (server ms)
-- ARGV[1]  replica id
-- ARGV[2]  ttl of KEYS[2] in milliseconds (refreshed by every heartbeat, replicas.lua)
-- ARGV[3]  prefix of the declared sets: "lockstep:{schedules}:file:"
-- ARGV[4+2j], ARGV[5+2j]  name and definition of the j-th file schedule (j = 0..)
--
-- The replica counts as live from here on (its heartbeat is written too). A name in the registry
-- that no live replica's set holds is removed: it was in the config of replicas that are gone.
--
-- Returns the number of names removed.
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZADD', KEYS[3], now_ms, ARGV[1])
redis.call('DEL', KEYS[2])
for j = 4, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[j], ARGV[j + 1])
  redis.call('SADD', KEYS[2], ARGV[j])
end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
local live = redis.call('ZRANGE', KEYS[3], 0, -1)
local removed = 0
for _, name in ipairs(redis.call('HKEYS', KEYS[1])) do
  if not live_declares(ARGV[3], live, name) then
    redis.call('HDEL', KEYS[1], name)
    removed = removed + 1
  end
end
return removed
