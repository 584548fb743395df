-- leave: a waiter that stops waiting (its context ended, its max wait passed)
-- leaves the queue. A hand-off that reached it meanwhile is returned, for the
-- caller to release (which hands the lock on to the next waiter).
--
-- KEYS[1]  wait queue (see acquire.lua)
-- ARGV[1]  waiter id
--
-- Returns the hand-off "fence|at|token" the waiter got, or false (nil).
local q, w = KEYS[1], ARGV[1]
redis.call('ZREM', q, w)
redis.call('DEL', q .. ':' .. w)
local granted = redis.call('LPOP', q .. ':' .. w .. ':wake')
redis.call('DEL', q .. ':' .. w .. ':wake')
return granted
