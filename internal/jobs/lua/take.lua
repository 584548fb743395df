-- take: a task asks for its lock. Take it if it is free; take it over if a
-- hand-off granted it to this task; or else join the resource's waiters, in
-- arrival order, so that the holder's release hands the lock on to the
-- longest waiting task (handoff.lua). One call either way.
--
-- KEYS[1]  lock key          lockstep:{R}
-- KEYS[2]  fencing counter   lockstep:{R}:fence
-- KEYS[3]  waiters           lockstep:{R}:waiters  (zset: task -> first contention, Unix ms with µs)
-- KEYS[4]  grant             lockstep:{R}:grant    (the waiter the held lock was granted to)
-- KEYS[5]  done marker       lockstep:{R}:done:<queue>:<task id>
-- KEYS[6]  in-worker waiters lockstep:{R}:inworker  (set of waiters that wait in their worker)
-- ARGV[1]  token (random, 128 bits, hex)
-- ARGV[2]  lock ttl in milliseconds
-- ARGV[3]  fencing counter ttl in milliseconds
-- ARGV[4]  the task as a waiter: JSON ["<queue>", "<task id>"]
-- ARGV[5]  ttl of the waiters zset in milliseconds, refreshed on every wait
-- ARGV[6]  when busy: "q" wait parked in asynq's retry set, "w" wait in the
--          worker (woken by the grant's notice), "n" do not wait
--
-- Returns
--   {1, token, fence}         acquired afresh
--   {2, token, fence}         granted to this task by a hand-off: the holder's token
--   {0, ahead, pttl, since}   busy: waiting, with `ahead` tasks before it; the
--                             lock's remaining ttl (ms); first contention (string)
--   {3, outcome}              this task already ran under a hand-off (done
--                             marker, consumed): "ok", "fail:<msg>" or "skip:<msg>"
local done = redis.call('GET', KEYS[5])
if done then
  redis.call('DEL', KEYS[5])
  return {3, done}
end
local cur = redis.call('GET', KEYS[1])
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  local fence = next_fence(KEYS[2], ARGV[3])
  if redis.call('ZREM', KEYS[3], ARGV[4]) == 1 then
    redis.call('SREM', KEYS[6], ARGV[4])
  end
  return {1, ARGV[1], fence}
end
if redis.call('GET', KEYS[4]) == ARGV[4] then
  redis.call('DEL', KEYS[4])
  redis.call('SREM', KEYS[6], ARGV[4])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {2, cur, tonumber(redis.call('GET', KEYS[2]))}
end
if ARGV[6] == 'n' then
  return {0, 0, redis.call('PTTL', KEYS[1]), '0'}
end
if ARGV[6] == 'w' then
  redis.call('SADD', KEYS[6], ARGV[4])
  redis.call('PEXPIRE', KEYS[6], ARGV[5])
end
local t = redis.call('TIME')
redis.call('ZADD', KEYS[3], 'NX', string.format('%d.%03d', t[1] * 1000 + math.floor(t[2] / 1000), t[2] % 1000), ARGV[4])
redis.call('PEXPIRE', KEYS[3], ARGV[5])
return {0, redis.call('ZRANK', KEYS[3], ARGV[4]), redis.call('PTTL', KEYS[1]), redis.call('ZSCORE', KEYS[3], ARGV[4])}
