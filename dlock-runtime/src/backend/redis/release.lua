-- Release, and leaving the queue: one round trip.
--
-- KEYS: the lock, its fence counter, its queue (see common.lua).
-- ARGV[1] this owner; ARGV[2] the id of the calling backend, whose own waiters it wakes itself;
-- ARGV[3] the key prefix (which names the waiters' channels, see `hand_to` in common.lua);
-- ARGV[4] `1` where this undoes an acquisition its caller gave up or that failed unanswered (a
-- dropped or failed acquire, a lost reply), rather than releasing a lease: the owner's cancel
-- marker is then left in every case.
--
-- Where this owner holds the lock, hands it to the first live waiter, or deletes it where nobody
-- waits. Else takes this owner out of the queue, hands on a lock that nobody holds (it may have
-- been this waiter's turn, or its holder expired), and marks this owner's acquisition cancelled.
-- Returns 1 where this owner held the lock, else 0; where the lock was handed on, {that 1 or 0,
-- the owner it went to, its fence, the number of that waiter's call the grant read ('' if
-- none)}.
--
-- Out of memory. A server at its `maxmemory` under `noeviction` (the policy `connect` insists
-- on) refuses a script at its first write that may grow memory (`SET`, as the cancel marker's)
-- unless the script wrote something before it; once it has, the script runs to its end. So in
-- every branch the write that frees the lock (its `DEL`, or the `LPOP` that hands it on) comes
-- first and the cancel marker last: a release or undo then frees the lock on a full server too.
-- The marker is read by acquire calls alone, never here, so its place decides nothing. (Where
-- nothing is freed before it — the undo of an owner that neither holds the lock nor waits for
-- it — it is still refused; so is an acquire call, whose grant writes first.)
local lock, counter, queue = KEYS[1], KEYS[2], KEYS[3]
local owner, instance, prefix, undo = ARGV[1], ARGV[2], ARGV[3], ARGV[4] == '1'

local holder = redis.call('GET', lock)
-- The owner, marked or not, is the value's first line: the holder's description follows it
-- (see common.lua).
local who = holder and string.match(holder, '^[^\n]*')
-- The uncontended path, on its own: two commands. A lock granted while nobody waited and
-- that nobody queued for since (marked `-`, see common.lua) has no waiter to hand it to.
if who == owner .. '-' then
  redis.call('DEL', lock)
  if undo then
    -- As `cancel` in common.lua, not spliced in yet.
    redis.call('SET', lock .. ':x:' .. owner, 1, 'PX', 60000)
  end
  return 1
end

--!grant
--!common

if who == owner then
  -- The first live waiter, if any, gets the lock. (A holder is in no queue: it left it when it
  -- was granted the lock.)
  local head, waiter = pop_live_head()
  local reply = 1
  if head then
    local fence, call = hand_to(head, waiter, instance)
    reply = {1, head, fence, call}
  else
    redis.call('DEL', lock)
  end
  if undo then
    -- An acquisition undone after it was granted (a waiter a release handed the lock to, a grant
    -- whose reply was lost): an acquire call of its owner that is still on its way (sent before
    -- its caller gave up, or again after a lost reply, and overtaken by this undo on another
    -- connection) would otherwise find the lock free, or queue, and be granted it, for a full
    -- ttl, with nobody to release it. A lease's release needs no marker: its acquisition was
    -- answered, so no call of its owner is on its way (a lease granted to a call sent twice, the
    -- other copy perhaps still on its way, is released as an undo; so is every lease on a
    -- cluster, whose client sends calls again without saying so). Written last (see "Out of
    -- memory" above).
    cancel()
  end
  return reply
end
-- This owner does not hold the lock: a waiter leaving, the undo of an acquisition cancelled
-- before its grant (or after, where the grant already expired), or the release of a lease that
-- was lost. An acquire call of this owner still on its way is to take no effect. The marker is
-- written last (see "Out of memory" above).
leave()
local reply = 0
if not holder then
  local head, waiter = pop_live_head()
  if head then
    local fence, call = hand_to(head, waiter, instance)
    reply = {0, head, fence, call}
  end
end
cancel()
return reply
