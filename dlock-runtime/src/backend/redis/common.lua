-- Shared head of acquire.lua and release.lua.
--
-- KEYS[1] the lock (a string holding the owner, with the lease's PX)
-- KEYS[2] the fence hash: `n` = last fence handed out, `o` = the owner it went to; never expires
-- KEYS[3] the queue of waiting owners, in arrival order
-- KEYS[4] this owner's waiter key (holds its ttl in ms, with a PX of the liveness window)
-- ARGV[1] this owner
-- ARGV[2] the prefix of every waiter key of this lock (a waiter key is prefix .. owner)
-- ARGV[3] the channel that tells a waiter it was handed the lock
-- ARGV[4] the liveness window in ms
--
-- Waiter keys other than KEYS[4] are reached through ARGV[2]; they share the lock's hash slot.
local lock, fence, queue, me = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, waiter_prefix, channel, liveness = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

-- A new fence, recorded as the fence of `who`'s grant. Returned as a number, which is exact:
-- fences count grants, far below 2^53.
local function next_fence(who)
  local n = redis.call('HINCRBY', fence, 'n', 1)
  redis.call('HSET', fence, 'o', who)
  return n
end

-- The first waiter of the queue that is still alive, and its ttl; dead heads are dropped.
local function live_head()
  while true do
    local head = redis.call('LINDEX', queue, 0)
    if not head then
      return nil, nil
    end
    local ttl = redis.call('GET', waiter_prefix .. head)
    if ttl then
      return head, ttl
    end
    redis.call('LPOP', queue)
  end
end

-- Hands the (free) lock to the first live waiter, for that waiter's full ttl (from its waiter
-- key): the lock is set to its owner, a fresh fence is recorded for it, and the channel names
-- both (`<owner> <fence>`), so the waiter holds a valid lease without another round trip.
-- Returns the waiter's owner and fence, or nothing where nobody waits.
local function hand_off()
  local head, ttl = live_head()
  if not head then
    return nil, nil
  end
  redis.call('LPOP', queue)
  redis.call('DEL', waiter_prefix .. head)
  redis.call('SET', lock, head, 'PX', ttl)
  local n = next_fence(head)
  redis.call('PUBLISH', channel, string.format('%s %d', head, n))
  return head, n
end

-- The last fence handed out for this lock (0 before the first).
local function last_fence()
  return tonumber(redis.call('HGET', fence, 'n') or '0')
end

-- Takes this owner out of the queue.
local function leave()
  redis.call('LREM', queue, 1, owner)
  redis.call('DEL', me)
end
