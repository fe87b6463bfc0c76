-- Release, and leaving the queue: one round trip. After common.lua.
--
-- Where this owner holds the lock, hands it to the first live waiter, or deletes it where nobody
-- waits. Else takes this owner out of the queue, and hands on a lock that nobody holds (it may
-- have been this waiter's turn, or its holder expired). Returns 1 where this owner held the lock,
-- else 0; where the lock was handed on, {that 1 or 0, the owner it went to, its fence}.
local holder = redis.call('GET', lock)
if holder == owner then
  -- A holder is in no queue: it left it when it was granted the lock.
  local head, ttl = pop_live_head()
  if not head then
    redis.call('DEL', lock)
    return 1
  end
  return {1, head, hand_to(head, ttl)}
end
leave()
if not holder then
  local head, ttl = pop_live_head()
  if head then
    return {0, head, hand_to(head, ttl)}
  end
end
return 0
