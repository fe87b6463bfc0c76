//! The ZooKeeper store: ephemeral sequential nodes, the lock recipe of the ZooKeeper
//! documentation, with each waiter watching only its predecessor.
//!
//! # The nodes
//!
//! ```text
//! /dlock                                       the root (builder option), created if missing
//! └── acct:a%3Ab                               one persistent parent per key
//!     ├── 3f9c…e1-41-0000000007  (ephemeral)   the holder: the lowest sequence number
//!     ├── 8a02…5d-3-0000000008   (ephemeral)   a waiter, watching …07
//!     └── c7b1…90-17-0000000009  (ephemeral)   a waiter, watching …08
//! ```
//!
//! - **Parent**: named by the rendered key, with `/`, `%` and every character a znode name
//!   cannot hold (controls, `U+007F`–`U+009F`, `U+D800`–`U+F8FF`, `U+FFF0`–`U+FFFF`, and every
//!   character above `U+FFFF`, such as `🔒` or CJK Extension B: the server checks a path's
//!   UTF-16 code units and refuses surrogates) percent-encoded as UTF-8 bytes (`emoji:🔒` is
//!   `emoji:%F0%9F%94%92`), and the names `.` and `..` written `%2E` and `%2E%2E`. `%`
//!   is always an escape, so the mapping is injective: two keys never share a parent. Keys
//!   rendered by `#[distributed_lock]` are already escaped, so they appear as they are. A key
//!   whose lock node path would pass [`MAX_PATH_BYTES`] is refused with `InvalidKey`, whole.
//! - **Lock node**: `EPHEMERAL_SEQUENTIAL`, named `{owner}-{attempt}-{sequence}` and holding
//!   its holder's description, `{owner}\n{pid}\n{host}\n{label}` (an earlier dlock wrote the
//!   owner token alone, which still reads); the attempt is a number no other lock node of the process was given. The
//!   prefix in the name makes creation *protected* (Curator's term): when the reply to a create
//!   is lost with the connection, the node is found again by its prefix, so a retried or
//!   abandoned acquisition never leaves an orphan node that would block the key for as long as
//!   the session lives. The attempt keeps two nodes of one owner apart (one that queues again
//!   after its grant was withdrawn, or on a new session): the sequence restarts when an idle
//!   key's parent is deleted and made again, and a retried delete of the old node must never
//!   find the new one under the old one's name.
//! - **Queue order** is creation order: the nodes' `czxid`s (see *Fences*), not the numbers in
//!   their names. ZooKeeper numbers a child with its parent's count of child changes, a signed
//!   32-bit number: a key that stays busy through 2^31 creations and deletions sees the number
//!   go from `2147483647` to `-2147483648`, and a node created after that would sort first by
//!   its number, becoming a second holder. Comparing numbers modulo 2^32 would be right only
//!   while the live nodes span fewer than 2^31 changes, which a key held for weeks while waiters
//!   come and give up can pass. A `czxid` is a 64-bit zxid that does not wrap, and it is the
//!   fence too, so the queue order and the fence order are one by construction. The price is
//!   small: an acquirer that finds other lock nodes reads their stats once, in one `multiRead`;
//!   a node missing from that first listing was created after its own, so later wake-ups need
//!   no stats.
//!
//! # The calls
//!
//! - **Acquire**: `create` the lock node and `getChildren` of the parent, pipelined in one round
//!   trip (a session's requests are processed in order, so the list includes the new node; where
//!   the parent was seen missing, its `create` goes first in the same round trip). The oldest
//!   node holds the lock. Otherwise the waiter sets an `exists` watch on the node just
//!   ahead of its own and sleeps until that node goes, then lists again: a release wakes exactly
//!   one waiter (no herd), and waiters are served in the order their nodes were created,
//!   first come first served. A waiter whose predecessor gave up finds a new predecessor and
//!   watches it instead. `wait` is kept exactly: when it runs out the waiter deletes its node
//!   and answers busy. With `wait = 0` the parent is listed first, and a key that has any lock
//!   node is answered busy without creating one, so tries on a busy key cause no churn.
//! - **Release**: delete our node, pipelined with a delete of the parent that the server refuses
//!   (`NotEmpty`) while anyone else queues; so an idle key leaves nothing behind. An acquirer
//!   whose parent vanished between its steps gets `NoNode` on create, recreates the parent and
//!   tries again: the two never need a lock of their own. The node to delete is the one this
//!   backend created for the owner (kept in a map, owner → node), and its name carries the owner,
//!   so a release can only ever delete its own node: `Ok(false)` when it was already gone. The
//!   delete is started on the background, counted among the backend's clean-ups, before the
//!   release awaits anything, and the release waits for its answer: a caller that stops waiting
//!   (a `select!`, an aborted task, a time-out) stops only the waiting, never the delete. A
//!   second release of the owner meanwhile waits for the same delete.
//! - **Renewal**: one `multi` of version checks (any version) on every lease's node (1,000 per
//!   request, fewer where their paths are long: a request stays well under the server's
//!   `jute.maxbuffer`, whose excess drops the connection; the requests pipelined): a lease is
//!   held while its node exists on the live
//!   session. Nothing is extended on the server, because the lease *is* the session: the
//!   client's heartbeats keep the session, and the session keeps the nodes.
//! - **Confirmation through the quorum**: a server answers reads from its own copy of the data.
//!   A follower cut off from the leader goes on doing so for up to `syncLimit × tickTime`,
//!   while the leader expires the sessions it serves and grants their keys to others; a read
//!   could then confirm a lease that is gone. So whatever makes the client trust a lease is a
//!   write, which only the leader answers, once a quorum committed it: the create of the lock
//!   node when it is granted at once, a check of the node when it is granted after waiting
//!   (the listing that shows no node ahead may be stale, but only about nodes that went, never
//!   about older ones), and the renewal's checks. A `multi` rather than a `sync` before a read:
//!   a `sync` is answered by a leader that may itself have lost its quorum and not noticed yet,
//!   a committed write cannot be. The price is one transaction per renewal request (per
//!   thousand leases, or per half megabyte of their paths) in the ensemble's log, instead of a read.
//! - **Claim**: the acquisition runs on dlock's background runtime, not in the caller's future,
//!   so the queue moves on whether or not the caller is polled; a grant becomes the caller's
//!   lease when the caller's future claims it. A grant not claimed within the *claim window*
//!   ([`ZookeeperBuilder::claim_window`], 3 s by default, or the ttl where shorter) is withdrawn:
//!   its node is deleted and the next waiter gets the key. A lock node does not expire, so
//!   without this a waiter whose caller stalled (a runtime blocked by synchronous code, a future
//!   parked in a `select!` that polls it no more) would hold the key for nobody as long as the
//!   caller stays away. The caller, polled again, queues again for what is left of its wait;
//!   a lease claimed late counts from its confirmation all the same, so a grant claimed after
//!   its expiry never runs a body. Claimed or withdrawn is decided once, by whichever side
//!   settles first, and a withdrawn grant's node has one deleter: the background side.
//! - **Abandonment**: a waiter that gives up, or whose future is dropped, deletes its node at
//!   once (from the background, where the acquisition runs), so it never becomes a holder that
//!   nobody serves. A delete whose answer is lost with the connection is sent again
//!   (after 50 ms, doubling up to 1 s) until the server confirms the node gone or the session
//!   has ended, however long the session outlives the connection; so is a release's.
//!
//! # Inspecting
//!
//! - [`Locker::inspect`](crate::Locker::inspect) lists the key's parent and reads its lock
//!   nodes in one `multiRead` (as many as a request holds, the requests pipelined): the oldest
//!   node's holder, described by its data (owner, label, host, process id), its `czxid` as the
//!   fence and its `ctime` (the ensemble's clock, in milliseconds) as the time it was acquired;
//!   every node behind it is a waiter. No time left is reported
//!   ([`time_left`](crate::Holder::time_left) is `None`): the node lives as long as its session,
//!   and its ttl is counted by its holder alone. The nodes are read from the server the
//!   backend is connected to, which may lag the leader by a moment.
//! - [`Locker::list`](crate::Locker::list) lists the root's children, once, keeps those whose
//!   key (the name with its escapes undone) starts with the prefix, and lists each of those in
//!   pipelined `multiRead`s: a key is held where its parent has a lock node.
//!
//! # Fences
//!
//! A fence is the `czxid` of the lock node: the zxid of the transaction that created it. Zxids
//! are assigned by the ensemble's leader to every write, in one total order, increase
//! monotonically (across leader changes too: the epoch is the high half) and are never reused.
//! Nodes of one key are served in creation order, so each holder's node was created after every
//! earlier holder's, and fences increase per key across releases, expiries and deletions of the
//! parent. The sequence number could not serve: it counts the children of one parent, and
//! restarts at zero when an idle key's parent is deleted and created again.
//!
//! # Sessions and time
//!
//! Every node of a backend lives on its one ZooKeeper session. When the ensemble expires the
//! session (no heartbeat for the session timeout), it deletes the session's nodes: every lease
//! on it is lost at once, renewal answers `false` for all of them, and the backend opens a new
//! session for later calls. A disconnection shorter than that keeps the session, but the client
//! stops trusting a lease as soon as ttl less the safety margin has passed since the last
//! confirmation, whatever the session does: ZooKeeper's own limits are coarse (the session
//! timeout is bounded below by twice the server's tick time), the client's are not.
//!
//! That is safe only if the ensemble cannot end the session, and delete the node, while the
//! client still trusts the lease. Only the leader ends sessions, and it may start counting a
//! session's timeout *before* the request the client counts a lease from: a follower tells the
//! leader of its clients' activity only in its replies to the leader's pings (every half tick),
//! and the leader does not restart a session's count for a request a follower forwards. A
//! follower cut off just after it forwarded a confirmation leaves the leader counting from the
//! client's previous request, up to the client's idle gap (a third of the session timeout) and
//! half a tick earlier. So a lease's ttl may be at most two thirds of the granted session
//! timeout less one tick (see [`ttl_limit`](ZookeeperBackend::ttl_limit)): 18 s for the default
//! session of 30 s on ZooKeeper's default tick of 2 s. A longer ttl is refused with
//! [`LockError::InvalidOptions`] by [`Backend::acquire`] called directly — checked again when
//! an acquisition moves to a new session, which the ensemble may grant a shorter timeout — and
//! shortened to that limit by the [`Locker`](crate::Locker), which keeps the hold the caller
//! asked for:
//!
//! - A renewed lease is renewed more often, that is all: a renewal extends nothing on the
//!   server, and a crashed holder's node lives as long as its session whatever the ttl.
//! - A lease with `renew = false` is confirmed all the same, at the pace of the shorter ttl, by
//!   the same checks of its node a renewal makes (which extend nothing either), until its own
//!   ttl runs out, and no longer: `ttl = "60s", renew = false` on the default session is held
//!   for 60 s less the safety margin, not for 18 s. Without those checks the client could
//!   trust one confirmation for no longer than the limit, and would have to give up the lease
//!   at 18 s while its node still held the key.
//! - Nothing on the server ends a node when its lease's ttl runs out, so the `Locker` deletes
//!   the node of every lease with `renew = false` then (owner-checked), whether its ttl was
//!   shortened or not, and whether or not its holder still keeps the [`Lease`](crate::Lease)
//!   or runs a body under `on_lost = "continue"`: the next waiter gets the key 60 s after the
//!   grant for `ttl = "60s"`, 10 s after it for `ttl = "10s"`, as on a store that expires keys,
//!   and the holder's own release later changes nothing.
//! - A renewed lease whose renewals go unanswered (a stall the session survives) is lost by the
//!   client's reckoning, and its node is deleted the same way a ttl after its last confirmed
//!   renewal was sent, when a store that expires keys would have let it go, though its holder
//!   keeps the `Lease` or runs a body on under `on_lost = "continue"`.
//!
//! The limit is reckoned with the session timeout granted when the session was opened. A
//! session that reconnects to another server is granted that server's value, which the client
//! does not report, and the ensemble counts the session by it from then on. A server that grants less
//! would let the ensemble expire the session, and delete its nodes, while the client still
//! trusts their leases; so every server of the ensemble must grant the same session timeout
//! (the same `tickTime`, `minSessionTimeout` and `maxSessionTimeout` on all of them). Set
//! [`ZookeeperBuilder::tick_time`] to the ensemble's `tickTime` when it is not the default, and
//! raise [`ZookeeperBuilder::session_timeout`] (within the server's `maxSessionTimeout`) for
//! longer leases.
//!
//! A request the ensemble does not answer is bounded: an acquisition fails after its `wait`
//! plus the session timeout, a release after the session timeout (its delete keeps being retried
//! in the background until it is confirmed or the session ends, whether or not anyone still
//! waits for it, so the key is not blocked for good).
//!
//! # Why zookeeper-client
//!
//! `zookeeper-client` is pure Rust and async, speaks the 3.5+ protocol (`create2` returns the
//! new node's stat, so the fence comes with the create; `multi` for batched renewal; needs
//! ZooKeeper 3.6 or newer), and drives its connection on its own `async-io` reactor, so the
//! session outlives whichever tokio runtime first used the backend. Its session task is spawned
//! through the `spawns` hook, which dlock points at its own background runtime.

