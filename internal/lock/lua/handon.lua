-- handon: a job's release. Release the lock and, when someone waits for it,
-- hand it to the longest waiter of the one queue in the same step (lib.lua's
-- handoff): a goroutine waiter is woken holding it; a parked task at the
-- head is handed to the caller, which runs it next under nexttoken (a
-- chain), or, without nexttoken, granted. The lock never becomes free
-- between two holders, so no one barges in.
--
-- KEYS[1]  lock key          lockstep:{R}
-- KEYS[2]  fencing counter   lockstep:{R}:fence
-- KEYS[3]  reentrancy hash   lockstep:{R}:owners
-- KEYS[4]  waiter queue      lockstep:{R}:queue
-- KEYS[5]  done marker of the task that just ran   lockstep:{R}:done:<member>
-- KEYS[6]  done marker to drop (its task is now complete in asynq)
-- ARGV[1]  token of the releasing holder
-- ARGV[2]  token for the next holder when the caller runs a task head, or ""
-- ARGV[3]  lock ttl in milliseconds
-- ARGV[4]  fencing counter ttl in milliseconds
-- ARGV[5]  outcome to mark the finished task with ("ok", "fail:..."), or ""
-- ARGV[6]  "a": mark always; "g": mark only when the caller runs the next task
-- ARGV[7]  ttl of the marker in milliseconds
-- ARGV[8]  "1": drop KEYS[6]
-- ARGV[9]  ttl in milliseconds of the finished task's marker when it is not
--          marked above, "" for none (kept for a recoverer: the task ran,
--          whatever asynq shows if this process dies before completing it)
-- ARGV[11] the lease's permit k (0 for a lock; KEYS[1..3] are the permit's)
-- ARGV[12] a done marker (of this resource) to keep alive for ARGV[7] ms:
--          the chain's delivered task, still held by asynq; "" none
-- KEYS[7]  the fence floor of the lock's slot (lib.lua): a permit left free
--          has its counter retired into it
-- KEYS[8]  (optional) the holds set of the releasing process: the hold record
--          ARGV[10] .. <task waiter> of a task handed on for the caller to run
--          is added (see take.lua)
--
-- Returns
--   {1}                  released; no one was waiting
--   {2, member, fence}   handed on to the task waiter member, which the
--                        caller now holds the lock for under ARGV[2]
--   {2, member, fence, k[, arrival]}  the same, of permit k (a limited resource:
--                        free permits go to the longest waiters while fewer
--                        than the limit are held, lib.lua's serve; arrival
--                        is when the task joined the queue, server µs)
--   {3}                  handed to a goroutine waiter, or granted to a task
--   {0}                  the key is gone: the lease had expired (nothing changed)
--   {-1}                 the key holds another token (left alone)
--
-- The marker says the finished task ran, so that a delivery of it that
-- asynq makes before it was completed there (a crash, a shutdown) does not
-- run it again (take.lua returns its outcome instead).
-- (time, nextfence, retire, own and handoff: lua/lib.lua, prepended by scripts.go)
floorkey = KEYS[7]
local cur = redis.call('GET', KEYS[1])
if not cur then
  return {0}
end
if cur ~= ARGV[1] then
  return {-1}
end
if ARGV[8] == '1' then
  redis.call('DEL', KEYS[6])
end
if ARGV[12] ~= '' then
  redis.call('PEXPIRE', ARGV[12], ARGV[7])
end
local k = tonumber(ARGV[11])
local base, bf, bo = unpermit(KEYS[1], KEYS[2], KEYS[3], k)
local others = redis.call('EXISTS', KEYS[4], base .. ':limit') -- without a limit, > 0 is the queue
local n, lh
if others > 0 then
  n, lh = limitof(base)
end
local h = false
if n then
  redis.call('DEL', KEYS[1])
  h = serve(base, bf, bo, KEYS[4], ARGV[4], ARGV[3], ARGV[2], n, lh, k)
elseif others > 0 then
  h = handoff(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[4], ARGV[3], ARGV[2], k, base)
end
if ARGV[5] ~= '' and (ARGV[6] == 'a' or type(h) == 'table') then
  redis.call('SET', KEYS[5], ARGV[5], 'PX', ARGV[7])
elseif ARGV[5] ~= '' and ARGV[9] ~= '' then
  redis.call('SET', KEYS[5], ARGV[5], 'PX', ARGV[9])
end
if KEYS[8] and type(h) == 'table' then
  redis.call('SADD', KEYS[8], ARGV[10] .. h[1])
end
-- A permit left free has its counter retired: a lock no one was handed, or
-- a limited resource's permit that serve did not hand on (it deleted it).
if not n then
  if not h then
    redis.call('DEL', KEYS[1])
    retire(KEYS[2], ARGV[4])
  end
elseif redis.call('EXISTS', KEYS[1]) == 0 then
  retire(KEYS[2], ARGV[4])
end
if not h then
  return {1}
end
if type(h) == 'table' then
  if h[4] then
    return {2, h[1], h[2], h[3], h[4]}
  elseif h[3] then
    return {2, h[1], h[2], h[3]}
  end
  return {2, h[1], h[2]}
end
return {3}
