-- Acquire: one round trip.
--
-- KEYS: the lock, its fence counter, its queue (see common.lua).
-- ARGV[1] this owner; ARGV[2] the ttl in ms; ARGV[3] the key prefix (which names the waiters'
-- channels, see `hand_to` in common.lua); ARGV[4] the holder's description, `<pid>/<host>/<label>`
-- (see common.lua), stored with the lock; then, for a waiter's calls, ARGV[5] the liveness
-- window in ms, ARGV[6] the id of the waiter's backend and ARGV[7] the number of this call
-- among the waiter's: queue up when the lock is busy (refreshing this waiter's liveness), or,
-- where the window is 0, leave the queue. A first try (no ARGV[5]) is in no queue.
--
-- Returns the fence (an integer) when the lock is this owner's, else {the lock's PTTL where this
-- owner heads the queue, else -1; 1 if it heads the queue, else 0}. A lock that a release handed
-- to this owner is claimed here: found this owner's, it is extended to the full ttl.
local lock, counter, queue = KEYS[1], KEYS[2], KEYS[3]
local owner, ttl, prefix, meta, liveness, instance, call = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]

--!grant

-- The uncontended path, on its own: nobody holds the lock, nobody waits for it, and this
-- owner's acquisition was not cancelled (see `cancel` in common.lua). Four commands: the
-- `EXISTS`, and grant's three. The lock is marked as granted with nobody waiting (`-`, see
-- common.lua), which spares its release a look at the queue. A waiter's calls, which expect a
-- busy lock, go straight on.
if not liveness and redis.call('EXISTS', lock, queue, lock .. ':x:' .. owner) == 0 then
  return grant(owner .. '-', ttl, meta)
end

--!common

local holder = redis.call('GET', lock)
-- The owner, marked or not, is the value's first line: the holder's description follows it.
local who = holder and string.match(holder, '^[^\n]*')
if who == owner or who == owner .. '-' then
  if redis.call('EXISTS', cancel_key(owner)) == 1 then
    -- This owner's lease was released already, its key left to expire at the end of its hold
    -- (renew.lua's exact expiry leaves the marker where a copy of this call may still come):
    -- this is that late copy, and it takes no effect. Owners are one per acquisition, and a
    -- marker is only written once its owner is done, so no live claim meets its own.
    return {-1, 0}
  end
  -- Ours already: handed over by a release (granted for the claim window only: this call claims
  -- it), or granted to an earlier call whose reply was lost. Idempotent: extend to the full ttl
  -- and answer the same fence. No undo of this owner came since that grant: an undo finding the
  -- lock its owner's releases it, and after an undo nothing grants to that owner again (it left
  -- the queue, and the cancel marker turns its later calls away). Nor is this owner still
  -- queued: whatever granted it took it off the queue, with its waiter key. Never shortening
  -- (`GT`; Redis 6.2 reads the time left instead): this may be a late copy of the call landing
  -- after the lease's hold set a later expiry (see renew.lua). But an expiry already where the
  -- ttl puts it is written again: a hand-off granting the whole ttl, claimed in the same
  -- millisecond (Redis 7.2 freezes a script's clock at its start), would otherwise leave this
  -- call nothing to replicate, and the `WAIT` that follows it under `min_replicas` counts this
  -- connection's writes alone (from Redis 7.2), not the grant, which the releaser's connection
  -- wrote: it would confirm a lock the replicas may never have received.
  local extended = redis.pcall('PEXPIRE', lock, ttl, 'GT')
  if extended ~= 1 and redis.call('PTTL', lock) <= tonumber(ttl) then
    redis.call('PEXPIRE', lock, ttl)
  end
  local fence = redis.call('GET', counter)
  if fence then
    return tonumber(fence)
  end
  -- The counter was deleted from outside: a fresh fence at least names this grant.
  return grant(who, ttl, meta)
end

if not holder then
  if redis.call('EXISTS', cancel_key(owner)) == 1 then
    -- A call that reached the server after its caller cancelled it, and after the undo: it
    -- takes no effect, and leaves the queue.
    leave()
    return {-1, 0}
  end
  -- Free: serve the first live waiter, which may be this owner; nobody waits, this owner.
  local head, waiter = pop_live_head()
  if not head or head == owner then
    -- Others may still be queued: unmarked (their turn comes with the release). Described, as
    -- every grant of this dlock is (this script is this dlock's: its caller gave `meta`).
    return grant(owner, ttl, meta)
  end
  -- Others came first (the holder expired without a release to hand it on).
  hand_to(head, waiter, nil)
  holder, who = head, head
end

if not liveness then
  return {-1, 0}
end
if liveness == '0' then
  leave()
  return {-1, 0}
end
-- This owner's waiter key tells whether it is queued already: while the key lives, so does its
-- entry. (A waiter whose key expired queues again; its older entry is found dead and dropped.)
-- It holds the waiter's claim window (the liveness window, or the ttl where shorter), its
-- backend and this call's number.
local claim = math.min(tonumber(ttl), tonumber(liveness))
local queued = redis.call('SET', waiter_key(owner), claim .. ' ' .. instance .. '/' .. meta .. ' ' .. call, 'PX', liveness, 'GET')
local first
if queued then
  first = redis.call('LINDEX', queue, 0) == owner
else
  if redis.call('EXISTS', cancel_key(owner)) == 1 then
    -- Cancelled, as above (a queued waiter's undo deletes its waiter key with its entry, so
    -- only a call that found no key can come after one).
    redis.call('DEL', waiter_key(owner))
    return {-1, 0}
  end
  first = redis.call('RPUSH', queue, owner) == 1
  if string.sub(who, -1) == '-' then
    -- The holder's release is to hand the lock on, not delete it: unmark it (its description
    -- stays).
    redis.call('SET', lock, string.sub(who, 1, -2) .. string.sub(holder, #who + 1), 'KEEPTTL')
  end
end
-- A queue whose waiters all died goes away by itself; but never before a live waiter's key
-- does, or that waiter would count itself queued in a queue that is gone. So the queue is made
-- to outlive this waiter's key (PX liveness) whenever it would not, and then by two windows, so
-- that this happens about once a window rather than on every call. It is never shortened: it
-- is extended only where it has less than one window left, to two; a waiter whose window is
-- longer than another's (backends with different settings) made it outlive its own key when
-- it called, and both have counted down alike since.
if redis.call('PTTL', queue) < tonumber(liveness) then
  redis.call('PEXPIRE', queue, 2 * tonumber(liveness))
end
if first then
  return {redis.call('PTTL', lock), 1}
end
return {-1, 0}
