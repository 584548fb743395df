-- take: a parked task (the job server's Requeue policy) asks for its lock.
-- Take it if it is free and no one waits ahead; take it over if it was
-- granted to this task; or else join the resource's one waiter queue (the
-- queue Acquire waits in, lua/lib.lua), in arrival order, keeping the place
-- it has. One call either way.
--
-- KEYS[1]  lock key          lockstep:{R}
-- KEYS[2]  fencing counter   lockstep:{R}:fence
-- KEYS[3]  reentrancy hash   lockstep:{R}:owners (for a hand-off to a goroutine waiter)
-- KEYS[4]  waiter queue      lockstep:{R}:queue
-- KEYS[5]  done marker       lockstep:{R}:done:<member>
-- ARGV[1]  token (random, 128 bits, hex, then the holder; see holder.go)
-- ARGV[2]  lock ttl in milliseconds
-- ARGV[3]  fencing counter ttl in milliseconds
-- ARGV[4]  the task as a waiter: "t:" .. JSON ["<queue>", "<task id>"] (keys.go)
-- ARGV[5]  ttl of the queue in milliseconds, set when a task joins
-- ARGV[6]  when busy: "q" join the queue, "n" do not wait
-- KEYS[6]  fence floor       lockstep:fences:{<tag of R's slot>} (lib.lua)
-- KEYS[7]  (optional; KEYS[9] with a rate) the holds set of the taking process (lockstep:holds:<process>):
--          the task's hold record, ARGV[7], replaces its bare record ("\n" ..
--          ARGV[4], no resource: written as asynq handed the task over) when it
--          gets the lock, and the bare record is added when it joins the queue to
--          go back to asynq, so that a recoverer finds the task if the process
--          dies (see tasks.go)
-- ARGV[8]  the task's limit n: 1 for a lock, n > 1 for n permits (lib.lua);
--          with a limit, or on a limited resource, the replies {1..} and
--          {2..} end with the permit k taken and the task's arrival in the
--          queue ({s, token, fence, k, arrival}: server µs, "" for a task
--          that did not wait), and the
--          lock's pttl of a busy reply is the shortest of the held permits'
--
-- With a rate limit (ARGV[9]): one admission decides the task's rate and its
-- lock (docs/design.md §3a). The rate is asked only when the lock (or a
-- permit) would be given to this task now, in this call, so a task that
-- waits for its lock spends no turn of its rate, and one over its rate takes
-- no lock:
-- KEYS[7]  the rate key      prefix{K}:rate (lib.lua's rate; in R's slot on a Cluster)
-- KEYS[8]  the task's turn   prefix{K}:rate:task:<queue>:<id>
-- ARGV[9]  the emission interval T = Per/N, µs; ARGV[10] the burst B;
-- ARGV[11] late: how long after its turn the task is still admitted on it, µs
-- Admitted (counted now, or on the turn it took before), the replies {1..}
-- and {2..} carry the admission's time (server µs) at index 6: a lock's are
-- {s, token, fence, 0, "", at}. Over the rate, the task takes its turn
-- (counted now, rate.lua's Reserve) and the lock or the permit is granted
-- to it until then, as a hand-off grants ("g:<member>:<fence>"), for the
-- wait, the lateness allowed and the ttl: no one takes it meanwhile (the
-- task was first), and the task, brought back on its turn, takes it over on
-- that turn. A task granted the lock by a hand-off asks its rate when it
-- takes the grant over, the same way.
--   {5, wait, at}       over the rate: its turn is at (server µs), wait µs
--                       from now; the lock or a permit is granted to it
--
-- Returns
--   {1, token, fence}   acquired afresh (same fence rule as acquire.lua)
--   {2, token, fence}   granted to this task (lib.lua's handoff, grant.lua):
--                       taken over, the lock holds this call's token now
--   {0, pttl, since, ahead}  busy, waiting: the lock's remaining ttl (ms);
--                       the arrival (server µs) if the task joined now, else
--                       ""; the number of waiters before this one
--   {4, pttl, since, ahead, head}  free, but head waited longer (its holder
--                       died): granted to the task head, and this task waits
--                       as for {0} (a goroutine head is woken by the script)
--   {3, outcome}        this task already ran under a hand-off (its done
--                       marker): "ok", "fail:<msg>" or "skip:<msg>"; it leaves
--                       the queue and a grant to it goes on (passon). A failure's
--                       marker is consumed (asynq retries the task, and that
--                       retry runs it anew); an "ok" marker is kept until it
--                       expires: the delivery that reads it may itself be lost
--                       (its worker killed before asynq completed the task),
--                       and the next delivery must read it again.
-- (time, nextfence, retire, own, handoff and rate: lua/lib.lua, prepended by scripts.go)
local lock, fencekey, owners, q = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
floorkey = KEYS[6]
local token, ttl, fencettl, me = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local rated = ARGV[9] ~= nil
local holdskey = KEYS[7]
if rated then
  holdskey = KEYS[9]
end

local function held()
  if holdskey then
    redis.call('SADD', holdskey, ARGV[7])
    redis.call('SREM', holdskey, '\n' .. me)
  end
end

-- admit asks the task's rate, if it has one, now that the lock (or a
-- permit) would be given to it: true when admitted (admittedat says when,
-- on the limit's schedule), false when over the rate (overrate is the
-- reply of lib.lua's rate: the task's turn taken).
local admittedat, overrate = '', nil
local function admit()
  if not rated then
    return true
  end
  local r = rate(KEYS[7], KEYS[8], tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11]), true)
  if r[1] == 0 then
    admittedat = string.format('%.0f', r[2])
    return true
  end
  overrate = r
  return false
