-- The fence logic, written once: spliced into acquire.lua and release.lua where a line says
-- `--!grant`. Acquire grants on its uncontended path, so there it comes before that path; release
-- grants only in a hand-off, so there it comes with common.lua, after the uncontended path.
-- It uses the scripts' names `lock` and `counter` (see common.lua), declared before the splice.

-- Grants the lock to `who` for `ttl` ms. Returns the grant's fence: one more than the last, and
-- never below the server's clock in µs. The floor is what keeps fences rising when Redis loses
-- the counter — a restart without persistence, a snapshot restored, a fail-over to a replica
-- that missed writes — and what lets the counter expire: it starts again from the clock, past
-- every fence handed out before (the counter runs ahead of the clock by one µs per grant at
-- most, and an hour's expiry leaves it far behind). A number, and exact: µs since 1970 stay
-- below 2^53 until the year 2255.
local function grant(who, ttl)
  local now = redis.call('TIME')
  now = now[1] * 1000000 + now[2]
  local n = (tonumber(redis.call('GET', counter)) or 0) + 1
  if n < now then
    n = now
  end
  redis.call('SET', counter, n, 'PX', 3600000)
  redis.call('SET', lock, who, 'PX', ttl)
  return n
end
