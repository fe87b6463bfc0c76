-- The fence logic, written once: spliced into acquire.lua and release.lua where a line says
-- `--!grant`. Acquire grants on its uncontended path, so there it comes before that path; release
-- grants only in a hand-off, so there it comes with common.lua, after the uncontended path.
-- It uses the scripts' names `lock` and `counter` (see common.lua), declared before the splice.

-- Sets the lock to `value` (an owner, marked or not: see common.lua) for `ttl` ms, followed by
-- `meta` (the holder's `<pid>/<host>/<label>`, see common.lua), the fence and the server's clock
-- where `meta` is given; where it is not (a grant to an older dlock's waiter, which expects its
-- owner alone), the owner alone. Returns the grant's fence: one more than the last, and never below the server's clock in µs. The floor is
-- what keeps fences rising when Redis loses the counter or goes back to an older value of it — a
-- restart without persistence, a snapshot restored, a fail-over to a replica that missed writes
-- — and what lets the counter expire: it starts again from the clock, past every fence handed
-- out before (the counter runs ahead of the clock by one µs per grant at most, and an hour's
-- expiry leaves it far behind). A counter that is not lost needs no clock (one more than the
-- last would do), but only the clock can tell a counter from an older copy of itself: the floor
-- is taken on every grant. A number, and exact: µs since 1970 stay below 2^53 until the year
-- 2255.
--
-- Two commands besides the lock's `SET`: `TIME`, and one `SET … GET` that writes the clock's
-- value and answers the last fence. Only where the last fence is not below the clock (two grants
-- in one µs, or a clock that went back) is the counter written a second time, one past the last.
local function grant(value, ttl, meta)
  local now = redis.call('TIME')
  now = now[1] * 1000000 + now[2]
  local last = tonumber(redis.call('SET', counter, now, 'PX', 3600000, 'GET'))
  local n = now
  if last and last >= now then
    n = last + 1
    redis.call('SET', counter, n, 'PX', 3600000)
  end
  if meta then
    value = value .. '\n' .. meta .. '/' .. string.format('%.0f', n) .. '/' .. string.format('%.0f', now)
  end
  redis.call('SET', lock, value, 'PX', ttl)
  return n
end
