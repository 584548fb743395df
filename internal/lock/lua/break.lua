-- break: an operator's forced unlock (`lockstep unlock --force`). Delete the
-- lock key if it still holds the token the operator saw; a holder's renewal
-- in between leaves the token as it was, another holder's does not.
--
-- KEYS[1]  lock key (or a permit's)
-- ARGV[1]  token
--
-- Returns 1 deleted, 0 the key no longer holds the token.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
