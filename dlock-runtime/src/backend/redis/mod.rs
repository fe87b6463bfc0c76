//! The Redis store: single node, and Redis Cluster behind the `redis-cluster` feature.
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
//! use dlock::{backend::RedisBackend, Locker};
//!
//! // From a URL alone:
//! let locker = Locker::connect("redis://:secret@10.0.0.7:6379/0").await?;
//! // Or with options the URL does not carry:
//! let backend = RedisBackend::builder("redis://:secret@10.0.0.7:6379/0")?
//!     .key_prefix("billing:")
//!     .min_replicas(1)
//!     .connect()
//!     .await?;
//! let locker = Locker::with_backend(backend);
//! # Ok(()) }
//! ```
//!
//! # Keys
//!
//! A lock on the rendered key `K`, with the key prefix `P` (default `dlock:`), lives in these
//! Redis keys, which share a hash slot because `{K}` is their hash tag:
//!
//! | Redis key | type | what |
//! | --- | --- | --- |
//! | `P{K}` | string, with PX | the holder's owner token (32 hex digits), followed by `-` where it was granted while nobody waited and nobody has queued since; then, on a line of its own, the holder's description `<pid>/<host>/<label>/<fence>/<µs>` (see *Operators*); the lease's ttl is its PTTL |
//! | `P{K}:fences` | integer, with PX 1 h | the last fence handed out (one more than the last, never below the server's clock in µs); while `P{K}` holds an owner (for up to an hour), the fence of that owner's grant |
//! | `P{K}:q` | list, expires when idle | the owners waiting for the lock, in arrival order |
//! | `P{K}:w:<owner>` | string, with PX | one waiter's liveness: `<claim window in ms> <backend id>/<pid>/<host>/<label> <call>` (its description, for the grant a release hands it, and the number of the waiter's call that wrote it), kept alive while it waits |
//! | `P{K}:x:<owner>` | string, with PX 60 s | an acquisition cancelled by its caller (see below): an acquire call of that owner that reaches the server after the undo takes no effect |
//!
//! and every backend listens on a pub/sub channel of its own, `Pwaiters:<backend id>` (under the
//! prefix, like the keys), where a release that hands a lock to one of its waiters says so:
//! `<owner> <fence> <call>`.
//!
//! So `redis-cli GET 'dlock:{acct:42}'` shows who holds `acct:42` (its first line). Rendered keys never contain
//! `{` or `}` from placeholder values, which are percent-encoded; a brace written in a key
//! template's literal text still works (all keys of one lock keep sharing one slot, and two
//! locks never share a key), but the hash tag then ends at the first `}`. A prefix that holds a
//! hash tag itself (say `{dlock}:`) puts every lock in one slot. A key that is empty or starts
//! with `}` would leave the hash tag empty, which Redis Cluster ignores: its names are
//! `P}{=K}…` instead (the hash tag `=`), so they too share a slot; no other lock's names begin
//! with `P}`. A prefix holding an empty hash tag (`{}`) is refused.
//!
//! A grant's fence is one more than the last and never below the server's clock in
//! microseconds, so fences keep increasing across releases, expiries and restarts of clients,
//! and even where Redis loses the counter (a restart without persistence, an older snapshot
//! restored, a fail-over to a replica that missed writes), as long as the clock of the server
//! that grants does not lag the one before by more than the time between the two grants. The
//! clock floor is also what lets the counter expire, an hour after the last grant, so that a
//! key no longer used leaves nothing behind: the next grant starts again from the clock, past
//! every fence handed out before.
//!
//! Leases are another matter: a restart forgets every lease unless Redis keeps them —
//! `appendonly yes` with `appendfsync always` restores each lock with its expiry. Without it, a newcomer can get a key
//! whose holder is still in its body until that holder's next renewal finds the lease gone
//! (at most ttl/3): fences are what protect the data then.
//!
//! # Round trips
//!
//! - Acquire is one Lua script (`SET NX PX` in effect, plus the fence's count): one round trip.
//!   Uncontended, it runs four commands: an `EXISTS` of the lock, its queue and the owner's
//!   cancel marker together, the server's `TIME`, one `SET … GET` of the counter (it writes the
//!   clock's value and answers the last fence), and the `SET` of the lock. It is idempotent for
//!   its owner: where the lock already holds the owner, it extends it to the full ttl and
//!   answers the same fence (the counter's value: every grant counts its fence and sets the
//!   lock in one step), so a call retried after a lost reply is harmless.
//! - Release is one script: compare-and-delete, hand-off to the first live waiter, `PUBLISH`.
//!   Where nobody waited since the grant (the lock holds its owner and `-`), that is a `GET` and
//!   a `DEL`: the first waiter to queue behind a holder unmarks the lock, so only the release
//!   of an unmarked lock looks at the queue.
//!
//!   An uncontended acquire and release so cost the server eight commands, as `INFO
//!   commandstats` counts them (each script's `EVALSHA` and the commands it runs; nine on a
//!   cluster, see *Redis Cluster*). Two of them
//!   buy what a plain `SET NX` does not: the `TIME` and the counter's `SET … GET` give each grant
//!   a fence above every earlier one, even from a counter that was lost or went back to an older
//!   value (only the clock can tell); the `EXISTS` covers the queue (waiters are served in
//!   arrival order) and the cancel marker (see *Cancellation*) in the same command.
//!
//!   A waiter handed the lock starts on the release's word: the release's message (or, in the
//!   releasing process, its reply) carries the grant, and a contended hand-off costs the
//!   release's round trip alone (see *Waiting*, step 4).
//! - Renewal is one compare-and-`PEXPIRE` script per lease (`GT`: a renewal never shortens a
//!   lock's life, so one that lands after a lease's hold set a later expiry cannot cut the
//!   hold short; `expire_after` sets it exactly), all leases of a `renew` call in one
//!   pipeline: one round trip per watchdog tick, whatever the number of leases. (On a cluster,
//!   one pipeline per hash slot, sent concurrently, each awaited for a third of the shortest
//!   ttl at most: a slot that fails — its primary down — leaves its own leases unconfirmed that
//!   round, and the other slots' leases are confirmed all the same.)
//!
//! With [`min_replicas`](RedisBuilder::min_replicas) set, each acquire call and each
//! renewal pipeline carries a `WAIT` after its script(s), in the same round trip (see
//! *Fail-over* below); without it (the default), nothing is added.
//!
//! Scripts are sent by `EVALSHA`, and loaded (`SCRIPT LOAD`) where the server has not seen them
//! yet (after a restart, say), at the cost of a round trip or two more for that call. They need Redis 6.2 or
//! later (`GETDEL`, `SET … GET`): each connection asks the server's version (`INFO server`) when
//! it is made, and a connection to an older server fails with an error that names the version
//! needed.
//!
//! # Waiting
//!
//! Waiters on a key are served in arrival order, and woken rather than polling:
//!
//! 1. A waiter first tries once (an uncontended acquire costs one round trip), unless other
//!    waiters of the same backend wait for the key already (or did less than a second ago): it
//!    then goes straight to step 2, whose first call takes a free key all the same.
//! 2. If the key is busy, it makes sure the backend's channel is subscribed on its one pub/sub
//!    connection (one `SUBSCRIBE` per connection, whatever the keys waited for; a subscription
//!    that takes longer than a moment goes on in the background, and the waiter polls again
//!    once it is done, while failures back off, shared by the backend's waiters), then runs the
//!    acquire script in queueing mode, which appends its owner to the key's queue, unmarks the
//!    lock, and sets its waiter key (its *claim window*, its backend's id and the number of the
//!    call, with a PX of the *liveness window*). The claim window is the liveness window, or the
//!    waiter's ttl where that is shorter.
//! 3. A release hands the lock straight to the first live waiter, for that waiter's claim
//!    window only (read from its waiter key): the lock is set to the waiter's owner with that
//!    PX, a fresh fence is counted for it, and `<owner> <fence> <call>` is published on the
//!    waiter's backend's channel. (Where nobody waits, the lock is deleted.) Waiters whose
//!    waiter key expired (their process died) are skipped and dropped. The release script
//!    answers the same three; where the waiter waits on the releasing backend (the same
//!    process), it is woken at once, in-process, and the script publishes nothing: each waiter
//!    key names the backend its waiter waits on, and a release names its own.
//! 4. The waiter woken starts on the grant without a round trip. The grant came after the
//!    server ran the call the message names, so the server keeps the lock for the waiter at
//!    least a claim window from that call's send time: the lease counts from there, for the
//!    claim window less the client's margin on it, and the watchdog's first renewal, a third
//!    of the way in, extends the lock to the full ttl (a body that ends sooner needs none). A
//!    waiter with less than half of that left (its runtime stalled, the message was slow), one
//!    whose lease is not renewed (`renew = false`, or a direct `Backend::acquire` whose request
//!    does not say `renewed`), and every waiter where `min_replicas` asks for the replicas'
//!    word on each grant, claims the lock with one acquire call instead, which
//!    finds the lock already the owner's, extends it to the full ttl and answers its fence; the
//!    lease's validity then counts from that call's send time. A waiter whose process died
//!    before its turn never claims the lock: the grant lapses after the claim window, and the
//!    next acquire call that finds the lock free (the head of the queue watches its PTTL) hands
//!    it on. A waiter that died costs the waiters after it at most one claim window, never a
//!    ttl.
//!
//! While waiting, a waiter re-runs the acquire script on a timer — jittered exponential back-off
//! up to a third of the liveness window — which keeps its waiter key alive and is the fallback
//! for a missed message: it finds the lock its owner's and claims it as in step 4.
//! The head of the queue also wakes when the holder's PTTL runs out, since a holder that expired
//! without releasing hands nothing on; any acquire call that finds the lock free with live
//! waiters hands it to the first of them. A waiter that gives up (its `wait` ran out) makes a
//! last attempt and leaves the queue in the same script; a waiter whose future is dropped leaves
//! the queue (or, if the lock was handed to it meanwhile, releases it with hand-off) from dlock's
//! background runtime.
//!
//! # Operators
//!
//! [`Locker::inspect`](crate::Locker::inspect) runs one read-only script: the lock's value, its
//! PTTL, its fence counter, and the queue's owners whose waiter key is alive (the live waiters).
//! The value describes the holder: every grant writes `<owner>[-]\n<pid>/<host>/<label>/<fence>/
//! <µs>` (host and label percent-encoded where they hold `/`, `%`, white space or a control byte;
//! the µs are the server's `TIME` at the grant) in the `SET` it makes anyway, so the description
//! costs no command. Every owner check compares the value's first line alone, and exactly: an
//! owner whose token begins another's never passes. A lease granted by an older dlock (the owner
//! alone) is described by its fence, read from the counter, which the server's clock floors in
//! µs: that is also its grant time, give or take the grants counted in the same µs.
//! [`Locker::list`](crate::Locker::list) walks the keyspace with
//! `SCAN <cursor> MATCH P{<prefix>*} COUNT 1000 TYPE string` (never `KEYS`, which blocks the
//! server for the whole walk): only a lock's name ends in `}`. On a Redis Cluster it answers
//! [`LockError::Unsupported`]: each primary would need a walk of its own.
//!
//! # Older versions on the same server
//!
//! Processes of this dlock and of an older one may lock the same keys during a rolling upgrade:
//! the Redis names are the same, and so are the fence counter's rules, so no two processes
//! hold a key at once and fences keep rising. Each version only ever takes its own owners for
//! its own, and treats any other value of the lock as busy. Hand-offs between versions work
//! but wait longer: an older release publishes on a per-key channel this version does not
//! listen on, and an older waiter does not unmark a lock it queues behind, so the release of a
//! lock granted while nobody waited deletes it rather than handing it on. Either way the
//! waiter's fallback poll (at most a third of the liveness window) finds the free key or the
//! grant. A release of this version tells an older waiter on its per-key channel, as it expects.
//! An older version compares the whole lock with its own owners, so it never takes a described
//! lock for its own, nor for a marked one (the description ends in a digit); a release of this
//! version grants an older waiter (whose waiter key carries no description) the owner alone, as
//! it expects, and this version renews and releases a lock holding the owner alone. An older
//! release reads a newer waiter's description as part of its backend's id, and publishes where
//! nobody listens: that waiter finds the grant by its fallback poll.
//!
//! # Cancellation
//!
//! A caller that drops its acquire (a timeout, a `select!`), or whose acquire failed unanswered
//! (a lost reply, a time-out), cannot tell whether the call reached the server: dlock undoes it
//! with a release from its background runtime, on another connection than the call's own, so
//! the undo may reach the server first — and a copy of the call sent again on a fresh
//! connection after a lost reply may still be on its way. The undo leaves a cancel marker for
//! that owner, whether or not it found the lock granted to it (releasing it then), and an
//! acquire call of that owner arriving later finds the marker and takes no effect. A lease
//! granted to a call sent twice (its first connection dropped) is released the same way, as
//! the first copy may still be on its way; so is an acquisition not granted after such a
//! resend, and, on a cluster, every lease and every acquisition not granted (see *Redis
//! Cluster*); where such a lease is released
//! before the end of its hold (`hold_at_least`), the expiry set for the hold's end leaves the
//! marker too, for the hold and a minute after it. Checking for the marker
//! costs the uncontended acquire one more key in its `EXISTS`, no command and no round trip.
//! An undo that fails (the server unreachable, a connection that cannot be made) is tried again
//! by the locker, backing off up to 5 s, until it lands or the acquisition's ttl and the
//! marker's minute have passed, or the locker shuts down. The release script frees the lock
//! before it writes the marker, so that a server out of memory (`noeviction`) runs it: it refuses
//! a script only at a first write that may grow memory.
//!
//! # Connections
//!
//! Each backend has one pub/sub connection, made on dlock's own background runtime, and one
//! multiplexed command connection per tokio runtime that calls it: a connection's driver task
//! runs on the runtime that made it, so a caller's requests never hop threads (on a
//! current-thread runtime the hop costs more than the round trip), while dlock's own work — the
//! watchdog, releases queued by `Drop` — uses a connection of the background runtime. A backend
//! in a `static` so serves every runtime of the process; the connections of runtimes that ended
//! are dropped, oldest first, beyond the last eight. When a call finds its connection broken (the
//! server restarted, say), the connection is replaced and the call retried once on the fresh
//! one: every call is idempotent for its owner, and the first call after a restart succeeds.
//! Connection and response timeouts are [builder](RedisBuilder) options (3 s each by
//! default); callers that queued behind a connection attempt that failed share its failure, so an
//! unreachable server costs each call at most one attempt. A wrong password fails at once with
//! the server's `WRONGPASS`/`NOAUTH` answer and a hint to put the credentials in the URL.
//!
//! # URLs, AUTH and TLS
//!
//! `redis://[[user]:password@]host[:port][/db][?min_replicas=n]`, as redis-rs reads it:
//! `redis://:secret@host` authenticates with a password, `redis://user:secret@host` as an ACL
//! user; `min_replicas` is dlock's (see *Fail-over*). An ACL user needs the lock channels
//! besides the keys: `&dlock:*` for the default prefix, or `allchannels` (Redis 7 gives a new
//! user no channel), which `connect` checks. `rediss://` is the same over TLS, and
//! needs the `redis-tls` feature (`dlock-rs = { version = "0.1", features = ["redis-tls"] }`).
//! TLS comes from rustls with the `ring` provider, which builds with a C compiler but no system
//! libraries or cmake; it is not on by default because it makes a clean build of dlock much
//! longer, for what most users do not need. The server's certificate is checked against the
//! system's roots (`SSL_CERT_FILE` and `SSL_CERT_DIR` are honoured).
//!
//! # Redis Cluster
//!
//! With the `redis-cluster` feature, `redis+cluster://host:port,host:port` (or `rediss+cluster://`
//! for TLS, or a `redis://` URL naming several hosts) connects to a cluster through the nodes
//! it names; AUTH in the URL applies to every node. Every key of one lock shares a hash slot, so
//! each script runs on the one node that owns the lock. The pub/sub connection subscribes on one
//! of the named nodes at a time (a classic `PUBLISH` reaches every node of a cluster), moving to
//! the next when it drops. (Sharded pub/sub would spare the other nodes that broadcast, at the
//! cost of one subscriber connection per node; it is not used.)
//!
//! The cluster client sends a command again by itself after its connection to a node dropped
//! (or after a redirection), and does not say so: any acquire call may have gone out twice, the
//! first copy perhaps still on its way when the lease is released. So on a cluster every release
//! is sent as an undo (see *Cancellation*), and leaves the owner's cancel marker, which turns
//! such a late copy away rather than let it grant the key to nobody for a full ttl. That costs
//! each release one more write, a `SET` of the marker (expiring after a minute): an uncontended
//! acquire and release run nine commands on a cluster, eight on a single node. The same goes for
//! an acquisition not granted (busy at `wait = 0`, or a waiter that gave up at its deadline): the
//! copy that answered may have been the second, the first landing only after the holder's
//! release, to find the key free. So on a cluster such an acquisition is undone too, with a
//! release script that writes the marker: one more round trip and write per acquisition not
//! granted.
//!
//! # Fail-over
//!
//! Redis replicates asynchronously: a lock granted by a primary that fails before replicating it
//! can be granted again by the promoted replica, and a fence counter that had not reached the
//! replica counts again from an older value — which the clock floor lifts past every fence the
//! old primary handed out. Renewals are no different: a holder whose primary is cut off from its
//! replicas goes on renewing there, and a replica promoted after the lease's ttl ran out on its
//! copy lets a second caller in while the first still holds the lease by every confirmation it
//! received: the two bodies run side by side until the partition heals and the holder's
//! renewals fail or are refused. By default, then, mutual exclusion holds as long as the store
//! keeps its writes; fences still rise across the fail-over and are what protect the data — pass
//! them to the protected store.
//!
//! [`min_replicas(n)`](RedisBuilder::min_replicas) (or `?min_replicas=n` in the URL)
//! closes that gap: a grant counts only once `WAIT n` says `n` replicas acknowledged it, and a
//! renewal only where they acknowledged it; a holder cut off from its replicas loses its lease by
//! its own deadline, before the replicas' copy runs out. The `WAIT` rides in the same pipeline
//! as the script (on a cluster, to the primary that ran it), blocks for at most ttl/12 (and half
//! the response timeout), and costs the time the replicas take to acknowledge — Redisson's
//! replica-sync check is the analogue. A grant too few replicas acknowledged is asked for again
//! within the caller's `wait`, then released and reported as [`LockError::Backend`]. Leases still
//! do not survive a fail-over to a replica that missed them, and a promotion that picks a replica
//! which had not acknowledged (more replicas than `n`) can still forget a lease: count every
//! replica that can be promoted. Redis's own `min-replicas-to-write` refuses writes on a primary
//! with too few replicas in touch, but judges by their last acknowledgement, up to
//! `min-replicas-max-lag` (10 s) old: it narrows the window without closing it.

