-- renew: extend the lock's ttl only if it still holds our token.
--
-- KEYS[1]  lock key
-- KEYS[2]  reentrancy hash (ignored when ARGV[3] is "")
-- KEYS[3]  fencing counter (its TTL renewed too: it outlives the lock)
-- ARGV[1]  token
-- ARGV[2]  new ttl in milliseconds
-- ARGV[3]  "1" when the lease is reentrant (the hash expires with the lock)
-- ARGV[4]  the fencing counter's new ttl in milliseconds (ttl + fence ttl)
-- KEYS[4]  (a permit k > 0 only) the resource's limit hash lockstep:{R}:limit,
--          which lives at least as long as the counter (lib.lua)
-- ARGV[5]  "g:<ms since the holder's last progress>" for a holder that
--          reports progress, else "": then the last key is the lock's
--          progress key, which gets "<Unix ms of it> <token>" with the ttl
--
-- Returns
--   1   renewed
--   0   the key is gone: the lease expired
--  -1   the key holds another token: the lock was taken over (left alone)
local cur = redis.call('GET', KEYS[1])
if not cur then
  return 0
end
if cur ~= ARGV[1] then
  return -1
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[3], ARGV[4])
local age = ARGV[5] and string.match(ARGV[5], '^g:(%d+)$')
local limits = #KEYS
if age then
  limits = limits - 1
  local t = redis.call('TIME')
  local nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('SET', KEYS[#KEYS], string.format('%.0f', nowms - tonumber(age)) .. ' ' .. ARGV[1], 'PX', ARGV[2])
end
if limits >= 4 and redis.call('PTTL', KEYS[4]) < tonumber(ARGV[4]) then
  redis.call('PEXPIRE', KEYS[4], ARGV[4])
end
if ARGV[3] ~= '' then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return 1