mod batch;
mod builder;
mod claim;
mod cleanup;
mod contend;
mod describe;
mod node;
mod operator;
mod paths;
mod queue;
mod release;
mod session;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use zookeeper_client::{Acls, CreateMode, CreateOptions, SessionId};

pub use self::builder::ZookeeperBuilder;
use self::node::confirm_nodes;
use self::paths::parent_path;
pub use self::paths::MAX_PATH_BYTES;
use self::release::Holding;
use self::session::{ends_session, safe_ttl, zk_error, Session};
pub use super::claim::DEFAULT_CLAIM_WINDOW;
use super::{AcquireRequest, Acquired, Backend, Renewal};
use crate::cleanups::{Cleanups, CLEANUP_PATIENCE};
use crate::{KeyState, LockError, Owner};

/// The root under which the per-key parents live, unless [`ZookeeperBuilder::root`] says
/// otherwise.
pub const DEFAULT_ROOT: &str = "/dlock";

/// The session timeout asked of the ensemble, unless [`ZookeeperBuilder::session_timeout`] says
/// otherwise. Leases may be as long as the timeout the ensemble grants.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(30);

/// The ensemble's tick, unless [`ZookeeperBuilder::tick_time`] says otherwise: ZooKeeper's
/// default `tickTime`. The client cannot ask the ensemble for it.
pub const DEFAULT_TICK_TIME: Duration = Duration::from_secs(2);

