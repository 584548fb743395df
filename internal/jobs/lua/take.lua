-- take: a task asks for its lock. Take it if it is free; take it over if it
-- was granted to this task; or else join the resource's waiters, in arrival
-- order, so that the holder's release hands the lock on to the longest
-- waiting task (handoff.lua). One call either way.
--
-- KEYS[1]  lock key          lockstep:{R}
-- KEYS[2]  fencing counter   lockstep:{R}:fence
-- KEYS[3]  waiters           lockstep:{R}:waiters  (zset: task -> first contention, Unix ms with µs)
-- KEYS[4]  done marker       lockstep:{R}:done:<queue>:<task id>
-- ARGV[1]  token (random, 128 bits, hex)
-- ARGV[2]  lock ttl in milliseconds
-- ARGV[3]  fencing counter ttl in milliseconds
-- ARGV[4]  the task as a waiter: JSON ["<queue>", "<task id>"]
-- ARGV[5]  ttl of the waiters zset in milliseconds, set when a task joins
-- ARGV[6]  when busy: "q" join the waiters, "n" do not wait
--
-- Returns
--   {1, token, fence}   acquired afresh (same fence rule as internal/lock)
--   {2, token, fence}   granted to this task (grant.lua): the lock's value is its token now
--   {0, pttl, since, ahead}  busy, waiting: the lock's remaining ttl (ms);
--                       the first contention if it began now, else ""; the
--                       number of waiters before this one
--   {4, pttl, since, ahead, head}  free, but head waited longer (its holder
--                       died): granted to head, and this task waits as for {0}
--   {3, outcome}        this task already ran under a hand-off (its done
--                       marker): "ok", "fail:<msg>" or "skip:<msg>". A failure's
--                       marker is consumed (asynq retries the task, and that
--                       retry runs it anew); an "ok" marker is kept until it
--                       expires: the delivery that reads it may itself be lost
--                       (its worker killed before asynq completed the task),
--                       and the next delivery must read it again.
-- join puts this task among the waiters (keeping its place if it has one)
-- unless it does not wait; it returns its first contention if that is now
-- (else "") and the number of waiters before it.
local function join()
  if ARGV[6] == 'n' then
    return '', 0
  end
  local t = redis.call('TIME')
  local since = string.format('%d.%03d', t[1] * 1000 + math.floor(t[2] / 1000), t[2] % 1000)
  if redis.call('ZADD', KEYS[3], 'NX', since, ARGV[4]) == 1 then
    redis.call('PEXPIRE', KEYS[3], ARGV[5])
  else
    since = ''
  end
  return since, redis.call('ZRANK', KEYS[3], ARGV[4])
end

local done = redis.call('GET', KEYS[4])
if done then
  if done ~= 'ok' then
    redis.call('DEL', KEYS[4])
  end
  return {3, done}
end
-- Free: taken at once (the common case, in the fewest commands). If others
-- wait longer (their holder died, so no one handed on), it goes to the
-- first of them instead, and this task waits its turn.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if head and head ~= ARGV[4] then
    redis.call('ZREM', KEYS[3], head)
    redis.call('SET', KEYS[1], 'g:' .. head .. ':' .. ARGV[1], 'PX', ARGV[2])
    nextfence(KEYS[2], ARGV[3])
    local since, ahead = join()
    return {4, redis.call('PTTL', KEYS[1]), since, ahead, head}
  end
  local fence = nextfence(KEYS[2], ARGV[3])
  if head then
    redis.call('ZREM', KEYS[3], ARGV[4])
  end
  return {1, ARGV[1], fence}
end
local cur = redis.call('GET', KEYS[1])
local granted = 'g:' .. ARGV[4] .. ':'
if cur and string.sub(cur, 1, #granted) == granted then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {2, cur, tonumber(redis.call('GET', KEYS[2]))}
end
local since, ahead = join()
return {0, redis.call('PTTL', KEYS[1]), since, ahead}
