-- acquire: take each of one or more locks if it is free and nobody waits ahead
-- of the caller, or enter it again for the same owner. One lock per call on a
-- Cluster or a Redlock node; on one server, concurrent acquires of different
-- locks share a call (see batch.go).
--
-- For the i-th lock (i from 1), five keys and six values:
-- KEYS[5i-4]  lock key            lockstep:{R}
-- KEYS[5i-3]  fencing counter     lockstep:{R}:fence
-- KEYS[5i-2]  reentrancy hash     lockstep:{R}:owners  ("t" -> token, "o:"..owner -> hold count)
-- KEYS[5i-1]  wait queue          lockstep:{R}:queue   (see below)
-- KEYS[5i]    fence floor         lockstep:fences:{<tag of R's slot>} (lib.lua)
-- ARGV[6i-5]  token (random, 128 bits, hex, then "|" and the holder; see holder.go)
-- ARGV[6i-4]  lock ttl in milliseconds
-- ARGV[6i-3]  fencing counter ttl in milliseconds
-- ARGV[6i-2]  owner id for a reentrant acquire, or ""
-- ARGV[6i-1]  waiter id W of an Acquire that waits, or "" (TryAcquire)
-- ARGV[6i]    the caller's limit n: 1 for a lock, n > 1 for n permits (lib.lua)
--
-- Returns one reply per lock, in order (for one lock, that reply alone):
--   fence              acquired afresh: fence (> 0) is the new fencing token
--   {token, fence}     re-entered: the holder's token and fence; hold count + 1
--   0                  busy (TryAcquire): held, or free for an earlier waiter
--   {0, now}           busy (waiter W): queued; now is the server's TIME in µs
--   "fence|at|token"   (waiter W) a release handed the lock to W's earlier
--                      attempt, taken with token, at the server's time at (µs)
-- and, for a resource with permits (a limit, lib.lua), when the permit is k > 0:
--   {fence, k, "p"}    acquired permit k afresh
--   {token, fence, k}  re-entered permit k
--   "fence|at:k|token" (waiter W) permit k was handed to W
-- A lock (n = 1) on a resource that never had a limit runs the lock's own
-- path; with a limit, the caller takes the lowest free permit below the
-- resource's limit when fewer than that many are held and nobody waits
-- ahead, re-enters a permit its owner holds, or else waits in the one queue.
--
-- The queue: the zset lockstep:{R}:queue holds waiter ids by arrival (server
-- µs); each live waiter W keeps the hash lockstep:{R}:queue:W (its latest
-- token, ttl and owner) alive for its ttl, refreshed by every attempt, and is
-- woken through the list lockstep:{R}:queue:W:wake. While the queue has live
-- waiters the lock is free only for the first: a release (release.lua), or
-- an attempt that finds the lock free, hands it to that waiter directly, with
-- the one hand-off both scripts share (lua/lib.lua). Parked tasks wait in the
-- same queue (take.lua); a task at its head is granted the lock.
--
-- The fence: lib.lua's nextfence.
-- (time, nextfence, own and handoff: lua/lib.lua, prepended by scripts.go)

-- lockone is a lock's acquire; queued tells whether the queue exists.
local function lockone(lock, fencekey, owners, q, token, ttl, fencettl, owner, waiter, queued)
  local reply = 0
  local granted = waiter ~= '' and redis.call('LPOP', q .. ':' .. waiter .. ':wake')
  if granted then
    reply = granted
  elseif not queued then
    if redis.call('SET', lock, token, 'NX', 'PX', ttl) then
      own(owners, token, ttl, owner)
      reply = nextfence(fencekey, fencettl)
    end
  elseif redis.call('EXISTS', lock) == 0 then
    -- Free with waiters queued: the first live one's, perhaps the caller's
    -- (then this very attempt hands it over).
    handoff(lock, fencekey, owners, q, fencettl, ttl, '')
    if waiter ~= '' then
      granted = redis.call('LPOP', q .. ':' .. waiter .. ':wake')
      if granted then
        reply = granted
      end
    end
  end
  if reply == 0 and owner ~= '' then
    local cur = redis.call('GET', lock)
    if cur and redis.call('HGET', owners, 't') == cur
        and redis.call('HEXISTS', owners, 'o:' .. owner) == 1 then
      redis.call('HINCRBY', owners, 'o:' .. owner, 1)
      reply = {cur, tonumber(redis.call('GET', fencekey))}
    end
  end
  return reply
end

-- permitone is lockone for a resource with permits (lib.lua); queued tells
-- whether the queue exists.
local function permitone(lock, fencekey, owners, q, token, ttl, fencettl, owner, waiter, limit, queued)
  local n, h = declare(lock, limit, fencettl, true)
  local granted = waiter ~= '' and redis.call('LPOP', q .. ':' .. waiter .. ':wake')
  if granted then
    return granted
  end
  if owner ~= '' then
    for k = 0, h - 1 do
      local pl, pf, po = permit(lock, fencekey, owners, k)
      local cur = redis.call('GET', pl)
      if cur and redis.call('HGET', po, 't') == cur
          and redis.call('HEXISTS', po, 'o:' .. owner) == 1 then
        redis.call('HINCRBY', po, 'o:' .. owner, 1)
        local fence = tonumber(redis.call('GET', pf))
        if k == 0 then
          return {cur, fence}
        end
        return {cur, fence, k}
      end
    end
  end
  -- Nobody waits and no limit was lowered (h = n): permit 0 is the lowest
  -- free one if it is free, and fewer than n are held then.
  if not queued and h == n and redis.call('SET', lock, token, 'NX', 'PX', ttl) then
    own(owners, token, ttl, owner)
    return nextfence(fencekey, fencettl)
  end
  local count, free = holders(lock, n, h)
  if count < n and free then
    if not queued then
      local pl, pf, po = permit(lock, fencekey, owners, free)
      redis.call('SET', pl, token, 'PX', ttl)
      own(po, token, ttl, owner)
      local fence = nextfence(pf, fencettl)
      if free == 0 then
        return fence
      end
      keeplimit(lock .. ':limit', fencettl)
      return {fence, free, 'p'}
    end
    -- Free permits with waiters queued: theirs, in order, perhaps the caller's.
    serve(lock, fencekey, owners, q, fencettl, ttl, '', n, h, nil, true)
    if waiter ~= '' then
      granted = redis.call('LPOP', q .. ':' .. waiter .. ':wake')
      if granted then
        return granted
      end
    end
  end
  return 0
end

local out = {}
for i = 0, #KEYS / 5 - 1 do
  local lock, fencekey, owners, q = KEYS[5 * i + 1], KEYS[5 * i + 2], KEYS[5 * i + 3], KEYS[5 * i + 4]
  floorkey = KEYS[5 * i + 5]
  local token, ttl, fencettl, owner, waiter, limit =
    ARGV[6 * i + 1], ARGV[6 * i + 2], ARGV[6 * i + 3], ARGV[6 * i + 4], ARGV[6 * i + 5], tonumber(ARGV[6 * i + 6])
  local reply
  if limit > 1 then
    reply = permitone(lock, fencekey, owners, q, token, ttl, fencettl, owner, waiter, limit, redis.call('EXISTS', q) == 1)
  else
    -- One call tells a free lock without waiters or a limit, the common case.
    local others = redis.call('EXISTS', q, lock .. ':limit')
    if others == 0 or redis.call('EXISTS', lock .. ':limit') == 0 then
      reply = lockone(lock, fencekey, owners, q, token, ttl, fencettl, owner, waiter, others > 0)
    else
      reply = permitone(lock, fencekey, owners, q, token, ttl, fencettl, owner, waiter, limit, others > 1)
    end
  end
  if reply == 0 and waiter ~= '' then
    redis.call('ZADD', q, 'NX', string.format('%.0f', time()), waiter)
    local w = q .. ':' .. waiter
    redis.call('HSET', w, 'token', token, 'ttl', ttl, 'owner', owner)
    redis.call('PEXPIRE', w, ttl)
    if redis.call('PTTL', q) < tonumber(ttl) then
      redis.call('PEXPIRE', q, ttl)
    end
    reply = {0, time()}
  end
  out[#out + 1] = reply
end
if #out == 1 then
  return out[1]
end
return out
