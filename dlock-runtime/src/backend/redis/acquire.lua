-- Acquire: one round trip. After common.lua; ARGV[2] the ttl in ms; ARGV[3], where given, the
-- liveness window in ms: queue up when the lock is busy (refreshing this waiter's liveness).
-- Without it, leave the queue instead.
--
-- Returns the fence (an integer) when the lock is this owner's, else {the lock's PTTL, 1 if this
-- owner heads the queue else 0, the last fence handed out for the lock}. A hand-off to this owner
-- that carries a greater fence than a busy answer did happened after this call ran.
local ttl, liveness = ARGV[2], ARGV[3]

-- Nobody holds the lock and nobody waits for it, so this owner is in no queue either: the
-- uncontended path, three commands.
if redis.call('EXISTS', lock, queue) == 0 then
  return grant(owner, ttl)
end

local holder = redis.call('GET', lock)
if holder == owner then
  -- Ours already: handed over by a release, or granted to an earlier call whose reply was lost.
  -- Idempotent: extend to the full ttl and answer the same fence.
  redis.call('PEXPIRE', lock, ttl)
  leave()
  local fence = redis.call('GET', counter)
  if fence then
    return tonumber(fence)
  end
  -- The counter was deleted from outside: a fresh fence at least names this grant.
  return grant(owner, ttl)
end

if not holder then
  -- Free, but the queue exists: serve its first live waiter, which may be this owner.
  local head, head_ttl = pop_live_head()
  if not head or head == owner then
    return grant(owner, ttl)
  end
  -- Others came first (the holder expired without a release to hand it on).
  hand_to(head, head_ttl)
end

local last = tonumber(redis.call('GET', counter) or '0')
if liveness then
  local position = redis.call('LPOS', queue, owner)
  if not position then
    position = redis.call('RPUSH', queue, owner) - 1
  end
  redis.call('SET', waiter_key(owner), ttl, 'PX', liveness)
  -- A queue whose waiters all died goes away by itself.
  redis.call('PEXPIRE', queue, 2 * tonumber(liveness))
  return {redis.call('PTTL', lock), position == 0 and 1 or 0, last}
end

leave()
return {redis.call('PTTL', lock), 0, last}
