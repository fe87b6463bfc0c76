-- Inspect: what one lock's keys say, read in one step, for operators. Writes nothing.
--
-- KEYS: the lock, its fence counter, its queue (see common.lua).
--
-- Returns {the lock's value ('' where free), its PTTL, the counter ('' where none), the number
-- of live waiters}: a queued owner is live while its waiter key is (a waiter whose process
-- died leaves its entry until a release drops it). Each live owner counts once.
local lock, counter, queue = KEYS[1], KEYS[2], KEYS[3]
local value = redis.call('GET', lock)
local pttl = redis.call('PTTL', lock)
local fence = redis.call('GET', counter)
local live, seen = 0, {}
for _, who in ipairs(redis.call('LRANGE', queue, 0, -1)) do
  if not seen[who] and redis.call('EXISTS', lock .. ':w:' .. who) == 1 then
    live = live + 1
  end
  seen[who] = true
end
return {value or '', pttl, fence or '', live}