const PERSISTENT: CreateOptions<'static> = CreateMode::Persistent.with_acls(Acls::anyone_all());
const EPHEMERAL_SEQUENTIAL: CreateOptions<'static> =
    CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());

/// A lock store on a ZooKeeper ensemble. Clones share one session.
///
/// ```no_run
/// # async fn demo() -> Result<(), dlock::LockError> {
/// use std::time::Duration;
/// use dlock::{backend::ZookeeperBackend, Locker};
///
/// let backend = ZookeeperBackend::builder("zk://zk1:2181,zk2:2181,zk3:2181/apps/orders")?
///     .root("/locks")
///     .session_timeout(Duration::from_secs(20))
///     .connect()
///     .await?;
/// let locker = Locker::with_backend(backend);
/// // or simply: Locker::connect("zk://zk1:2181,zk2:2181,zk3:2181/apps/orders").await?
/// # Ok(()) }
/// ```
///
/// Each key is a persistent node under the root, and each acquisition an ephemeral sequential
/// node under it; the lowest holds the lock and each waiter watches only the node below its own,
/// so a release wakes one waiter and waiters are served first come, first served; a waiter that
/// does not claim the key within the [claim window](ZookeeperBuilder::claim_window) (its caller
/// stalled) is passed over. Fences are the lock nodes' creation zxids. A lease lives as long as
/// the backend's ZooKeeper session: when the ensemble expires the session, every lease on it is
/// lost and later calls open a new session.
/// Hence a lease's ttl may be at most [`ttl_limit`](Self::ttl_limit), two thirds of the session
/// timeout the ensemble granted less one tick (see the module docs for why): a
/// [`Locker`](crate::Locker) shortens a longer ttl to it, and confirms a lease with
/// `renew = false` at that pace until its own ttl runs out. Requires ZooKeeper 3.6 or newer.
///
/// Besides [`Backend`], it has an operator's view of a key, [`queue`](Self::queue) and
/// [`force_release`](Self::force_release), and a counter for tests,
/// [`watch_events`](Self::watch_events).
#[derive(Clone)]
pub struct ZookeeperBackend {
    shared: Arc<Shared>,
}

