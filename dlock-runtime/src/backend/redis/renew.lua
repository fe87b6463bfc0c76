-- Renew: compare-and-PEXPIRE. KEYS[1] the lock; ARGV[1] the owner, ARGV[2] the ttl in ms;
-- ARGV[3], where given, sets the expiry exactly, sooner or later (a lease's hold:
-- `expire_after`); ARGV[4], where given with it, leaves the owner's cancel marker too (see
-- below). Returns 1 where the owner still held the lock (now extended), else 0; 0 too for a
-- plain renewal of a lock whose hold was set (see "The hold's mark" below). The lock's first
-- line holds its owner, or its owner and `-` (granted while nobody waited: see common.lua);
-- both are the owner's. The holder's description after it is left as it is.
--
-- A renewal never shortens the lock's life: one sent just before the lease's release, held up
-- on its way, can land after the release set the expiry of the lease's hold, and must not cut
-- that hold short. `PEXPIRE … GT` (Redis 7) says so in one command; Redis 6.2 refuses the flag,
-- and reads the time left first.
--
-- The cancel marker. A hold ends the lease as a release does, only later: where an acquire call
-- of the lease's owner may still be on its way (a call sent twice; every call on a cluster),
-- that copy, landing once the hold is over, would find the key free and grant it to nobody for
-- a full ttl. So the hold leaves the owner's cancel marker, `<lock>:x:<owner>` (see `cancel` in
-- common.lua), as such a release does, for the hold and the marker's usual minute after it.
-- Written after the expiry: a server out of memory refuses a script's first write that may grow
-- memory, not a later one (see release.lua).
--
-- The hold's mark. Nor may a renewal lengthen a hold: one sent before the release and landing
-- after the hold's expiry was set — a copy the connection sent again after a time-out, the
-- first still on its way, or a cluster slot's call the backend gave up on while its client kept
-- trying — would move the hold's end to a whole ttl from then, and the key would be held for
-- nobody that long (a job due at the end of the hold window skipped). The watchdog sends the
-- hold again after a renewal that was on its way at the release answers, but not after a copy
-- it stopped waiting for. So the exact expiry marks the lock's value, a last line `hold` after
-- the description (whose fields never hold a raw line break), and a plain renewal of a marked
-- lock changes nothing and answers 0: its lease was released (that is what sets a hold), so
-- no lease is lost by it. The mark costs the ordinary renewal no command: it reads the value
-- already. Kept by the acquire script's rewrite of the `-` mark (which keeps what follows the
-- first line), gone with the lock's next grant; the description parser (describe.rs) skips it.
local held = '\nhold'

local function cancel()
  if ARGV[4] then
    return redis.pcall('SET', KEYS[1] .. ':x:' .. ARGV[1], 1, 'PX', tonumber(ARGV[2]) + 60000)
  end
end

local holder = redis.call('GET', KEYS[1])
local who = holder and string.match(holder, '^[^\n]*')
if holder and (who == ARGV[1] or who == ARGV[1] .. '-') then
  local marked = string.sub(holder, -#held) == held
  if ARGV[3] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    if not marked then
      -- After the expiry, which a full server never refuses, as the cancel marker is.
      redis.pcall('SET', KEYS[1], holder .. held, 'KEEPTTL')
    end
    cancel()
    return 1
  end
  if marked then
    return 0
  end
  local extended = redis.pcall('PEXPIRE', KEYS[1], ARGV[2], 'GT')
  if type(extended) == 'table' and extended.err then
    if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
      redis.call('PEXPIRE', KEYS[1], ARGV[2])
    end
  end
  return 1
end
-- Not held (expired, or taken over): a copy of an acquire call still on its way is turned away
-- all the same. (On a server out of memory the marker is refused, and the answer stands.)
cancel()
return 0
