-- Renew: compare-and-PEXPIRE. KEYS[1] the lock; ARGV[1] the owner, ARGV[2] the ttl in ms.
-- Returns 1 where the owner still held the lock (now extended), else 0. The lock's first line
-- holds its owner, or its owner and `-` (granted while nobody waited: see common.lua); both are
-- the owner's. The holder's description after it is left as it is.
local holder = redis.call('GET', KEYS[1])
if not holder then
  return 0
end
local who = string.match(holder, '^[^\n]*')
if who == ARGV[1] or who == ARGV[1] .. '-' then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