struct Shared {
    /// The connect string without the chroot: `host:port,host:port`.
    hosts: String,
    /// Chroot and root: the absolute path the per-key parents live under.
    base: String,
    /// The session timeout asked of the ensemble.
    asked_timeout: Duration,
    /// The ensemble's tick, as the builder was told.
    tick: Duration,
    /// How long a grant waits for its caller to claim it (see [`claim`]).
    claim_window: Duration,
    session: Mutex<Session>,
    /// Held while a new session is opened, so concurrent calls open one, not one each.
    reconnecting: tokio::sync::Mutex<()>,
    /// Each owner's lock node, from its grant until its release is answered.
    held: Mutex<HashMap<Owner, Holding>>,
    watch_events: AtomicU64,
    /// Deletes of nodes nobody uses any more (released ones too), retried until confirmed:
    /// `close` waits for them.
    cleanups: Arc<Cleanups>,
}

/// A lock node this backend holds a lease through.
struct Held {
    path: String,
    parent: String,
    session: SessionId,
}

impl ZookeeperBackend {
    /// Connects with the default options (root `/dlock`, session timeout 30 s), or those the
    /// URL's query sets (see [`ZookeeperBuilder`]).
    ///
    /// # Errors
    ///
    /// As [`ZookeeperBuilder::connect`], and [`LockError::InvalidUrl`] for a malformed URL.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future takes no lock and holds no key: it may be called again.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::backend::ZookeeperBackend;
    ///
    /// let backend = ZookeeperBackend::connect("zk://zk1:2181,zk2:2181,zk3:2181/apps/orders").await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<ZookeeperBackend, LockError> {
        Self::builder(url)?.connect().await
    }

    /// Options for a connection to `url`: `zk://host:port[,host:port…][/chroot][?settings]`.
    /// The chroot is created if missing; the settings are [`ZookeeperBuilder`]'s.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidUrl`] for a URL that is not `zk://`, names no host, carries user
    /// information (`user:password@`: dlock sends ZooKeeper no credentials), has a chroot or
    /// `root` that is not a ZooKeeper path, or a setting that does not parse.
    ///
    /// ```
    /// # use dlock::backend::ZookeeperBackend;
    /// let builder = ZookeeperBackend::builder("zk://zk1:2181/apps/orders?session_timeout=20s")?;
    /// assert!(ZookeeperBackend::builder("redis://zk1:2181").is_err());
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    pub fn builder(url: &str) -> Result<ZookeeperBuilder, LockError> {
        ZookeeperBuilder::from_url(url)
    }

    /// The absolute path (chroot included) the per-key parents live under.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// # let backend = dlock::backend::ZookeeperBackend::connect("zk://zk1:2181/apps").await?;
    /// assert_eq!(backend.root(), "/apps/dlock");
    /// # Ok(()) }
    /// ```
    pub fn root(&self) -> &str {
        &self.shared.base
    }

    /// The session timeout the ensemble granted the current session when it was opened. A
    /// reconnection to another server may be granted another value, which this does not show:
    /// every server of the ensemble must grant the same (see
    /// [`ZookeeperBuilder::session_timeout`]).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// # let backend = dlock::backend::ZookeeperBackend::connect("zk://zk1:2181/apps").await?;
    /// println!("session timeout: {:?}", backend.session_timeout());
    /// # Ok(()) }
    /// ```
    pub fn session_timeout(&self) -> Duration {
        self.shared.current().timeout
    }

    /// The longest ttl a lease may have on the current session: two thirds of its timeout less
    /// one tick ([`ZookeeperBuilder::tick_time`]). A [`Locker`](crate::Locker) shortens a longer
    /// ttl to this; a lease with `renew = false` is then confirmed at this pace until its own
    /// ttl runs out, so it is held for the ttl asked.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// # let backend = dlock::backend::ZookeeperBackend::connect("zk://zk1:2181/apps").await?;
    /// // 30 s asked and granted, a tick of 2 s: leases of up to 18 s.
    /// assert!(backend.ttl_limit() <= std::time::Duration::from_secs(18));
    /// # Ok(()) }
    /// ```
    pub fn ttl_limit(&self) -> Duration {
        safe_ttl(self.shared.current().timeout, self.shared.tick)
    }

    #[doc(hidden)] // A hook for tests, not part of the API.
    /// How many predecessor watches have fired: one per wake-up of a waiter by the deletion of
    /// the node below its own. A release wakes one waiter, never the whole queue.
    pub fn watch_events(&self) -> u64 {
        self.shared.watch_events.load(Ordering::Relaxed)
    }
}

