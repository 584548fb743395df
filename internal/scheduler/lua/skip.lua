-- skip: move a schedule's watermark forward over ticks that the catch-up policy drops.
--
-- KEYS[1]  state   lockstep:{schedule:N}:state   hash: tick = watermark, leader
-- ARGV[1]  T in Unix seconds: the last tick to drop
-- ARGV[2]  ttl of state (and history) in milliseconds
-- KEYS[2]  history   lockstep:{schedule:N}:history   list of tick records (JSON), newest first
-- ARGV[3]  how many records the history keeps
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
local rec = {t = tonumber(ARGV[1]), s = 'skipped', r = 'catch_up'}
if w then rec.from = tonumber(w) end
redis.call('LPUSH', KEYS[2], cjson.encode(rec))
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[3]) - 1)
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return {1, w or ''}
