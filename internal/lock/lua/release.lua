-- release: delete the lock only if it still holds our token.
--
-- KEYS[1]  lock key
-- KEYS[2]  reentrancy hash (see acquire.lua; ignored when ARGV[2] is "")
-- ARGV[1]  token
-- ARGV[2]  owner id of a reentrant lease, or ""
--
-- Returns
--   1   released (the key is gone)
--   2   reentrant hold count decremented; an outer hold still has the lock
--   0   the key is gone: the lease had expired
--  -1   the key holds another token: someone else has the lock (left alone)
local cur = redis.call('GET', KEYS[1])
if not cur then
  return 0
end
if cur ~= ARGV[1] then
  return -1
end
if ARGV[2] ~= '' then
  local n = redis.call('HINCRBY', KEYS[2], 'o:' .. ARGV[2], -1)
  if n > 0 then
    return 2
  end
  redis.call('DEL', KEYS[2])
end
redis.call('DEL', KEYS[1])
return 1
