-- tick: decide, under a schedule's overlap policy, whether a new tick's run may be enqueued, and
-- register it as one of the schedule's runs if so. One call per tick of a schedule with a policy.
--
-- KEYS[1]  runs   lockstep:{schedule:N}:runs   hash: task id -> "q <ms>" queued (enqueued or being
--                                              enqueued since Redis ms), "q" queued again by its
--                                              worker (to be retried), "r" running, "x <task id>"
--                                              ended: cancelled for that task's tick (kept until
--                                              the next tick, or its worker's start or finish, so
--                                              that its worker can name it)
-- KEYS[2]  state  lockstep:{schedule:N}:state  hash: p:<T> while tick T is claimed and not yet
--                                              enqueued (internal/scheduler)
-- KEYS[3]  lock   lockstep:{schedule:N}        the run lock (internal/lock): held by the worker of
--                                              the running run
-- ARGV[1]  policy: skip, buffer_one or cancel_previous
-- ARGV[2]  the new run's task id
-- ARGV[3]  ms a registered run that asynq does not know yet may still be being enqueued
-- ARGV[4]  ttl of runs in ms
-- ARGV[5+2j], ARGV[6+2j]  (j = 0, 1, ...) a task id of runs and asynq's state of it, read just
--                         before this call ("" when asynq does not know it)
--
-- A run is live while asynq holds it queued (pending, scheduled, retry, aggregating), while it is
-- active and not yet running under the run lock (its worker waits for the lock, or has just taken
-- the task), while it is running and the run lock is held, and while it is registered, not yet in
-- asynq and its tick still pending or registered less than ARGV[3] ago. Any other run has ended
-- (completed, archived, deleted, or running with the run lock gone: its worker died) and is
-- removed. A run registered since the caller read runs is live.
--
-- Returns {decision, queued, running, cancelled, holder}:
--   decision  1 the run is registered: enqueue it; 0 skip the tick (reason overlap)
--   queued, running  the live runs other than the new one
--   cancelled  cancel_previous: how many live runs were ended, each marked "x <new id>" (queued
--              ones skip themselves at start)
--   holder     cancel_previous: the run lock's token when it is held, "" otherwise; the caller
--              ends that hold through the lock (overlap.go: Tick), which hands the run lock on,
--              and the holder's watchdog cancels it with ErrLockLost, naming the new tick from
--              the mark
local runs, state, lock = KEYS[1], KEYS[2], KEYS[3]
local policy, id = ARGV[1], ARGV[2]
local grace = tonumber(ARGV[3])
if redis.call('HEXISTS', runs, id) == 1 then
  return {1, 0, 0, 0, ''} -- registered by an earlier attempt at this tick (a takeover)
end
local seen = {}
for j = 5, #ARGV - 1, 2 do
  seen[ARGV[j]] = ARGV[j + 1]
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holder = redis.call('GET', lock)
local locked = holder ~= false
local queued, running = {}, {}
local all = redis.call('HGETALL', runs)
for i = 1, #all, 2 do
  local run, v = all[i], all[i + 1]
  local as = seen[run]
  local live, isRunning = false, false
  if string.sub(v, 1, 1) == 'x' then
    live = false -- cancelled by an earlier tick
  elseif as == nil or as == 'pending' or as == 'scheduled' or as == 'retry' or as == 'aggregating' then
    live = true
  elseif as == 'active' then
    if v == 'r' then
      live, isRunning = locked, true
    else
      live = true
    end
  elseif as == '' and string.sub(v, 1, 2) == 'q ' then
    local tick = string.match(run, ':(%d+)$')
    live = (tick and redis.call('HEXISTS', state, 'p:' .. tick) == 1) or tonumber(string.sub(v, 3)) + grace > now
  end
  if not live then
    redis.call('HDEL', runs, run)
  elseif isRunning then
    running[#running + 1] = run
  else
    queued[#queued + 1] = run
  end
end
local cancelled = 0
if policy == 'skip' and #queued + #running > 0 then
  return {0, #queued, #running, 0, ''}
elseif policy == 'buffer_one' and #queued > 0 then
  return {0, #queued, #running, 0, ''}
elseif policy == 'cancel_previous' then
  for _, run in ipairs(queued) do
    redis.call('HSET', runs, run, 'x ' .. id)
  end
  for _, run in ipairs(running) do
    redis.call('HSET', runs, run, 'x ' .. id)
  end
  cancelled = #queued + #running
end
redis.call('HSET', runs, id, 'q ' .. now)
redis.call('PEXPIRE', runs, ARGV[4])
if policy == 'cancel_previous' and locked then -- held for a run that ends here (running, or taking the lock to start)
  return {1, #queued, #running, cancelled, holder}
end
return {1, #queued, #running, cancelled, ''}
