-- lib: the function register.lua and replicas.lua share (whether a live replica declares a file
-- schedule). It is not a script of its own: scripts.go prepends it to each of them, so both prune
-- the registry by the same rule.

-- live_declares reports whether one of the replicas in live declares the file schedule name: its
-- declared set, prefix .. id, holds the name.
local function live_declares(prefix, live, name)
  for _, id in ipairs(live) do
    if redis.call('SISMEMBER', prefix .. id, name) == 1 then
      return true
    end
  end
  return false
end

