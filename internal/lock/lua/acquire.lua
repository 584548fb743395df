-- acquire: take each of one or more locks if it is free and nobody waits ahead
-- of the caller, or enter it again for the same owner. One lock per call on a
-- Cluster or a Redlock node; on one server, concurrent acquires of different
-- locks share a call (see batch.go).
--
-- For the i-th lock (i from 1), four keys and five values:
-- KEYS[4i-3]  lock key            lockstep:{R}
-- KEYS[4i-2]  fencing counter     lockstep:{R}:fence
-- KEYS[4i-1]  reentrancy hash     lockstep:{R}:owners  ("t" -> token, "o:"..owner -> hold count)
-- KEYS[4i]    wait queue          lockstep:{R}:queue   (zset: waiter id -> arrival, server µs;
--                                 each live waiter W keeps lockstep:{R}:queue:W alive, and is
--                                 woken by a push to the list lockstep:{R}:queue:W:wake)
-- ARGV[5i-4]  token (random, 128 bits, hex, then "|" and the holder; see holder.go)
-- ARGV[5i-3]  lock ttl in milliseconds
-- ARGV[5i-2]  fencing counter ttl in milliseconds
-- ARGV[5i-1]  owner id for a reentrant acquire, or ""
-- ARGV[5i]    waiter id of an Acquire that waits, or "" (TryAcquire)
--
-- Returns one reply per lock, in order:
--   fence            acquired afresh: fence (> 0) is the new fencing token
--   {token, fence}   re-entered: the holder's token and fence; hold count + 1
--   0                busy: held by someone else, or free with an earlier waiter
--                    queued (a waiter's id is then in the queue, kept alive for
--                    its ttl)
--
-- The fence is max(counter + 1, the server's TIME in microseconds), stored
-- back with the counter's TTL refreshed. Fences so keep increasing when the
-- counter expired, and also when a failover lost the counter's last
-- increments, as long as the new master's clock is not behind the old one's
-- by more than the time between the two acquires.
local now
local function time()
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return now
end

-- head returns the first live waiter of queue q, dropping the ones whose
-- keep-alive key expired (crashed waiters), or nil.
local function head(q)
  for _ = 1, 16 do
    local first = redis.call('ZRANGE', q, 0, 0)[1]
    if not first then
      return nil
    end
    if redis.call('EXISTS', q .. ':' .. first) == 1 then
      return first
    end
    redis.call('ZREM', q, first)
  end
  return nil
end

local out = {}
for i = 0, #KEYS / 4 - 1 do
  local lock, fencekey, owners, q = KEYS[4 * i + 1], KEYS[4 * i + 2], KEYS[4 * i + 3], KEYS[4 * i + 4]
  local token, ttl, fencettl, owner, waiter =
    ARGV[5 * i + 1], ARGV[5 * i + 2], ARGV[5 * i + 3], ARGV[5 * i + 4], ARGV[5 * i + 5]
  local reply = 0
  local first = nil
  if redis.call('EXISTS', q) == 1 then
    first = head(q)
  end
  local got = false
  if first == nil or first == waiter then
    got = redis.call('SET', lock, token, 'NX', 'PX', ttl)
  end
  if got then
    local fence = time()
    local last = tonumber(redis.call('SET', fencekey, string.format('%.0f', fence), 'PX', fencettl, 'GET') or '0')
    if last >= fence then
      fence = last + 1
      redis.call('SET', fencekey, string.format('%.0f', fence), 'PX', fencettl)
    end
    if first ~= nil then
      redis.call('ZREM', q, waiter)
      redis.call('DEL', q .. ':' .. waiter, q .. ':' .. waiter .. ':wake')
    end
    if owner ~= '' then
      -- The hash is bound to this hold's token: a previous holder's hash that
      -- outlived its lock by a moment is replaced, never inherited.
      redis.call('DEL', owners)
      redis.call('HSET', owners, 't', token, 'o:' .. owner, 1)
      redis.call('PEXPIRE', owners, ttl)
    end
    reply = fence
  elseif owner ~= '' then
    local cur = redis.call('GET', lock)
    if cur and redis.call('HGET', owners, 't') == cur
        and redis.call('HEXISTS', owners, 'o:' .. owner) == 1 then
      redis.call('HINCRBY', owners, 'o:' .. owner, 1)
      reply = {cur, tonumber(redis.call('GET', fencekey))}
    end
  end
  if reply == 0 and waiter ~= '' then
    redis.call('ZADD', q, 'NX', string.format('%.0f', time()), waiter)
    redis.call('SET', q .. ':' .. waiter, 1, 'PX', ttl)
    if redis.call('PTTL', q) < tonumber(ttl) then
      redis.call('PEXPIRE', q, ttl)
    end
    if first ~= nil and first ~= waiter and redis.call('EXISTS', lock) == 0 then
      -- The lock is free but an earlier waiter has not taken it: wake it, in
      -- case its wake-up was lost.
      local wake = q .. ':' .. first .. ':wake'
      if redis.call('EXISTS', wake) == 0 then
        redis.call('RPUSH', wake, 1)
        redis.call('PEXPIRE', wake, ttl)
      end
    end
  end
  out[#out + 1] = reply
end
return out
