-- Shared head of acquire.lua and release.lua.
--
-- KEYS[1] the lock: a string holding its holder's owner, with the lease's PX
-- KEYS[2] the fence counter: the last fence handed out for the lock (INCR); never expires
-- KEYS[3] the queue of waiting owners, in arrival order; it exists only while someone waits
-- ARGV[1] this owner
--
-- Every grant counts its fence and sets the lock to its owner in one step, so while the lock
-- holds an owner, the counter holds the fence of that owner's grant: an owner's fence is read
-- back from the counter rather than stored a second time.
--
-- A waiter's key, `<lock>:w:<owner>`, holds the waiter's ttl in ms, with a PX of the liveness
-- window; the lock's channel is `<lock>:ch`. Both share the lock's hash slot, and are named here
-- from the lock's name rather than passed, which keeps the uncontended calls short.
local lock, counter, queue = KEYS[1], KEYS[2], KEYS[3]
local owner = ARGV[1]

local function waiter_key(who)
  return lock .. ':w:' .. who
end

-- Grants the lock to `who` for `ttl` ms. Returns the grant's fence, a number, which is exact:
-- fences count grants, far below 2^53.
local function grant(who, ttl)
  local n = redis.call('INCR', counter)
  redis.call('SET', lock, who, 'PX', ttl)
  return n
end

-- Takes the first live waiter off the queue, with its waiter key: its owner and ttl. Dead
-- waiters (their waiter key expired) before it are dropped.
local function pop_live_head()
  while true do
    local head = redis.call('LPOP', queue)
    if not head then
      return nil, nil
    end
    local ttl = redis.call('GETDEL', waiter_key(head))
    if ttl then
      return head, ttl
    end
  end
end

-- Hands the (free) lock to waiter `head` for its full ttl, and publishes `<owner> <fence>` on the
-- channel, so the waiter holds a valid lease without another round trip. Returns the fence.
local function hand_to(head, ttl)
  local n = grant(head, ttl)
  redis.call('PUBLISH', lock .. ':ch', string.format('%s %d', head, n))
  return n
end

-- Takes this owner out of the queue.
local function leave()
  redis.call('LREM', queue, 1, owner)
  redis.call('DEL', waiter_key(owner))
end
