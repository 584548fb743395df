-- claim: take the leader locks of ticks of one or more schedules, all due together. Replicas
-- batch the claims of ticks due in the same second into one call per Cluster slot (per node
-- outside a Cluster), so a second with 10,000 due ticks costs one round trip, not 10,000.
--
-- For the i-th tick (i = 1..n), with k = 3 * (i - 1):
-- KEYS[k+1]  tick lock   lockstep:{schedule:N}:tick:<T>  owner token, PX lease
-- KEYS[k+2]  pending     lockstep:{schedule:N}:pending   zset of ticks claimed and not yet done (member = score = T)
-- KEYS[k+3]  state       lockstep:{schedule:N}:state     hash: tick = watermark (highest tick claimed or skipped),
--                                                        leader = replica that claimed it
-- ARGV[1]  lease in milliseconds (tick_lock_ttl)
-- ARGV[2]  ttl of pending and state in milliseconds, refreshed on every claim
-- ARGV[3]  replica id, recorded as the leader of a fresh claim
-- ARGV[4]  how far T may lie ahead of this server's clock, in milliseconds (max_clock_skew + margin)
-- ARGV[3+2i]  T, the i-th tick's scheduled time in Unix seconds
-- ARGV[4+2i]  token of the i-th attempt (replica id + sequence number)
--
-- Returns one reply per tick, in order:
--   {1, prev_tick, prev_leader}  claimed afresh: T was ahead of the watermark, which moved from prev_tick
--                                ("" when there was none) to T; the caller enqueues
--   {2}                          taken: T was pending and its lease was gone (the leader died or stalled
--                                past tick_lock_ttl), or this token held it already; the caller enqueues
--   {3, pttl}                    held: another attempt's lease on T is live for pttl more milliseconds
--   {0}                          done: T is at or behind the watermark and not pending, so it was enqueued
--                                or skipped on purpose; never claimed again (ticks do not go backwards)
--   {4, server_ms}               early: T is further ahead of the server's clock than ARGV[4]; the
--                                caller's clock is wrong and it must not move the watermark
local now_ms
local function claim(lock, pending, state, ts, token)
  local t = tonumber(ts)
  if redis.call('ZSCORE', pending, ts) then
    local holder = redis.call('GET', lock)
    if holder and holder ~= token then
      return {3, redis.call('PTTL', lock)}
    end
    redis.call('SET', lock, token, 'PX', ARGV[1])
    return {2}
  end
  local w = redis.call('HGET', state, 'tick')
  if w and t <= tonumber(w) then
    return {0}
  end
  if not now_ms then
    local now = redis.call('TIME')
    now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  end
  if t * 1000 > now_ms + tonumber(ARGV[4]) then
    return {4, now_ms}
  end
  local leader = redis.call('HGET', state, 'leader')
  redis.call('SET', lock, token, 'PX', ARGV[1])
  redis.call('ZADD', pending, t, ts)
  redis.call('PEXPIRE', pending, ARGV[2])
  redis.call('HSET', state, 'tick', ts, 'leader', ARGV[3])
  redis.call('PEXPIRE', state, ARGV[2])
  return {1, w or '', leader or ''}
end
local out = {}
for i = 1, #KEYS / 3 do
  local k = 3 * (i - 1)
  out[i] = claim(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], ARGV[3 + 2 * i], ARGV[4 + 2 * i])
end
return out
