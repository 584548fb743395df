-- renew_batch: renew many leases in one call (single Redis node only: the keys
-- of different locks live in different Cluster slots).
--
-- KEYS     for each lease: its lock key and its fencing counter, followed by
--          its reentrancy hash when the lease is reentrant, then by its
--          resource's limit hash when the lease is a permit k > 0 (lib.lua),
--          then by its progress key when it reports progress
-- ARGV     for each lease, four values: token, ttl in milliseconds, flags
--          ("1": reentrant, its hash is the next key; "p": a permit, its
--          limit hash follows; "1p" both; "" a plain lock; any of them
--          followed by "g:<ms>" for a holder that reports progress, ms
--          since its last: the progress key gets "<Unix ms of it> <token>"
--          with the lock's ttl), and the counter's ttl in milliseconds (ttl
--          + fence ttl: the counter outlives the lock; the limit hash gets
--          it too)
--
-- Returns  one status per lease, in order, with the values of renew.lua:
--          1 renewed, 0 expired, -1 held by another token
local out = {}
local k = 1
local nowms
for i = 1, #ARGV, 4 do
  local key = KEYS[k]
  local flags = ARGV[i + 2]
  local reentrant, limited, age = false, false, nil
  if flags ~= '' then -- a plain lock, the common case, has no flag to read
    reentrant = string.sub(flags, 1, 1) == '1'
    limited = string.find(flags, 'p', 1, true) ~= nil
    age = string.match(flags, 'g:(%d+)$')
  end
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
    if limited then
      local lk = KEYS[k + 2]
      if reentrant then
        lk = KEYS[k + 3]
      end
      if redis.call('PTTL', lk) < tonumber(ARGV[i + 3]) then
        redis.call('PEXPIRE', lk, ARGV[i + 3])
      end
    end
    if age then
      if not nowms then
        local t = redis.call('TIME')
        nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      end
      local pk = KEYS[k + 2 + (reentrant and 1 or 0) + (limited and 1 or 0)]
      redis.call('SET', pk, string.format('%.0f', nowms - tonumber(age)) .. ' ' .. ARGV[i], 'PX', ARGV[i + 1])
    end
    status = 1
  end
  k = k + 2
  if reentrant then
    k = k + 1
  end
  if limited then
    k = k + 1
  end
  if age then
    k = k + 1
  end
  out[#out + 1] = status
end
return out
