-- handoff: release the lock, and when a task waits for it, grant it to the
-- longest waiting one in the same step: the lock never becomes free between
-- two holders, so no one barges in, and the next holder needs no acquire.
--
-- KEYS[1]  lock key          lockstep:{R}
-- KEYS[2]  fencing counter   lockstep:{R}:fence
-- KEYS[3]  waiters           lockstep:{R}:waiters
-- KEYS[4]  done marker of the task that just ran   lockstep:{R}:done:<queue>:<id>
-- KEYS[5]  done marker to drop (its task is now complete in asynq)
-- ARGV[1]  token of the releasing holder
-- ARGV[2]  token for the next holder, or "" to release without handing on
-- ARGV[3]  lock ttl in milliseconds
-- ARGV[4]  fencing counter ttl in milliseconds
-- ARGV[5]  outcome to mark the finished task with ("ok", "fail:..."), or ""
-- ARGV[6]  "a": mark always; "g": mark only when handing on
-- ARGV[7]  ttl of the marker in milliseconds
-- ARGV[8]  "1": drop KEYS[5]
--
-- Returns
--   {1}                  released; no one was waiting
--   {2, member, fence}   handed on to the waiter member (JSON ["queue","id"]),
--                        now holding it
--   {0}                  the key is gone: the lease had expired (nothing changed)
--   {-1}                 the key holds another token (left alone)
--
-- The marker says the finished task ran, so that a delivery of it that
-- asynq makes before it was completed there (a crash, a shutdown) does not
-- run it again (take.lua returns its outcome instead).
local cur = redis.call('GET', KEYS[1])
if not cur then
  return {0}
end
if cur ~= ARGV[1] then
  return {-1}
end
if ARGV[8] == '1' then
  redis.call('DEL', KEYS[5])
end
local head = nil
if ARGV[2] ~= '' then
  head = redis.call('ZPOPMIN', KEYS[3])[1]
end
if ARGV[5] ~= '' and (ARGV[6] == 'a' or head) then
  redis.call('SET', KEYS[4], ARGV[5], 'PX', ARGV[7])
end
if not head then
  redis.call('DEL', KEYS[1])
  return {1}
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
-- The counter was set by this holder's acquire or hand-off, so one more is
-- the next fence; only a counter that is gone (a failover lost it) needs
-- the full rule.
local fence = redis.call('INCR', KEYS[2])
if fence == 1 then
  fence = nextfence(KEYS[2], ARGV[4])
end
return {2, head, fence}
