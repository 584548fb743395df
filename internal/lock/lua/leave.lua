-- leave: a waiter that stops waiting (its context ended, its max wait passed)
-- leaves the queue, and when the lock is free the next live waiter is woken,
-- so that it is not left waiting for a release that already happened.
--
-- KEYS[1]  lock key
-- KEYS[2]  wait queue (see acquire.lua)
-- ARGV[1]  waiter id
--
-- Returns 1 when the waiter was in the queue, 0 when it was not.
local q, w = KEYS[2], ARGV[1]
local was = redis.call('ZREM', q, w)
redis.call('DEL', q .. ':' .. w, q .. ':' .. w .. ':wake')
if redis.call('EXISTS', KEYS[1]) == 0 then
  for _ = 1, 16 do
    local first = redis.call('ZRANGE', q, 0, 0)[1]
    if not first then
      break
    end
    local alive = redis.call('PTTL', q .. ':' .. first)
    if alive > 0 then
      local wake = q .. ':' .. first .. ':wake'
      redis.call('RPUSH', wake, 1)
      redis.call('PEXPIRE', wake, alive)
      break
    end
    redis.call('ZREM', q, first)
  end
end
return was
