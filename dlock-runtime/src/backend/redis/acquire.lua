-- Acquire: one round trip. After common.lua; ARGV[5] the ttl in ms, ARGV[6] '1' to queue up when
-- the lock is busy (refreshing this waiter's liveness), '0' to leave the queue instead.
--
-- Returns {1, fence} when the lock is this owner's, else {0, the lock's PTTL, 1 if this owner
-- heads the queue else 0, the last fence handed out for the lock}. A hand-off to this owner that
-- carries a greater fence than a busy answer did happened after this call ran.
local ttl, queue_if_busy = ARGV[5], ARGV[6] == '1'

local holder = redis.call('GET', lock)
if holder == owner then
  -- Ours already: handed over by a release, or granted to an earlier call whose reply was lost.
  -- Idempotent: extend to the full ttl and answer the same fence.
  redis.call('PEXPIRE', lock, ttl)
  leave()
  local last = redis.call('HMGET', fence, 'o', 'n')
  if last[1] == owner then
    return {1, last[2]}
  end
  return {1, next_fence(owner)}
end

if not holder then
  local head = live_head()
  if not head then
    -- Nobody waits, so this owner is in no queue: the uncontended path, with nothing to leave.
    redis.call('SET', lock, owner, 'PX', ttl)
    return {1, next_fence(owner)}
  end
  if head == owner then
    leave()
    redis.call('SET', lock, owner, 'PX', ttl)
    return {1, next_fence(owner)}
  end
  -- Free, but others came first (the holder expired without a release to hand it on).
  hand_off()
end

if queue_if_busy then
  if not redis.call('LPOS', queue, owner) then
    redis.call('RPUSH', queue, owner)
  end
  redis.call('SET', me, ttl, 'PX', liveness)
  -- A queue whose waiters all died goes away by itself.
  local keep = 2 * tonumber(liveness)
  if redis.call('PTTL', queue) < keep then
    redis.call('PEXPIRE', queue, keep)
  end
  local first = redis.call('LINDEX', queue, 0) == owner
  return {0, redis.call('PTTL', lock), first and 1 or 0, last_fence()}
end

leave()
return {0, redis.call('PTTL', lock), 0, last_fence()}
