-- lib: the functions acquire.lua and release.lua share (the fence, the
-- reentrancy hash, the hand-off to the first waiter), and the rate limit's
-- GCRA that rate.lua and take.lua share. It is not a script of
-- its own: scripts.go prepends it to each of them, so both run the same code.
--
-- The fence is max(counter + 1, floor + 1, the server's TIME in
-- microseconds), stored back with the counter's TTL refreshed. The counter
-- lives while its permit is held (and, after an expiry, the fence TTL
-- more); a release folds it into the floor of its Cluster slot, shared by
-- every resource of the slot (retire), so a released resource keeps no key.
-- Fences so keep increasing when the counter expired or was retired, and
-- also when a failover lost the counter's last increments, as long as the
-- new master's clock is not behind the old one's by more than the time
-- between the two acquires.
local now
local function time()
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return now
end

-- floorkey is the fence floor of the slot of the lock the script works on
-- (keys.go: floorKey); each script sets it from its KEYS before a fence.
local floorkey

local function nextfence(fencekey, fencettl)
  local fence = math.max(time(), tonumber(redis.call('GET', floorkey) or '0') + 1)
  local last = tonumber(redis.call('SET', fencekey, string.format('%.0f', fence), 'PX', fencettl, 'GET') or '0')
  if last >= fence then
    fence = last + 1
    redis.call('SET', fencekey, string.format('%.0f', fence), 'PX', fencettl)
  end
  return fence
end

-- retire folds the counter of a permit just freed (its lock key deleted)
-- into the slot's floor and deletes it: the floor keeps the largest fence
-- retired into it, and the longest ttl asked of it.
local function retire(fencekey, fencettl)
  local last = redis.call('GETDEL', fencekey)
  if not last then
    return
  end
  local keep = math.max(redis.call('PTTL', floorkey), tonumber(fencettl))
  local old = redis.call('SET', floorkey, last, 'PX', keep, 'GET')
  if old and tonumber(old) > tonumber(last) then
    redis.call('SET', floorkey, old, 'PX', keep)
  end
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
-- chaintoken is the token of a task head the caller runs itself (a chain):
-- nexttoken, the caller's token up to the task's fields ("<hex>|<ms>|<host:pid>|"),
-- completed with the task's id, escaped byte by byte as holder.go's
-- chainToken does, and an empty type: the operator's view names the task
-- that runs, not the one that handed it on.
local function chaintoken(nexttoken, member)
  local w = cjson.decode(string.sub(member, 3))
  return nexttoken .. string.gsub(w[2], '[^%w%-%._~]', function(c)
    return string.format('%%%02X', string.byte(c))
  end) .. '|'
end

-- handoff gives the free lock to the first live waiter of q, whoever it is.
-- ttl is the lock ttl of a grant to a task; nexttoken, when not "", is the
-- start of the token under which the caller runs a task head itself (a
-- chain; chaintoken).
-- k is the permit that lock is (0, or nil: the lock key itself) and base the
-- resource's lock key (see permit below); a permit k > 0 is named in the
-- hand-off ("fence|at:k|token"), the grant ("g:<member>:<fence>/k") and the
-- chain's {member, fence, k}; limited (serve's hand-offs) names the permit
-- even when it is 0 and adds the task's arrival in the queue (server µs):
-- "g:<member>:<fence>/<k>/<arrival>" and {member, fence, k, arrival}.
-- Returns false (no live waiter: the lock is left as it was), true (a
-- goroutine waiter holds it now), the member (a task was granted it), or
-- {member, fence} (a task head, for the caller to run under nexttoken).
local function handoff(lock, fencekey, owners, q, fencettl, ttl, nexttoken, k, base, limited)
  local pk = ''
  if k and k > 0 then
    pk = ':' .. k
  else
    base = lock
  end
  for _ = 1, 16 do
    local popped = redis.call('ZPOPMIN', q)
    local first = popped[1]
    if not first then
      return false
    end
    if string.sub(first, 1, 2) == 't:' then
      local fence = nextfence(fencekey, fencettl)
      if nexttoken ~= '' then
        redis.call('SET', lock, chaintoken(nexttoken, first), 'PX', ttl)
        if limited then
          return {first, fence, k, string.format('%.0f', tonumber(popped[2]))}
        elseif pk ~= '' then
          return {first, fence, k}
        end
        return {first, fence}
      end
      local g = 'g:' .. first .. ':' .. string.format('%.0f', fence)
      if limited then
        g = g .. '/' .. k .. '/' .. string.format('%.0f', tonumber(popped[2]))
      elseif pk ~= '' then
        g = g .. '/' .. k
      end
      redis.call('SET', lock, g, 'PX', ttl)
      redis.call('PUBLISH', base .. ':granted', g)
      return first
    end
    local w = redis.call('HMGET', q .. ':' .. first, 'token', 'ttl', 'owner')
    if w[1] then
      redis.call('SET', lock, w[1], 'PX', w[2])
      own(owners, w[1], w[2], w[3])
      local fence = nextfence(fencekey, fencettl)
      redis.call('DEL', q .. ':' .. first)
      local wake = q .. ':' .. first .. ':wake'
      redis.call('RPUSH', wake, string.format('%.0f|%.0f', fence, time()) .. pk .. '|' .. w[1])
      redis.call('PEXPIRE', wake, w[2])
      return true
    end
  end
  return false
