-- acquire: take the lock if it is free, or enter it again for the same owner.
--
-- KEYS[1]  lock key            lockstep:{R}
-- KEYS[2]  fencing counter     lockstep:{R}:fence
-- KEYS[3]  reentrancy hash     lockstep:{R}:owners  ("t" -> token, "o:"..owner -> hold count)
-- ARGV[1]  token (random, 128 bits, hex)
-- ARGV[2]  lock ttl in milliseconds
-- ARGV[3]  fencing counter ttl in milliseconds
-- ARGV[4]  owner id for a reentrant acquire, or "" for a plain one
--
-- Returns
--   {1, token, fence}  acquired afresh: fence is the new fencing token
--   {2, token, fence}  re-entered: the holder's token and fence; hold count + 1
--   {0}                held by someone else
--
-- A counter created afresh (first use, or after it expired) starts at the
-- server's TIME in microseconds, so fences never go backwards. Its TTL is
-- refreshed whenever less than half of it is left, which keeps a counter in
-- use alive without a write on every acquire.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local fence = redis.call('INCR', KEYS[2])
  if fence == 1 then
    local t = redis.call('TIME')
    local start = t[1] .. string.format('%06d', tonumber(t[2]))
    redis.call('SET', KEYS[2], start, 'PX', ARGV[3])
    fence = tonumber(start)
  elseif redis.call('PTTL', KEYS[2]) < tonumber(ARGV[3]) / 2 then
    redis.call('PEXPIRE', KEYS[2], ARGV[3])
  end
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