mod acquire;
mod builder;
mod checks;
mod conn;
mod describe;
mod force;
mod inspect;
mod keys;
mod release;
mod renew;
mod replicas;
mod resent;
mod scripts;
mod subscriber;
mod waiting;

use std::sync::Arc;
use std::time::Duration;

pub use self::builder::RedisBuilder;
pub use self::keys::MAX_KEY_BYTES;

use self::conn::Connection;
use self::keys::KeyLayout;
use self::resent::Resent;
use self::subscriber::Subscriber;
use super::{AcquireRequest, Acquired, Backend, Renewal};
use crate::cleanups::{Cleanups, CLEANUP_PATIENCE};
use crate::{KeyState, LockError, Owner};

/// A lock store on Redis. Clones share the connections.
///
/// See the [module documentation](self) for how locks are laid out in Redis, what each call
/// costs, and how waiters are queued and woken.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
/// use dlock::{backend::RedisBackend, LockOptions, Locker};
///
/// let backend = RedisBackend::builder("redis://127.0.0.1:6379")?.key_prefix("billing:").connect().await?;
/// assert_eq!(backend.lock_key("acct:42"), "billing:{acct:42}");
/// let locker = Locker::with_backend(backend);
/// let lease = locker.lock("acct:42", LockOptions::new()).await?;
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Connection,
    subscriber: Subscriber,
    /// This backend's id, random, in its waiters' keys: a release made here wakes the waiters
    /// of this backend itself, and the script leaves out the message to them.
    instance: String,
    /// How the names of a lock's Redis keys are made.
    layout: KeyLayout,
    liveness: Duration,
    cluster: bool,
    /// How many replicas must acknowledge a grant or a renewal before it counts (0: none asked).
    min_replicas: usize,
    /// The response timeout: `WAIT` never blocks for more than half of it.
    response_timeout: Duration,
    /// Queues left by dropped waiters: `close` waits for them.
    cleanups: Arc<Cleanups>,
    /// The acquisitions an acquire call of which was sent twice.
    resent: Resent,
}

