-- release: delete each of one or more locks only if it still holds our token,
-- and wake the first live waiter of its queue. One lock per call on a Cluster
-- or a Redlock node; on one server, concurrent releases share a call.
--
-- For the i-th lock (i from 1), three keys and two values:
-- KEYS[3i-2]  lock key
-- KEYS[3i-1]  reentrancy hash (see acquire.lua; ignored when the owner is "")
-- KEYS[3i]    wait queue (see acquire.lua)
-- ARGV[2i-1]  token
-- ARGV[2i]    owner id of a reentrant lease, or ""
--
-- Returns one status per lock, in order:
--   1   released (the key is gone; the first waiter, if any, was woken)
--   2   reentrant hold count decremented; an outer hold still has the lock
--   0   the key is gone: the lease had expired
--  -1   the key holds another token: someone else has the lock (left alone)
local out = {}
for i = 0, #KEYS / 3 - 1 do
  local lock, owners, q = KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3]
  local token, owner = ARGV[2 * i + 1], ARGV[2 * i + 2]
  local cur = redis.call('GET', lock)
  local status
  if not cur then
    status = 0
  elseif cur ~= token then
    status = -1
  elseif owner ~= '' and redis.call('HINCRBY', owners, 'o:' .. owner, -1) > 0 then
    status = 2
  else
    if owner ~= '' then
      redis.call('DEL', owners)
    end
    redis.call('DEL', lock)
    status = 1
  end
  if status ~= 2 and status ~= -1 and redis.call('EXISTS', q) == 1 then
    -- Wake the first live waiter (a crashed one's keep-alive key expired).
    for _ = 1, 16 do
      local first = redis.call('ZRANGE', q, 0, 0)[1]
      if not first then
        break
      end
      local alive = redis.call('PTTL', q .. ':' .. first)
      if alive > 0 then
        local wake = q .. ':' .. first .. ':wake'
        redis.call('RPUSH', wake, 1)
        redis.call('PEXPIRE', wake, alive)
        break
      end
      redis.call('ZREM', q, first)
    end
  end
  out[#out + 1] = status
end
return out
