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

-- handoff gives the free lock to the first live waiter of q, if any (a
-- crashed waiter's hash expired: it is dropped), and wakes it.
local function handoff(lock, fencekey, owners, q, fencettl)
  for _ = 1, 16 do
    local first = redis.call('ZPOPMIN', q)[1]
    if not first then
      return false
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
