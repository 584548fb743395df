-- lib: the functions acquire.lua and release.lua share (the fence, the
-- reentrancy hash, the hand-off to the first waiter). It is not a script of
-- its own: scripts.go prepends it to each of them, so both run the same code.
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

-- The one waiter queue of a resource, lockstep:{R}:queue, a zset by arrival
-- (the server's TIME in µs), holds two kinds of waiter (see keys.go):
--   W        a goroutine waiting in Acquire: a 16-hex id whose hash
--            queue:W (token, ttl, owner) lives for its ttl while it waits,
--            woken through the list queue:W:wake
--   t:<...>  a parked task (the job server's Requeue): no hash, it lives as
--            long as its task; it is handed the lock by a job server that
--            runs it next (a chain), or else granted the lock, which holds
--            "g:<member>:<fence>" until the task takes it over (take.lua),
--            with a notice on lockstep:{R}:granted so that a job server
--            brings the task back at once.
--
-- handoff gives the free lock to the first live waiter of q, whoever it is.
-- ttl is the lock ttl of a grant to a task; nexttoken, when not "", is the
-- token under which the caller runs a task head itself (a chain).
-- Returns false (no live waiter: the lock is left as it was), true (a
-- goroutine waiter holds it now), the member (a task was granted it), or
-- {member, fence} (a task head, for the caller to run under nexttoken).
local function handoff(lock, fencekey, owners, q, fencettl, ttl, nexttoken)
  for _ = 1, 16 do
    local first = redis.call('ZPOPMIN', q)[1]
    if not first then
      return false
    end
    if string.sub(first, 1, 2) == 't:' then
      local fence = nextfence(fencekey, fencettl)
      if nexttoken ~= '' then
        redis.call('SET', lock, nexttoken, 'PX', ttl)
        return {first, fence}
      end
      local g = 'g:' .. first .. ':' .. string.format('%.0f', fence)
      redis.call('SET', lock, g, 'PX', ttl)
      redis.call('PUBLISH', lock .. ':granted', g)
      return first
    end
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