end

-- keep holds permit pl (fence counter pf) for this task until its rate
-- turn, and the lateness and ttl after it: granted to it (g, or the grant
-- it has already), out of the queue.
local function keep(pl, pf, g)
  local px = math.ceil((overrate[1] + tonumber(ARGV[11])) / 1000) + tonumber(ttl)
  if g then
    redis.call('SET', pl, g, 'PX', px)
  else
    redis.call('PEXPIRE', pl, px)
  end
  if redis.call('PTTL', pf) < px then
    redis.call('PEXPIRE', pf, px)
  end
  redis.call('ZREM', q, me)
  return {5, overrate[1], overrate[2]}
end

local function join()
  if ARGV[6] == 'n' then
    return '', 0
  end
  local since = string.format('%.0f', time())
  if redis.call('ZADD', q, 'NX', since, me) == 0 then
    since = ''
  end
  if redis.call('PTTL', q) < tonumber(ARGV[5]) then
    redis.call('PEXPIRE', q, ARGV[5])
  end
  if holdskey then
    redis.call('SADD', holdskey, '\n' .. me)
  end
  return since, redis.call('ZRANK', q, me)
end

-- takepermit: the task takes permit k (free, or granted to it).
local function takepermit(k, status, fresh)
  local pl, pf = permit(lock, fencekey, owners, k)
  redis.call('SET', pl, token, 'PX', ttl)
  local fence
  if fresh then
    fence = nextfence(pf, fencettl)
  else
    fence = tonumber(redis.call('GET', pf))
  end
  local arrival = redis.call('ZSCORE', q, me)
  if arrival then
    arrival = string.format('%.0f', tonumber(arrival))
    redis.call('ZREM', q, me)
  end
  held()
  if rated then
    return {status, token, fence, k, arrival or '', admittedat}
  end
  return {status, token, fence, k, arrival or ''}
end

-- grantself grants the free permit k to this task while it waits for its
-- rate turn (keep), as serve's hand-off would: with a fresh fence, and on a
-- limited resource its arrival (in the queue, or now).
local function grantself(k, limited)
  local pl, pf = permit(lock, fencekey, owners, k)
  local g = 'g:' .. me .. ':' .. string.format('%.0f', nextfence(pf, fencettl))
  if limited then
    local arrival = tonumber(redis.call('ZSCORE', q, me)) or time()
    g = g .. '/' .. k .. '/' .. string.format('%.0f', arrival)
    keeplimit(lock .. ':limit', fencettl)
  end
  return keep(pl, pf, g)
end

-- keepgrant keeps permit k, granted to this task, for it until its rate turn.
local function keepgrant(k)
  local pl, pf = permit(lock, fencekey, owners, k)
  return keep(pl, pf, nil)
end

local function minpttl(h)
  local best = -2
  for k = 0, h - 1 do
    local p = redis.call('PTTL', (permit(lock, fencekey, owners, k)))
    if p >= 0 and (best < 0 or p < best) then
      best = p
    end
  end
  return best
end

