-- The functions acquire.lua and release.lua share, spliced into each where it says `--!common`:
-- after the script's uncontended path, which needs none of them (defining them costs each call
-- that runs past the splice). `grant`, which they use, comes from grant.lua, spliced in before.
--
-- The scripts' names, declared before the splices:
-- `lock`    KEYS[1], the lock: a string holding its holder's owner, with the lease's PX. The
--           owner alone, or the owner and `-` where the lock was granted while nobody waited
--           for it and nobody has queued since (see "Marks" below); then, on a line of its own,
--           the holder's description (see "Descriptions" below)
-- `counter` KEYS[2], the fence counter: the last fence handed out for the lock (one more than
--           the last, floored by the server's clock in µs, see `grant` in grant.lua); it expires
--           an hour after the last grant
-- `queue`   KEYS[3], the owners waiting for the lock, in arrival order; it exists only while
--           someone waits
-- `owner`   ARGV[1], the owner the call is for
-- `prefix`  the backend's key prefix: the lock's name starts with it, and so do the waiters'
--           channels, so that an ACL user granted the prefix's channels (`&<prefix>*`) may
--           publish on them
--
-- Every grant counts its fence and sets the lock to its owner in one step, so while the lock
-- holds an owner, the counter holds the fence of that owner's grant: an owner's fence is read
-- back from the counter rather than stored a second time.
--
-- Marks. A lock granted on acquire's uncontended path (no queue then) holds `<owner>-`; the
-- first waiter to queue behind it rewrites it to `<owner>` (same PTTL), and every other grant
-- writes `<owner>`. So a lock holding `<owner>-` has nobody in its queue, and its release
-- deletes it without looking at the queue; a lock holding `<owner>` may have waiters, and its
-- release hands it to the first live one. Both forms are the owner's for every owner check
-- (release, renew, claim). An older dlock writes and expects `<owner>` alone: it never takes
-- `<owner>-` for its own (it is not: its owners are its own), and its waiters do not mark a lock
-- they queue behind, so a newer dlock's release of an unmarked lock leaves them to find it
-- free by their next look (their fallback poll) rather than handing it to them.
--
-- Descriptions. Every grant of this dlock writes the lock as `<owner>[-]\n<pid>/<host>/<label>/
-- <fence>/<µs>`: the holder's process id, host name and label (percent-encoded where they hold
-- a `/`, a `%`, white space or a control character), the grant's fence and the server's clock
-- at the grant, for operators (`inspect`). It costs no command: the grant's `SET` writes it.
-- Every owner check compares the first line alone, exactly (never a prefix of it). An older
-- dlock compares the whole value with its own owners, which it never matches (the value
-- ends in a digit, so it never takes it for a marked lock either); a grant to an older dlock's
-- waiter (one whose waiter key holds no description) writes the owner alone, as it expects.
--
-- A waiter's key, `<lock>:w:<owner>`, holds `<claim window in ms> <instance>/<description>
-- <call>` (how long a grant to the waiter lasts until it claims it, the id of the backend it
-- waits on with the waiter's `<pid>/<host>/<label>`, and the number of the waiter's call that
-- wrote it), with a PX of the liveness window. The description rides in the instance's field,
-- which an older dlock's release reads as one word: it then publishes where nobody listens,
-- and the waiter finds its grant by its fallback poll. It shares the lock's hash slot, and is
-- named here from the lock's name rather than passed, which keeps the uncontended calls short.
-- (An older dlock's waiter key holds the first two, with the instance alone, or the first
-- alone.)

local function waiter_key(who)
  return lock .. ':w:' .. who
end

-- The cancel marker of an owner, `<lock>:x:<owner>`, left by `cancel`.
local function cancel_key(who)
  return lock .. ':x:' .. who
end

-- Marks this owner's acquisition cancelled, for a minute: an acquire call of this owner that
-- reaches the server after the undo (it went out on another connection, and was overtaken)
-- finds the mark and takes no effect. An owner is never reused after its undo, so the mark
-- never turns away a caller that still waits. (A call held up for longer than a minute, far
-- beyond any response timeout, would take effect: its key expires after its ttl, unrenewed.)
local function cancel()
  redis.call('SET', cancel_key(owner), 1, 'PX', 60000)
end

-- Takes the first live waiter off the queue, with its waiter key: its owner and the waiter key's
-- value. Dead waiters (their waiter key expired) before it are dropped.
local function pop_live_head()
  while true do
    local head = redis.call('LPOP', queue)
    if not head then
      return nil, nil
    end
    local waiter = redis.call('GETDEL', waiter_key(head))
    if waiter then
      return head, waiter
    end
  end
end

-- Hands the (free) lock to waiter `head`, whose waiter key held `waiter`, for its claim window
-- only, and tells it on the channel of its backend, `<prefix>waiters:<instance>`: `<owner> <fence>
-- <call>`, where `<call>` is the number of the waiter's call that last wrote its waiter key.
-- That call reached the server before this grant, so the grant lasts at least the claim window
-- from the moment the waiter sent it: a waiter that sent it recently enough starts on the
-- message alone, its lease counted from that send time, and claims the lock for its full ttl
-- with its first renewal; one that did not claims it with an acquire call, which finds the lock
-- its own and extends it to the full ttl. A waiter that died meanwhile never does either, and
-- the grant lapses after the window, to be handed on by the next call that finds the lock
-- free. The message is left out where the waiter waits on backend `skip_publish_for`: the
-- caller, which wakes it in-process with the same three. A waiter of an older dlock (its key
-- names no call) is told as it expects, with its owner alone on the lock's channel
-- `<lock>:ch`; it put its ttl where the window is, and is granted that, as before. Returns the
-- fence and the call's number ('' where the key names none).
local function hand_to(head, waiter, skip_publish_for)
  local claim, instance, call = string.match(waiter, '^(%d+) ?(%S*) ?(%d*)$')
  local meta
  local slash = string.find(instance, '/', 1, true)
  if slash then
    instance, meta = string.sub(instance, 1, slash - 1), string.sub(instance, slash + 1)
  end
  local n = grant(head, claim, meta)
  if call == '' then
    redis.call('PUBLISH', lock .. ':ch', head)
  elseif instance ~= skip_publish_for then
    redis.call('PUBLISH', prefix .. 'waiters:' .. instance, head .. ' ' .. string.format('%.0f', n) .. ' ' .. call)
  end
  return n, call
end

-- Takes this owner out of the queue.
local function leave()
  redis.call('LREM', queue, 1, owner)
  redis.call('DEL', waiter_key(owner))
end
