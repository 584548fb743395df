-- release: delete each of one or more locks only if it still holds our token;
-- when Acquire calls wait for it, hand it to the first live waiter instead
-- (the same hand-off as in acquire.lua: the lock key is written once). One
-- lock per call on a Cluster or a Redlock node; on one server, concurrent
-- releases share a call.
--
-- For the i-th lock (i from 1), four keys and three values:
-- KEYS[4i-3]  lock key
-- KEYS[4i-2]  fencing counter (for a hand-off)
-- KEYS[4i-1]  reentrancy hash (see acquire.lua; ignored when the owner is "")
-- KEYS[4i]    wait queue (see acquire.lua)
-- ARGV[3i-2]  token
-- ARGV[3i-1]  owner id of a reentrant lease, or ""
-- ARGV[3i]    fencing counter ttl in milliseconds
--
-- Returns one status per lock, in order:
--   1   released (the key is gone, or handed to the first waiter)
--   2   reentrant hold count decremented; an outer hold still has the lock
--   0   the key is gone: the lease had expired (a waiter, if any, got it)
--  -1   the key holds another token: someone else has the lock (left alone)
local now
local function time()
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return now
end

local function nextfence(fencekey, fencettl)
  local fence = time()
  local last = tonumber(redis.call('SET', fencekey, string.format('%.0f', fence), 'PX', fencettl, 'GET') or '0')
  if last >= fence then
    fence = last + 1
    redis.call('SET', fencekey, string.format('%.0f', fence), 'PX', fencettl)
  end
  return fence
end

-- own binds the reentrancy hash to a fresh hold's token for owner: a previous
-- holder's hash that outlived its lock by a moment is replaced, never inherited.
local function own(owners, token, ttl, owner)
  if owner ~= '' then
    redis.call('DEL', owners)
    redis.call('HSET', owners, 't', token, 'o:' .. owner, 1)
    redis.call('PEXPIRE', owners, ttl)
  end
end

-- handoff gives the free lock to the first live waiter of q, if any (a
-- crashed waiter's hash expired: it is dropped), and wakes it.
local function handoff(lock, fencekey, owners, q, fencettl)
  for _ = 1, 16 do
    local first = redis.call('ZRANGE', q, 0, 0)[1]
    if not first then
      return false
    end
    redis.call('ZREM', q, first)
    local w = redis.call('HMGET', q .. ':' .. first, 'token', 'ttl', 'owner')
    if w[1] then
      redis.call('SET', lock, w[1], 'PX', w[2])
      own(owners, w[1], w[2], w[3])
      local fence = nextfence(fencekey, fencettl)
      redis.call('DEL', q .. ':' .. first)
      local wake = q .. ':' .. first .. ':wake'
      redis.call('RPUSH', wake, string.format('%.0f|%.0f|', fence, time()) .. w[1])
      redis.call('PEXPIRE', wake, w[2])
      return true
    end
  end
  return false
end

local out = {}
for i = 0, #KEYS / 4 - 1 do
  local lock, fencekey, owners, q = KEYS[4 * i + 1], KEYS[4 * i + 2], KEYS[4 * i + 3], KEYS[4 * i + 4]
  local token, owner, fencettl = ARGV[3 * i + 1], ARGV[3 * i + 2], ARGV[3 * i + 3]
  local cur = redis.call('GET', lock)
  local status
  if not cur then
    status = 0
  elseif cur ~= token then
    status = -1
  elseif owner ~= '' and redis.call('HINCRBY', owners, 'o:' .. owner, -1) > 0 then
    status = 2
  else
    if owner ~= '' then
      redis.call('DEL', owners)
    end
    status = 1
  end
  if status == 0 or status == 1 then
    if redis.call('EXISTS', q) == 0 or not handoff(lock, fencekey, owners, q, fencettl) then
      if status == 1 then
        redis.call('DEL', lock)
      end
    end
  end
  out[#out + 1] = status
end
return out
