-- replicas: a scheduler replica's heartbeat; returns the live replicas, among which each schedule
-- has a first claimer (rendezvous hashing).
--
-- KEYS[1]  replicas  lockstep:{schedules}:replicas  zset: replica id -> last heartbeat (this server's ms)
-- ARGV[1]  replica id
-- ARGV[2]  expiry in milliseconds: a replica without a heartbeat for this long is gone
-- ARGV[3]  "1" heartbeat, "0" leave (a clean stop)
--
-- Returns the ids of the live replicas, sorted.
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
if ARGV[3] == '1' then
  redis.call('ZADD', KEYS[1], now_ms, ARGV[1])
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 10)
return redis.call('ZRANGE', KEYS[1], 0, -1)
