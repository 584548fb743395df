-- claim: take the leases of the ticks of one second T of one or more schedules. Replicas batch the
-- claims of ticks due in the same second into one call per Cluster slot (per node outside a
-- Cluster), so a second with 10,000 due ticks costs one round trip, not 10,000.
--
-- KEYS[1]  the claim digests of second T, P{schedules}:claimed:<T>, when ARGV[5] is "1" (outside a
--          Cluster; in a Cluster there is none, and the ticks' keys begin at KEYS[1]); below, d is 1
--          with that key and 0 without
-- For the i-th tick (i = 1..n), with k = d + 2 * (i - 1):
-- KEYS[k+1]  state    lockstep:{schedule:N}:state    hash: tick = watermark (highest tick claimed or
--                                                    skipped), leader = replica that claimed it, and
--                                                    p:<T> = "<lease end, server ms> <token>" for each
--                                                    tick T claimed and not yet done (its lease)
-- KEYS[k+2]  history  lockstep:{schedule:N}:history  list of tick records; only its TTL is set here
-- ARGV[1]  lease in milliseconds (tick_lock_ttl)
-- ARGV[2]  ttl of state and history in milliseconds, set when the watermark enters a new UTC day
--          (or is new), so at most once a day per schedule rather than at every claim
-- ARGV[3]  replica id, recorded as the leader of a fresh claim
-- ARGV[4]  how far T may lie ahead of this server's clock, in milliseconds (max_clock_skew + margin)
-- ARGV[5]  "1": the claim digests are kept, in KEYS[1]; "" in a Cluster: none
-- ARGV[6]  ttl of a claim digest in milliseconds
-- ARGV[7]  T, the ticks' scheduled time in Unix seconds
-- ARGV[8]  role: "0" a claim (a takeover, a catch-up); "1" a follower's check, the caller not
--          being the ticks' first claimer: a tick at or behind the watermark is answered done
--          without looking at its lease (the first claimer's sweep takes over an orphaned one), so
--          the check costs one read; "2" the first claimer's claim on time, counted in the digest
--          of T
-- ARGV[7+2i]  token of the i-th attempt (replica id + sequence number)
-- ARGV[8+2i]  the i-th schedule's digest: a 48-bit hash of its name, as a decimal
--
-- Claim digests: P{schedules}:claimed:<T>, hash: replica id -> the sum modulo 2^48 of the digests
-- of the schedules whose tick T it claimed first (role "2") and found at or behind the watermark
-- afterwards (any answer but early), over all its calls for T. A follower that expects the same
-- sum (the same live replicas, the same schedules) knows without a per-tick check that all those
-- ticks were claimed. Outside a Cluster only: the key shares no slot with the ticks' keys.
--
-- Returns one reply per tick, in order:
--   {1, prev_tick, prev_leader}  claimed afresh: T was ahead of the watermark, which moved from prev_tick
--                                ("" when there was none) to T; the caller enqueues
--   {2}                          taken: T was pending and its lease was over (the leader died or stalled
--                                past tick_lock_ttl), or this token held it already; the caller enqueues
--   {3, ms}                      held: another attempt's lease on T lasts ms more milliseconds
--   {0}                          done: T is at or behind the watermark and not pending, so it was enqueued
--                                or skipped on purpose; never claimed again (ticks do not go backwards).
--                                For a follower: T is at or behind the watermark.
--   {4, server_ms}               early: T is further ahead of the server's clock than ARGV[4]; the
--                                caller's clock is wrong and it must not move the watermark
--
-- Pending ticks are never ahead of the watermark: a fresh claim moves it to T.
local now_ms
local function now()
  if not now_ms then
    local t = redis.call('TIME')
    now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now_ms
end
local lease = tonumber(ARGV[1])
local function claim(state, history, ts, token, role)
  local t = tonumber(ts)
  local field = 'p:' .. ts
  local st = redis.call('HMGET', state, 'tick', 'leader', field)
  local w, leader, p = st[1], st[2], st[3]
  if w and t <= tonumber(w) then
    if not p or role == '1' then
      return {0}
    end
    local sp = string.find(p, ' ', 1, true)
    local ends = tonumber(string.sub(p, 1, sp - 1))
    if string.sub(p, sp + 1) ~= token and ends > now() then
      return {3, ends - now()}
    end
    redis.call('HSET', state, field, string.format('%.0f %s', now() + lease, token))
    return {2}
  end
  if t * 1000 > now() + tonumber(ARGV[4]) then
    return {4, now()}
  end
  redis.call('HSET', state, 'tick', ts, 'leader', ARGV[3], field, string.format('%.0f %s', now() + lease, token))
  if not w or math.floor(t / 86400) ~= math.floor(tonumber(w) / 86400) then
    redis.call('PEXPIRE', state, ARGV[2])
    redis.call('PEXPIRE', history, ARGV[2])
  end
  return {1, w or '', leader or ''}
end
local M = 281474976710656 -- 2^48: sums of two digests stay exact in Lua's doubles
local ts, role = ARGV[7], ARGV[8]
local sum, counted = 0, false
local out = {}
local d = 0
if ARGV[5] == '1' then
  d = 1
end
for i = 1, (#KEYS - d) / 2 do
  local r = claim(KEYS[d + 2 * i - 1], KEYS[d + 2 * i], ts, ARGV[7 + 2 * i], role)
  if role == '2' and r[1] ~= 4 then
    sum, counted = (sum + tonumber(ARGV[8 + 2 * i])) % M, true
  end
  out[i] = r
end
if counted and d == 1 then
  local key = KEYS[1]
  local cur = tonumber(redis.call('HGET', key, ARGV[3]) or '0')
  redis.call('HSET', key, ARGV[3], string.format('%.0f', (cur + sum) % M))
  redis.call('PEXPIRE', key, ARGV[6])
end
return out
