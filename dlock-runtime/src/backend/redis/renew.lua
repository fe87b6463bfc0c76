-- Renew: compare-and-PEXPIRE. KEYS[1] the lock; ARGV[1] the owner, ARGV[2] the ttl in ms.
-- Returns 1 where the owner still held the lock (now extended), else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
