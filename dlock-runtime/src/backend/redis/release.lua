-- Release, and leaving the queue: one round trip.
--
-- KEYS: the lock, its fence counter, its queue (see common.lua).
-- ARGV[1] this owner; ARGV[2] the id of the calling backend, whose own waiters it wakes itself.
--
-- Where this owner holds the lock, hands it to the first live waiter, or deletes it where nobody
-- waits. Else marks this owner's acquisition cancelled, takes it out of the queue, and hands on
-- a lock that nobody holds (it may have been this waiter's turn, or its holder expired). Returns 1 where this owner held the lock,
-- else 0; where the lock was handed on, {that 1 or 0, the owner it went to, its fence}.
local lock, counter, queue = KEYS[1], KEYS[2], KEYS[3]
local owner, instance = ARGV[1], ARGV[2]

local holder = redis.call('GET', lock)
-- The uncontended path, on its own: three commands. (A holder is in no queue: it left it when it
-- was granted the lock.)
local head
if holder == owner then
  head = redis.call('LPOP', queue)
  if not head then
    redis.call('DEL', lock)
    return 1
  end
end

--!grant
--!common

if holder == owner then
  -- `head` is off the queue already; it, or the first live waiter after it, gets the lock.
  local waiter = redis.call('GETDEL', waiter_key(head))
  if not waiter then
    head, waiter = pop_live_head()
  end
  if not head then
    redis.call('DEL', lock)
    return 1
  end
  return {1, head, hand_to(head, waiter, instance)}
end
-- This owner does not hold the lock: a waiter leaving, the undo of an acquisition cancelled
-- before its grant (or after, where the grant already expired), or the release of a lease that
-- was lost. An acquire call of this owner still on its way is to take no effect.
cancel()
leave()
if not holder then
  local head, waiter = pop_live_head()
  if head then
    return {0, head, hand_to(head, waiter, instance)}
  end
end
return 0