end

-- Permits: a resource with a limit n > 1 has n permits, each a lock of its
-- own with its own fence and reentrancy hash. Permit 0 is the lock key itself
-- (a lock is a resource of one permit, in the very same keys); permit k > 0
-- is lock:p<k>, with fence:<k> and owners:<k>. The hash lock:limit holds the
-- resource's limit: n, the latest declarer's (every acquire and take with a
-- limit, or on a limited resource, writes its own), and h, the most permits
-- any declarer allowed while the hash lives: the permits that may be held.
-- A lowered limit makes no one lose a permit; no one gets one until fewer
-- than the new n are held. The hash lives as long as a fence counter of its
-- permits above 0: every acquire, hand-off and renewal of a permit k > 0
-- gives it the counter's ttl when it had less (a take, any permit's), and
-- a new hash gets it at once. Permit 0, the lock key, needs no hash: while
-- it alone may be held the resource is a lock to every caller, and the next
-- declarer writes the limit again.
local function permit(lock, fencekey, owners, k)
  if k == 0 then
    return lock, fencekey, owners
  end
  return lock .. ':p' .. k, fencekey .. ':' .. k, owners .. ':' .. k
end

-- unpermit returns the resource's own keys (permit 0's) from permit k's.
local function unpermit(lock, fencekey, owners, k)
  if k == 0 then
    return lock, fencekey, owners
  end
  local a, b = #(':p' .. k), #(':' .. k)
  return string.sub(lock, 1, -a - 1), string.sub(fencekey, 1, -b - 1), string.sub(owners, 1, -b - 1)
end

local function keeplimit(key, pttl)
  if redis.call('PTTL', key) < tonumber(pttl) then
    redis.call('PEXPIRE', key, pttl)
  end
end

-- limitof returns the resource's limit n and permit count h, or nil when it
-- has no limit (a lock, or a limited resource whose permits all expired).
local function limitof(base)
  local v = redis.call('HMGET', base .. ':limit', 'n', 'h')
  if not v[1] then
    return nil
  end
  return tonumber(v[1]), tonumber(v[2])
end

-- declare makes n the resource's limit; the hash lives at least pttl. With
-- lazy, a hash that was there keeps its ttl: the caller keeps it alive
-- itself when it takes a permit k > 0 (permit 0, the lock key, needs no
-- hash). It also tells whether the hash was there before.
local function declare(base, n, pttl, lazy)
  local key = base .. ':limit'
  local v = redis.call('HMGET', key, 'n', 'h')
  local h = math.max(n, tonumber(v[2] or '0'))
  if tonumber(v[1]) ~= n or tonumber(v[2]) ~= h then
    redis.call('HSET', key, 'n', n, 'h', h)
  end
  if not v[1] then
    redis.call('PEXPIRE', key, pttl)
  elseif not lazy then
    keeplimit(key, pttl)
  end
  return n, h, v[1] ~= false
end