impl Backend for RedisBackend {
    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Option<Acquired>, LockError> {
        let acquired = self.acquire_or_wait(request).await?;
        // On a cluster, any call may have been sent twice: redis-rs's cluster client sends a
        // command again by itself (after a dropped connection, a redirection) without saying
        // so, as releases and hold expiries assume too. The cost is one more write per
        // acquisition not granted, on a cluster only.
        if acquired.is_none() && (self.inner.cluster || self.was_resent(request.key, request.owner))
        {
            // Not granted, but a copy of one of its calls may still be on its way, to grant the
            // key (or queue this owner) once it lands — after the holder's release, for a full
            // ttl to nobody: undone, that copy takes no effect. An error hands the undo to the
            // caller's.
            self.release_or_leave(request.key, request.owner, true)
                .await?;
        }
        Ok(acquired)
    }

    async fn release(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
        self.release_or_leave(key, owner, false).await
    }

    /// A release that leaves the owner's cancel marker even where it finds the key granted: a
    /// copy of the acquisition sent again after a lost reply may still reach the server after
    /// this undo, and would otherwise find the key free and grant it to an owner nobody
    /// releases, for a full ttl.
    async fn undo_acquire(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
        self.release_or_leave(key, owner, true).await
    }

    /// A `PING`: a release of a key nobody holds, the default probe, would leave a cancel
    /// marker behind for a minute.
    async fn health(&self) -> Result<(), LockError> {
        self.ping().await
    }