impl Shared {
    fn current(&self) -> Session {
        self.session
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn held(&self) -> MutexGuard<'_, HashMap<Owner, Holding>> {
        // Nothing panics while the map is locked, and it is consistent between statements.
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn parent(&self, key: &str) -> Result<String, LockError> {
        parent_path(&self.base, key)
    }
}

impl Backend for ZookeeperBackend {
    fn ttl_limit(&self) -> Option<Duration> {
        Some(ZookeeperBackend::ttl_limit(self))
    }

    /// Deletes the holder's node, as [`ZookeeperBackend::force_release`] does, answering its
    /// fence.
    async fn force_release(&self, key: &str, owner: Owner) -> Result<Option<u64>, LockError> {
        self.evict(key, Some(owner)).await
    }

    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Option<Acquired>, LockError> {
        self.acquire_and_claim(request).await
    }

    /// The oldest lock node's holder and the nodes behind it (see "Inspecting" in the module
    /// docs).
    async fn inspect(&self, key: &str) -> Result<KeyState, LockError> {
        self.inspect_key(key).await
    }

    /// The keys whose parent has a lock node (see "Inspecting" in the module docs).
    async fn list(&self, prefix: &str) -> Result<Vec<String>, LockError> {
        self.list_keys(prefix).await
    }

