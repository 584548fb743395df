-- claim: take the leader lock of one tick of one schedule.
--
-- KEYS[1]  tick lock   lockstep:{schedule:N}:tick:<T>  owner token, PX lease
-- KEYS[2]  pending     lockstep:{schedule:N}:pending   zset of ticks claimed and not yet done (member = score = T)
-- KEYS[3]  state       lockstep:{schedule:N}:state     hash: tick = watermark (highest tick claimed or skipped),
--                                                      leader = replica that claimed it
-- ARGV[1]  T, the tick's scheduled time in Unix seconds
-- ARGV[2]  token of this attempt (replica id + sequence number)
-- ARGV[3]  lease in milliseconds (tick_lock_ttl)
-- ARGV[4]  ttl of pending and state in milliseconds, refreshed on every claim
-- ARGV[5]  replica id, recorded as the leader of a fresh claim
-- ARGV[6]  how far T may lie ahead of this server's clock, in milliseconds (max_clock_skew + margin)
--
-- Returns
--   {1, prev_tick, prev_leader}  claimed afresh: T was ahead of the watermark, which moved from prev_tick
--                                ("" when there was none) to T; the caller enqueues
--   {2}                          taken: T was pending and its lease was gone (the leader died or stalled
--                                past tick_lock_ttl), or this token held it already; the caller enqueues
--   {3, pttl}                    held: another attempt's lease on T is live for pttl more milliseconds
--   {0}                          done: T is at or behind the watermark and not pending, so it was enqueued
--                                or skipped on purpose; never claimed again (ticks do not go backwards)
--   {4, server_ms}               early: T is further ahead of the server's clock than ARGV[6]; the
--                                caller's clock is wrong and it must not move the watermark
local t = tonumber(ARGV[1])
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  local holder = redis.call('GET', KEYS[1])
  if holder and holder ~= ARGV[2] then
    return {3, redis.call('PTTL', KEYS[1])}
  end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return {2}
end
local w = redis.call('HGET', KEYS[3], 'tick')
if w and t <= tonumber(w) then
  return {0}
end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
if t * 1000 > now_ms + tonumber(ARGV[6]) then
  return {4, now_ms}
end
local leader = redis.call('HGET', KEYS[3], 'leader')
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('ZADD', KEYS[2], t, ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
redis.call('HSET', KEYS[3], 'tick', ARGV[1], 'leader', ARGV[5])
redis.call('PEXPIRE', KEYS[3], ARGV[4])
return {1, w or '', leader or ''}
