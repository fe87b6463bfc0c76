-- Force release, for operators (`dlock release --force`): releases the lock where the owner the
-- operator named holds it, and hands it on as the holder's own release would. One round trip.
--
-- KEYS: the lock, its fence counter, its queue (see common.lua).
-- ARGV[1] the owner to evict, as the operator read it (see common.lua); ARGV[2] the id of the
-- calling backend, whose own waiters it wakes itself; ARGV[3] the key prefix (which names the
-- waiters' channels, see `hand_to` in common.lua).
--
-- The owner is compared as release.lua and renew.lua compare theirs: the value's first line,
-- exactly, marked (`-`) or not. So the script changes nothing where the lock changed hands since
-- the operator read it; and a copy of the call sent again (after a timeout or a dropped
-- connection, or by a cluster's client) is harmless: it finds the lock handed to a waiter, or
-- free, and evicts nobody.
--
-- The evicted holder is not told: its next renewal finds the lock no longer its own, and its
-- lease is lost. Its fenced writes are rejected from then on, because the next grant's fence is
-- above the evicted one: `grant` (grant.lua) counts one more than the counter, which holds the
-- evicted holder's fence while the lock holds its owner, and never less than the server's clock
-- in µs — so it rises past the evicted fence even where the counter was lost. Nothing else is
-- needed here for that.
--
-- Returns false where `owner` does not hold the lock (nobody does, or another: nothing is
-- changed); else {the lock's value (the evicted holder's owner and description), the counter's
-- value ('' where none)}, followed, where the lock was handed on, by the owner it went to, its
-- fence, and the number of that waiter's call the grant read ('' if none).
local lock, counter, queue = KEYS[1], KEYS[2], KEYS[3]
local owner, instance, prefix = ARGV[1], ARGV[2], ARGV[3]

local holder = redis.call('GET', lock)
-- The owner, marked or not, is the value's first line (see common.lua).
local who = holder and string.match(holder, '^[^\n]*')
if who ~= owner and who ~= owner .. '-' then
  return false
end
local last = redis.call('GET', counter) or ''

--!grant
--!common

local head, waiter = pop_live_head()
if not head then
  redis.call('DEL', lock)
  return {holder, last}
end
local fence, call = hand_to(head, waiter, instance)
return {holder, last, head, fence, call}
