-- front: a dead holder's task, brought back by a recoverer, goes first in
-- its resource's one queue. It came before every waiter there (they wait
-- for the lock it held), so it runs again as soon as the lock is free: its
-- take finds it first (take.lua), and a waiter that finds the lock free
-- first grants it (lib.lua's handoff). Its task waiter and the queue's
-- scores are those of take.lua.
--
-- KEYS[1]  waiter queue      lockstep:{R}:queue
-- ARGV[1]  the task as a waiter (keys.go)
-- ARGV[2]  ttl of the queue in milliseconds
--
-- Returns the number of waiters it went ahead of.
-- (time: lua/lib.lua, prepended by scripts.go)
local q, me = KEYS[1], ARGV[1]
local head = redis.call('ZRANGE', q, 0, 0, 'WITHSCORES')
if head[1] == me then
  return 0
end
local score = time()
if head[2] and tonumber(head[2]) <= score then
  score = tonumber(head[2]) - 1
end
local before = redis.call('ZCARD', q) - (redis.call('ZSCORE', q, me) and 1 or 0)
redis.call('ZADD', q, string.format('%.0f', score), me)
if redis.call('PTTL', q) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', q, ARGV[2])
end
return before
