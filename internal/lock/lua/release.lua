-- release: delete each of one or more locks only if it still holds our token;
-- when Acquire calls wait for it, hand it to the first live waiter instead
-- (the same hand-off as in acquire.lua: the lock key is written once). One
-- lock per call on a Cluster or a Redlock node; on one server, concurrent
-- releases share a call.
--
-- For the i-th lock (i from 1), five keys and six values:
-- KEYS[5i-4]  lock key (of the lease's permit: lib.lua)
-- KEYS[5i-3]  fencing counter (the permit's: retired into the floor when
--             the lock key is gone at the end, lib.lua's retire)
-- KEYS[5i-2]  reentrancy hash (see acquire.lua; ignored when the owner is ""; the permit's)
-- KEYS[5i-1]  wait queue (see acquire.lua)
-- KEYS[5i]    the fence floor of the lock's slot (lib.lua)
-- ARGV[6i-5]  token
-- ARGV[6i-4]  owner id of a reentrant lease, or "", or "!" for a forced end
--             (an operator's break, a supersede): every reentrant hold of
--             the token ends at once, and the lock goes on as on a release
-- ARGV[6i-3]  fencing counter ttl in milliseconds
-- ARGV[6i-2]  lock ttl in milliseconds (of a grant to a parked task at the head)
-- ARGV[6i-1]  the lease's permit k (0 for a lock)
-- ARGV[6i]    the limit the lease's acquire declared (1 for a lock)
--
-- On a resource with a limit (lib.lua) the permit is freed, and free permits
-- go to the longest waiters while fewer than the limit are held (serve); the
-- permit freed goes first, written once (not deleted, then set).
--
-- Returns one status per lock, in order (for one lock, that status alone):
--   1   released (the key is gone, or handed to the first waiter)
--   2   reentrant hold count decremented; an outer hold still has the lock
--   0   the key is gone: the lease had expired (a waiter, if any, got it)
--  -1   the key holds another token: someone else has the lock (left alone)
-- (time, nextfence, retire, own and handoff: lua/lib.lua, prepended by scripts.go)

local out = {}
for i = 0, #KEYS / 5 - 1 do
  local lock, fencekey, owners, q = KEYS[5 * i + 1], KEYS[5 * i + 2], KEYS[5 * i + 3], KEYS[5 * i + 4]
  floorkey = KEYS[5 * i + 5]
  local token, owner, fencettl, ttl, k, limit =
    ARGV[6 * i + 1], ARGV[6 * i + 2], ARGV[6 * i + 3], ARGV[6 * i + 4], tonumber(ARGV[6 * i + 5]), tonumber(ARGV[6 * i + 6])
  local cur = redis.call('GET', lock)
  local status
  if not cur then
    status = 0
  elseif cur ~= token then
    status = -1
  elseif owner ~= '' and owner ~= '!' and redis.call('HINCRBY', owners, 'o:' .. owner, -1) > 0 then
    status = 2
  else
    if owner ~= '' then
      redis.call('DEL', owners)
    end
    status = 1
  end
  if status == 0 or status == 1 then
    local base, bf, bo = unpermit(lock, fencekey, owners, k)
    local n, h, queued
    if k > 0 or limit > 1 then
      -- A permit: without waiters its limit does not matter.
      queued = redis.call('EXISTS', q) == 1
      if queued then
        n, h = limitof(base)
      end
    else
      -- One call tells a lock without waiters or a limit, the common case;
      -- without a limit, others > 0 is the queue.
      local others = redis.call('EXISTS', q, base .. ':limit')
      if others > 0 then
        n, h = limitof(base)
      end
      queued = others > 1 or (others == 1 and not n)
    end
    local gone = false
    if n then
      local handed = false
      if queued then
        local _, v = serve(base, bf, bo, q, fencettl, ttl, '', n, h, k, true, status == 1)
        handed = v and v[k + 1]
      end
      gone = not handed
    elseif not queued or not handoff(lock, fencekey, owners, q, fencettl, ttl, '', k, base) then
      gone = true
    end
    if gone then
      if status == 1 then
        redis.call('DEL', lock)
      end
      retire(fencekey, fencettl)
    end
  end
  out[#out + 1] = status
end
if #out == 1 then
  return out[1]
end
return out
