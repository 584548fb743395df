-- leave: a waiter that stops waiting (its context ended, its max wait passed)
-- leaves the queue. A hand-off that reached it meanwhile is returned, for the
-- caller to release (which hands the lock on to the next waiter).
--
-- KEYS[1]  wait queue (see acquire.lua)
-- ARGV[1]  waiter id
-- ARGV[2]  the marker a waiter whose context ended pushes to its own wake
--          list to end its BLPOP (wait.go); a hand-off may follow it there
--
-- Returns the hand-off "fence|at|token" the waiter got, or false (nil).
local q, w = KEYS[1], ARGV[1]
redis.call('ZREM', q, w)
redis.call('DEL', q .. ':' .. w)
local wake = q .. ':' .. w .. ':wake'
local granted = false
for _, v in ipairs(redis.call('LRANGE', wake, 0, -1)) do
  if v ~= ARGV[2] then
    granted = v
  end
end
redis.call('DEL', wake)
return granted