    /// One script that reads the lock, its PTTL, its fence counter and its live waiters.
    async fn inspect(&self, key: &str) -> Result<KeyState, LockError> {
        self.inspect_key(key).await
    }

    /// `SCAN` with `MATCH` and `COUNT`, never `KEYS`; on a Redis Cluster,
    /// [`LockError::Unsupported`].
    async fn list(&self, prefix: &str) -> Result<Vec<String>, LockError> {
        self.list_keys(prefix).await
    }

    async fn force_release(&self, key: &str, owner: Owner) -> Result<Option<u64>, LockError> {
        self.force_release_key(key, owner).await
    }

    fn expires_at_a_set_time(&self) -> bool {
        true
    }

    /// The renewal script, told to set the lock's expiry exactly, sooner or later than it was.
    async fn expire_after(
        &self,
        key: &str,
        owner: Owner,
        after: Duration,
    ) -> Result<bool, LockError> {
        self.expire_lease(key, owner, after).await
    }

    /// Waits for the queues dropped waiters are leaving; the connections close when the
    /// backend is dropped.
    async fn close(&self) {
        self.inner.cleanups.done(CLEANUP_PATIENCE).await;
    }

    async fn renew(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
        let (held, error) = self.renew_judged(leases, renew::Expiry::Extend).await;
        // All or nothing: a lease not confirmed makes the whole answer an error.
        match error {
            Some(error) if held.iter().any(Option::is_none) => Err(error),
            _ => Ok(held.into_iter().map(|held| held == Some(true)).collect()),
        }
    }

    async fn renew_each(&self, leases: &[Renewal<'_>]) -> Result<Vec<Option<bool>>, LockError> {
        let (held, error) = self.renew_judged(leases, renew::Expiry::Extend).await;
        match error {
            Some(error) if held.iter().all(Option::is_none) => Err(error),
            Some(error) => {
                // A cluster's slot that failed, or renewals too few replicas acknowledged.
                tracing::warn!(%error, "distributed_lock: renewal not confirmed for part of the leases; retrying those");
                Ok(held)
            }
            None => Ok(held),
        }
    }
}

/// A lease's ttl in whole milliseconds, Redis's unit, rounded up: the client trusts a lease for
/// its ttl less a margin, so a ttl cut down to the millisecond below (1.99 ms kept as 1 ms)
/// would expire on the server while its holder still trusted it. Rounding up only keeps others
/// waiting a fraction of a millisecond longer.
fn lease_millis(ttl: Duration) -> u64 {
    millis(ttl.saturating_add(Duration::from_nanos(999_999)))
}

/// `duration` in whole milliseconds, at least 1 (a `PX` of 0 is an error).
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("prefix", &self.inner.layout.prefix())
            .finish_non_exhaustive()
    }
}
