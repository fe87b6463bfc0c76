-- Renew: compare-and-PEXPIRE. KEYS[1] the lock; ARGV[1] the owner, ARGV[2] the ttl in ms;
-- ARGV[3], where given, sets the expiry exactly, sooner or later (a lease's hold:
-- `expire_after`). Returns 1 where the owner still held the lock (now extended), else 0. The
-- lock's first line holds its owner, or its owner and `-` (granted while nobody waited: see
-- common.lua); both are the owner's. The holder's description after it is left as it is.
--
-- A renewal never shortens the lock's life: one sent just before the lease's release, held up
-- on its way, can land after the release set the expiry of the lease's hold, and must not cut
-- that hold short. `PEXPIRE … GT` (Redis 7) says so in one command; Redis 6.2 refuses the flag,
-- and reads the time left first.
local holder = redis.call('GET', KEYS[1])
if not holder then
  return 0
end
local who = string.match(holder, '^[^\n]*')
if who == ARGV[1] or who == ARGV[1] .. '-' then
  if ARGV[3] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  local extended = redis.pcall('PEXPIRE', KEYS[1], ARGV[2], 'GT')
  if type(extended) == 'table' and extended.err then
    if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
      redis.call('PEXPIRE', KEYS[1], ARGV[2])
    end
  end
  return 1
end
return 0
