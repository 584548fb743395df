-- acquire: take the lock if it is free, or enter it again for the same owner.
--
-- KEYS[1]  lock key            lockstep:{R}
-- KEYS[2]  fencing counter     lockstep:{R}:fence
-- KEYS[3]  reentrancy hash     lockstep:{R}:owners  ("t" -> token, "o:"..owner -> hold count)
-- ARGV[1]  token (random, 128 bits, hex, then "|" and the holder; see holder.go)
-- ARGV[2]  lock ttl in milliseconds
-- ARGV[3]  fencing counter ttl in milliseconds
-- ARGV[4]  owner id for a reentrant acquire, or "" for a plain one
--
-- Returns
--   {1, token, fence}  acquired afresh: fence is the new fencing token
--   {2, token, fence}  re-entered: the holder's token and fence; hold count + 1
--   {0}                held by someone else
--
-- The fence is max(counter + 1, the server's TIME in microseconds), stored
-- back with the counter's TTL refreshed. Fences so keep increasing when the
-- counter expired, and also when a failover lost the counter's last
-- increments, as long as the new master's clock is not behind the old one's
-- by more than the time between the two acquires.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local t = redis.call('TIME')
  local fence = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local last = tonumber(redis.call('GET', KEYS[2]) or '0')
  if last >= fence then
    fence = last + 1
  end
  redis.call('SET', KEYS[2], string.format('%.0f', fence), 'PX', ARGV[3])
  if ARGV[4] ~= '' then
    -- The hash is bound to this hold's token: a previous holder's hash that
    -- outlived its lock by a moment is replaced, never inherited.
    redis.call('DEL', KEYS[3])
    redis.call('HSET', KEYS[3], 't', ARGV[1], 'o:' .. ARGV[4], 1)
    redis.call('PEXPIRE', KEYS[3], ARGV[2])
  end
  return {1, ARGV[1], fence}
end
if ARGV[4] ~= '' then
  local token = redis.call('GET', KEYS[1])
  if token and redis.call('HGET', KEYS[3], 't') == token
      and redis.call('HEXISTS', KEYS[3], 'o:' .. ARGV[4]) == 1 then
    redis.call('HINCRBY', KEYS[3], 'o:' .. ARGV[4], 1)
    return {2, token, tonumber(redis.call('GET', KEYS[2]))}
  end
end
return {0}
