-- Renew: compare-and-PEXPIRE. KEYS[1] the lock; ARGV[1] the owner, ARGV[2] the ttl in ms.
-- Returns 1 where the owner still held the lock (now extended), else 0. The lock holds its
-- owner, or its owner and `-` (granted while nobody waited: see common.lua); both are the
-- owner's.
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] or holder == ARGV[1] .. '-' then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