-- held reads which of the first h permits are held: held[k + 1] is permit
-- k's value, or false. One MGET for up to 512 permits (a call's arguments
-- go on Lua's stack).
local function held(base, h)
  local out = {}
  for from = 0, h - 1, 512 do
    local names = {}
    for k = from, math.min(h, from + 512) - 1 do
      if k == 0 then
        names[#names + 1] = base
      else
        names[#names + 1] = base .. ':p' .. k
      end
    end
    local v = redis.call('MGET', unpack(names))
    for i = 1, #v do
      out[from + i] = v[i]
    end
  end
  return out
end

-- holders counts the held permits among the first h and finds the lowest
-- free one below n (nil when none); it returns what held read as well.
local function holders(base, n, h)
  local v = held(base, h)
  local count, free = 0, nil
  for k = 0, h - 1 do
    if v[k + 1] then
      count = count + 1
    elseif k < n and not free then
      free = k
    end
  end
  return count, free, v
end

-- serve hands free permits to the longest waiters of q while fewer than n
-- are held, preferring the permit just freed (prefer, or nil), each with
-- handoff. At most one task head goes to nexttoken (a chain). queued tells
-- that the caller knows q to exist (else serve looks); freed, that the
-- caller's own permit prefer is to be counted free though its key is still
-- there (a release that lets the hand-off overwrite it, or deletes it after).
-- The permits are read once: each hand-off takes the one it hands on.
-- Returns the chain's {member, fence[, k]} if there was one, else the first
-- hand-off's result, or false; and which permits are held now (v[k + 1]).
local function serve(base, fencekey, owners, q, fencettl, ttl, nexttoken, n, h, prefer, queued, freed)
  if not queued and redis.call('EXISTS', q) == 0 then
    return false, nil
  end
  local count, _, v = holders(base, n, h)
  if freed and v[prefer + 1] then
    v[prefer + 1], count = false, count - 1
  end
  local first, chain = false, nil
  while count < n do
    local free
    if prefer and prefer < n and not v[prefer + 1] then
      free = prefer
    else
      for k = 0, n - 1 do
        if not v[k + 1] then
          free = k
          break
        end
      end
    end
    prefer = nil
    if not free then
      break
    end
    local pl, pf, po = permit(base, fencekey, owners, free)
    local r = handoff(pl, pf, po, q, fencettl, ttl, nexttoken, free, base, true)
    if not r then
      break
    end
    v[free + 1], count = true, count + 1
    first = first or r
    if type(r) == 'table' then
      chain, nexttoken = r, ''
    end
  end
  if first then
    keeplimit(base .. ':limit', fencettl)
  end
  return chain or first, v
end

-- rate is one admission under a rate limit per key, by GCRA on the server's
-- clock: rate.lua's (Allow, Reserve, WaitAllow), and take.lua's for a task
-- whose rate is decided with its lock (one admission). ratekey holds
-- "<TAT> <T> <B>"; turnkey (nil: none) the turn a task took, in µs; late is
-- how long after its turn a task is still admitted on it (µs); reserve takes
-- the next turn when over the rate (counted now) instead of counting nothing.
-- Returns {wait, at, now} as rate.lua's header says.
local function rate(ratekey, turnkey, interval, burst, late, reserve)
  local t = time()
  if turnkey then
    local turn = redis.call('GET', turnkey)
    if turn then
      turn = tonumber(turn)
      if t < turn then
        return {turn - t, turn, t}
      end
      redis.call('DEL', turnkey)
      if t - turn <= late then
        return {0, turn, t}
      end
    end
  end
  local tat = tonumber(string.match(redis.call('GET', ratekey) or '0', '^%d+')) or 0
  if tat < t then
    tat = t
  end
  local nextTat = tat + interval
  local at = nextTat - burst * interval
  if at > t and not reserve then
    return {at - t, t, t}
  end
  redis.call('SET', ratekey, string.format('%.0f %.0f %d', nextTat, interval, burst), 'PX', math.ceil((nextTat - t) / 1000))
  if at <= t then
    return {0, t, t}
  end
  if turnkey then
    redis.call('SET', turnkey, string.format('%.0f', at), 'PX', math.ceil((at - t + late) / 1000) + 1000)
  end
  return {at - t, at, t}
end
