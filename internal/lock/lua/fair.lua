-- fair: a fair share of a scope's workers across its tenants (fair.go),
-- by start-time fair queuing (stride scheduling on a virtual clock).
--
-- Every task of the scope gets a tag when it is first seen: the later of
-- the scope's virtual time v and its tenant's finish f; its tenant's finish
-- then moves on by the tenant's stride (S / weight). Tasks wait in a zset by
-- tag and are started smallest tag first, the virtual time moving to the tag
-- of each start. So a tenant of weight w gets w / (sum of the weights of the
-- tenants with tasks waiting) of the starts, whatever order the tasks were
-- seen in; within a tenant, tags grow with arrival, so arrival order holds.
-- A tenant that had nothing waiting comes back at v: no credit is saved up
-- while idle, and its state goes with its last waiting task.
--
-- A task is tagged in the order the caller sees the tasks: the ones its
-- queue's workers took last (asynq's active list, newest few) and then the
-- next pending ones, which is asynq's own enqueue order; a task started and
-- not yet ended (KEYS[4]) is not tagged again.
--
-- KEYS[1]  state hash, prefix{fair:<queue>:<type>}:fair: v (the virtual
--          time), and per tenant t: f:<t> its finish, b:<t> its tasks
--          waiting, s:<t> its stride
-- KEYS[2]  waiting tasks, zset task id -> tag, ...:fair:queue
-- KEYS[3]  their tenants, hash task id -> tenant, ...:fair:tasks
-- KEYS[4]  started tasks, zset task id -> the server's time (ms) of the
--          start, ...:fair:started: on their way to a worker or running,
--          until 5 s after their run ends (ARGV[3]); one whose worker died
--          goes after ARGV[1]
-- KEYS[5]  started tasks not yet delivered, zset task id -> start (ms),
--          ...:fair:onway: a start counts as on its way for 10 s at most
-- ARGV[1]  the keys' life after this call, ms (they outlive the parked
--          tasks they order)
-- ARGV[2]  free: the caller's free worker slots (one more when the asking
--          task waits: its slot frees); as many waiting tasks are started
--          as that exceeds the starts on their way to a worker, so that
--          starts do not pile up behind tasks not yet seen; a run's end
--          (ARGV[3]) starts at least one, for the slot it frees
-- ARGV[3]  a task whose run ended ("" for none)
-- ARGV[4]  the task asking to run ("" for none)
-- ARGV[5]  "1": it runs now whatever its turn (it cannot wait: no retries
--          left, a schedule's run), marked started so that no one tags it
-- ARGV[6..] tasks seen in the queue, in arrival order (the asking one
--          among them or first): id, tenant, stride for each; one seen
--          before keeps its tag
--
-- Returns {run, n, started (n ids)..., park...}:
--   run      1 the asking task starts now (it was started before, or its
--            tag is the smallest); 0 it waits (its tag stays); -1 no task
--            asked
--   started  the tasks started for free slots, smallest tag first: the
--            caller brings each parked one back to its queue (each runs on
--            its next delivery, run = 1)
--   park     the tasks seen that wait now: the caller parks those still
--            pending
local ttl = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now - ttl)
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now - 10000)
if ARGV[3] ~= '' then
  -- kept a few seconds more, while asynq records its result: a task still
  -- in its active list is not tagged again
  redis.call('ZADD', KEYS[4], 'XX', now - ttl + 5000, ARGV[3])
end
local v = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')

local function add(id, tenant, stride)
  if redis.call('ZSCORE', KEYS[2], id) or redis.call('ZSCORE', KEYS[4], id) then
    return
  end
  local f = tonumber(redis.call('HGET', KEYS[1], 'f:' .. tenant) or '0')
  local tag = math.max(v, f)
  redis.call('HSET', KEYS[1], 'f:' .. tenant, string.format('%.0f', tag + stride), 's:' .. tenant, stride)
  redis.call('HINCRBY', KEYS[1], 'b:' .. tenant, 1)
  redis.call('ZADD', KEYS[2], string.format('%.0f', tag), id)
  redis.call('HSET', KEYS[3], id, tenant)
end

-- start takes the waiting task of the smallest tag and marks it started.
local function start()
  local m = redis.call('ZPOPMIN', KEYS[2])
  if #m == 0 then
    return nil
  end
  local id, tag = m[1], tonumber(m[2])
  local tenant = redis.call('HGET', KEYS[3], id)
  redis.call('HDEL', KEYS[3], id)
  if tenant and redis.call('HINCRBY', KEYS[1], 'b:' .. tenant, -1) <= 0 then
    redis.call('HDEL', KEYS[1], 'b:' .. tenant, 'f:' .. tenant, 's:' .. tenant)
  end
  if tag > v then
    v = tag
    redis.call('HSET', KEYS[1], 'v', string.format('%.0f', v))
  end
  redis.call('ZADD', KEYS[4], now, id)
  redis.call('ZADD', KEYS[5], now, id)
  return id
end

local self = ARGV[4]
local run = -1
if self ~= '' and redis.call('ZSCORE', KEYS[4], self) then
  redis.call('ZREM', KEYS[5], self)
  run = 1
elseif self ~= '' and ARGV[5] == '1' then
  if redis.call('ZSCORE', KEYS[2], self) then
    -- seen and waiting: it leaves its place as it starts
    redis.call('ZREM', KEYS[2], self)
    local tenant = redis.call('HGET', KEYS[3], self)
    redis.call('HDEL', KEYS[3], self)
    if tenant and redis.call('HINCRBY', KEYS[1], 'b:' .. tenant, -1) <= 0 then
      redis.call('HDEL', KEYS[1], 'b:' .. tenant, 'f:' .. tenant, 's:' .. tenant)
    end
  end
  redis.call('ZADD', KEYS[4], now, self)
  run = 1
end
for i = 6, #ARGV, 3 do
  add(ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]))
end
if self ~= '' and run == -1 then
  if redis.call('ZRANGE', KEYS[2], 0, 0)[1] == self then
    start()
    redis.call('ZREM', KEYS[5], self) -- delivered already
    run = 1
  else
    run = 0
  end
end
local out = {run, 0}
local release = tonumber(ARGV[2])
if run == 0 then
  release = release + 1
end
release = release - redis.call('ZCARD', KEYS[5])
if ARGV[3] ~= '' and release < 1 then
  release = 1 -- a run's end starts one for the slot it frees, whatever is on its way
end
for _ = 1, release do
  local id = start()
  if not id then
    break
  end
  out[#out + 1] = id
  out[2] = out[2] + 1
end
for i = 6, #ARGV, 3 do
  if ARGV[i] ~= self and redis.call('ZSCORE', KEYS[2], ARGV[i]) then
    out[#out + 1] = ARGV[i]
  end
end
for i = 1, 5 do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end
return out
