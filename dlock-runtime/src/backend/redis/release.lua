-- Release, and leaving the queue: one round trip. After common.lua.
--
-- Where this owner holds the lock, deletes it and hands it to the first live waiter. Else takes
-- this owner out of the queue, and hands on a lock that nobody holds (it may have been this
-- waiter's turn, or its holder expired). Returns {1 where this owner held the lock else 0, the
-- owner the lock was handed to or '', that hand-off's fence or 0}.
if redis.call('GET', lock) == owner then
  -- A holder is in no queue: it left it when it was granted the lock.
  redis.call('DEL', lock)
  local head, n = hand_off()
  return {1, head or '', n or 0}
end
leave()
if redis.call('EXISTS', lock) == 0 then
  local head, n = hand_off()
  return {0, head or '', n or 0}
end
return {0, '', 0}
