-- renew_batch: renew many leases in one call (single Redis node only: the keys
-- of different locks live in different Cluster slots).
--
-- KEYS     for each lease: its lock key and its fencing counter, followed by
--          its reentrancy hash when the lease is reentrant
-- ARGV     for each lease, four values: token, ttl in milliseconds, "1" for a
--          reentrant lease (its hash is the next key) or "" for a plain one,
--          and the counter's ttl in milliseconds (ttl + fence ttl: the
--          counter outlives the lock)
--
-- Returns  one status per lease, in order, with the values of renew.lua:
--          1 renewed, 0 expired, -1 held by another token
local out = {}
local k = 1
for i = 1, #ARGV, 4 do
  local key = KEYS[k]
  local reentrant = ARGV[i + 2] ~= ''
  local cur = redis.call('GET', key)
  local status
  if not cur then
    status = 0
  elseif cur ~= ARGV[i] then
    status = -1
  else
    redis.call('PEXPIRE', key, ARGV[i + 1])
    redis.call('PEXPIRE', KEYS[k + 1], ARGV[i + 3])
    if reentrant then
      redis.call('PEXPIRE', KEYS[k + 2], ARGV[i + 1])
    end
    status = 1
  end
  if reentrant then
    k = k + 3
  else
    k = k + 2
  end
  out[#out + 1] = status
end
return out