    async fn release(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
        let _ = key; // the node is found by its owner
        self.release_node(owner).await
    }

    /// Reads the root's stat: one round trip to the ensemble. (The default, a release for an
    /// owner that holds nothing, is answered here without asking anyone.)
    async fn health(&self) -> Result<(), LockError> {
        let session = self.session().await?;
        match tokio::time::timeout(
            session.timeout,
            session.client.check_stat(&self.shared.base),
        )
        .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(zk_error(error)),
            Err(_) => Err(LockError::backend(format!(
                "ZooKeeper did not answer within {:?}",
                session.timeout
            ))),
        }
    }

    /// Waits for the deletes of nodes nobody uses any more; the session ends when the backend
    /// is dropped.
    async fn close(&self) {
        self.shared.cleanups.done(CLEANUP_PATIENCE).await;
    }

    async fn renew(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
        let session = self.shared.current();
        let live = !session.client.state().is_terminated();
        let paths: Vec<Option<String>> = {
            let held = self.shared.held();
            leases
                .iter()
                .map(|lease| {
                    held.get(&lease.owner)
                        .and_then(Holding::held)
                        .filter(|h| live && h.session == session.id)
                        .map(|h| h.path.clone())
                })
                .collect()
        };
        let asked: Vec<&str> = paths.iter().flatten().map(String::as_str).collect();
        if asked.is_empty() {
            return Ok(vec![false; leases.len()]);
        }
        let found = match confirm_nodes(&session.client, &asked).await {
            Ok(found) => found,
            Err(error) if ends_session(&error) => return Ok(vec![false; leases.len()]),
            Err(error) => return Err(zk_error(error)),
        };
        let mut found = found.into_iter();
        Ok(paths
            .iter()
            .map(|path| path.is_some() && found.next().unwrap_or(false))
            .collect())
    }
}