local function grantedto(h)
  local granted = 'g:' .. me .. ':'
  for k = 0, h - 1 do
    local cur = redis.call('GET', (permit(lock, fencekey, owners, k)))
    if cur and string.sub(cur, 1, #granted) == granted then
      return k, string.match(cur, '/%d+/(%d+)$')
    end
  end
  return nil
end

-- passon: a task that will not run leaves the queue, and a lock or permit
-- granted to it goes on to the next waiter (or is freed), as a release
-- would: a recovered task put first in the queue (front.lua) that had run
-- already must not keep its resource for a TTL.
local function passon()
  redis.call('ZREM', q, me)
  local n, h = limitof(lock)
  local k = 0
  if n then
    k = grantedto(h)
    if not k then
      return
    end
  elseif string.sub(redis.call('GET', lock) or '', 1, #me + 3) ~= 'g:' .. me .. ':' then
    return
  end
  local pl, pf, po = permit(lock, fencekey, owners, k)
  redis.call('DEL', pl)
  if n then
    serve(lock, fencekey, owners, q, fencettl, ttl, '', n, h, k)
  else
    handoff(pl, pf, po, q, fencettl, ttl, '')
  end
  if redis.call('EXISTS', pl) == 0 then
    retire(pf, fencettl)
  end
end

local done = redis.call('GET', KEYS[5])
if done then
  if done ~= 'ok' then
    redis.call('DEL', KEYS[5])
  end
  passon()
  return {3, done}
end

local limit = tonumber(ARGV[8])
if limit > 1 or redis.call('EXISTS', lock .. ':limit') == 1 then
  local n, h = declare(lock, limit, fencettl)
  local k, arrival = grantedto(h)
  if k then
    if not admit() then
      return keepgrant(k)
    end
    local r = takepermit(k, 2, false)
    r[5] = arrival or r[5]
    return r
  end
  local count, free = holders(lock, n, h)
  if count < n and free then
    local head = redis.call('ZRANGE', q, 0, 0)[1]
    if not head or head == me then
      if not admit() then
        return grantself(free, true)
      end
      return takepermit(free, 1, true)
    end
    -- Others wait longer (their holders died, so no one handed on): the
    -- free permits are theirs, in order, perhaps this task's too.
    local r = serve(lock, fencekey, owners, q, fencettl, ttl, '', n, h, nil)
    k = grantedto(h)
    if k then
      if not admit() then
        return keepgrant(k)
      end
      return takepermit(k, 1, false)
    end
    count, free = holders(lock, n, h)
    head = redis.call('ZRANGE', q, 0, 0)[1]
    if count < n and free and (not head or head == me) then
      if not admit() then
        return grantself(free, true)
      end
      return takepermit(free, 1, true)
    end
    local since, ahead = join()
    if type(r) == 'string' then
      return {4, minpttl(h), since, ahead, r}
    end
    return {0, minpttl(h), since, ahead}
  end
  local since, ahead = join()
  return {0, minpttl(h), since, ahead}
end

local cur = redis.call('GET', lock)
if cur then
  local granted = 'g:' .. me .. ':'
  if string.sub(cur, 1, #granted) == granted then
    if not admit() then
      return keepgrant(0)
    end
    redis.call('SET', lock, token, 'PX', ttl)
    held()
    return {2, token, tonumber(redis.call('GET', fencekey)), 0, '', admittedat}
  end
  local since, ahead = join()
  return {0, redis.call('PTTL', lock), since, ahead}
end
-- Free: taken at once when no one waits ahead of this task. If others wait
-- longer (their holder died, so no one handed on), it goes to the first
-- live one of them instead, and this task waits its turn.
local head = redis.call('ZRANGE', q, 0, 0)[1]
if head and head ~= me then
  local h = handoff(lock, fencekey, owners, q, fencettl, ttl, '')
  if h == me then
    -- Every waiter ahead was gone: the grant is this task's own.
    if not admit() then
      return keepgrant(0)
    end
    redis.call('SET', lock, token, 'PX', ttl)
    held()
    return {1, token, tonumber(redis.call('GET', fencekey)), 0, '', admittedat}
  elseif h then
    local since, ahead = join()
    if h == true then
      return {0, redis.call('PTTL', lock), since, ahead}
    end
    return {4, redis.call('PTTL', lock), since, ahead, h}
  end
end
if not admit() then
  return grantself(0, false)
end
redis.call('SET', lock, token, 'PX', ttl)
local fence = nextfence(fencekey, fencettl)
if head then
  redis.call('ZREM', q, me)
end
held()
if rated then
  return {1, token, fence, 0, '', admittedat}
end
return {1, token, fence}
