-- acquire: take the lock if it is free, or enter it again for the same owner.
--
-- KEYS[1]  lock key            lockstep:{R}
-- KEYS[2]  fencing counter     lockstep:{R}:fence
-- KEYS[3]  reentrancy hash     lockstep:{R}:owners  (owner id -> hold count)
-- ARGV[1]  token (random, 128 bits, hex)
-- ARGV[2]  lock ttl in milliseconds
-- ARGV[3]  fencing counter ttl in milliseconds (refreshed on every acquire)
-- ARGV[4]  owner id for a reentrant acquire, or "" for a plain one
--
-- Returns
--   {1, token, fence}  acquired afresh: fence is the new fencing token
--   {2, token, fence}  re-entered: the holder's token and fence; hold count + 1
--   {0}                held by someone else
--
-- A counter created afresh (first use, or after it expired) starts at the
-- server's TIME in microseconds, so fences never go backwards.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local fence = redis.call('INCR', KEYS[2])
  if fence == 1 then
    local t = redis.call('TIME')
    local start = t[1] .. string.format('%06d', tonumber(t[2]))
    redis.call('SET', KEYS[2], start)
    fence = tonumber(start)
  end
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  -- a previous holder's hash may outlive its lock by a moment: never inherit it
  redis.call('DEL', KEYS[3])
  if ARGV[4] ~= '' then
    redis.call('HSET', KEYS[3], ARGV[4], 1)
    redis.call('PEXPIRE', KEYS[3], ARGV[2])
  end
  return {1, ARGV[1], fence}
end
if ARGV[4] ~= '' and redis.call('HEXISTS', KEYS[3], ARGV[4]) == 1 then
  redis.call('HINCRBY', KEYS[3], ARGV[4], 1)
  return {2, redis.call('GET', KEYS[1]), tonumber(redis.call('GET', KEYS[2]))}
end
return {0}
