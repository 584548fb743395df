-- skip: move a schedule's watermark forward over ticks that the catch-up policy drops, and record
-- them in its history, one record per reason.
--
-- KEYS[1]  state     lockstep:{schedule:N}:state     hash: tick = watermark, leader
-- KEYS[2]  history   lockstep:{schedule:N}:history   list of tick records (JSON), newest first
-- ARGV[1]  T in Unix seconds: the last tick to drop
-- ARGV[2]  ttl of state (and history) in milliseconds
-- ARGV[3]  how many records the history keeps
-- ARGV[4+2j], ARGV[5+2j]  (j = 0, 1, ...) the last tick of the j-th run of dropped ticks that
--          share a reason, and that reason (catch_up: missed in an outage; paused: due while
--          the schedule was paused), oldest first; the last is T. Without any: one run, catch_up.
--
-- Each run at or behind the watermark is dropped already; the others are recorded skipped with
-- their reason, the ticks after from (the watermark, or the run before) up to t.
--
-- Returns
--   {1, prev_tick}  the watermark moved from prev_tick to T: the caller counts the ticks in
--                   (prev_tick, T] as missed
--   {0, tick}       the watermark was at tick >= T already (another replica claimed or skipped them)
--
-- The watermark only moves forward, so a skip never undoes a claim.
local w = redis.call('HGET', KEYS[1], 'tick')
if w and tonumber(w) >= tonumber(ARGV[1]) then
  return {0, w}
end
redis.call('HSET', KEYS[1], 'tick', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local runs = {}
for j = 4, #ARGV - 1, 2 do
  runs[#runs + 1] = {tonumber(ARGV[j]), ARGV[j + 1]}
end
if #runs == 0 then
  runs[1] = {tonumber(ARGV[1]), 'catch_up'}
end
local from = w and tonumber(w)
for _, run in ipairs(runs) do
  if not from or run[1] > from then
    local rec = {t = run[1], s = 'skipped', r = run[2]}
    if from then rec.from = from end
    redis.call('LPUSH', KEYS[2], cjson.encode(rec))
    from = run[1]
  end
end
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[3]) - 1)
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return {1, w or ''}
