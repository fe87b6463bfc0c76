//! The ZooKeeper store: ephemeral sequential nodes, the lock recipe of the ZooKeeper
//! documentation, with each waiter watching only its predecessor.
//!
//! # The nodes
//!
//! ```text
//! /dlock                                       the root (builder option), created if missing
//! └── acct:a%3Ab                               one persistent parent per key
//!     ├── 3f9c…e1-0000000007  (ephemeral)      the holder: the lowest sequence number
//!     ├── 8a02…5d-0000000008  (ephemeral)      a waiter, watching …07
//!     └── c7b1…90-0000000009  (ephemeral)      a waiter, watching …08
//! ```
//!
//! - **Parent**: named by the rendered key, with `/`, `%` and every character a znode name
//!   cannot hold (controls, `U+007F`–`U+009F`, `U+D800`–`U+F8FF`, `U+FFF0`–`U+FFFF`)
//!   percent-encoded as UTF-8 bytes, and the names `.` and `..` written `%2E` and `%2E%2E`. `%`
//!   is always an escape, so the mapping is injective: two keys never share a parent. Keys
//!   rendered by `#[distributed_lock]` are already escaped, so they appear as they are. A key
//!   whose lock node path would pass [`MAX_PATH_BYTES`] is refused with `InvalidKey`, whole.
//! - **Lock node**: `EPHEMERAL_SEQUENTIAL`, named `{owner}-{sequence}` and holding the owner
//!   token. The owner in the name makes creation *protected* (Curator's term): when the reply to
//!   a create is lost with the connection, the node is found again by its prefix, so a retried or
//!   abandoned acquisition never leaves an orphan node that would block the key for as long as
//!   the session lives.
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
//!   so a release can only ever delete its own node: `Ok(false)` when it was already gone.
//! - **Renewal**: one `multi` of version checks (any version) on every lease's node (1,000 per
//!   request, the requests pipelined): a lease is held while its node exists on the live
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
//!   a committed write cannot be. The price is one transaction per renewal tick (per thousand
//!   leases) in the ensemble's log, instead of a read.
//! - **Abandonment**: a waiter that gives up, or whose future is dropped, deletes its node at
//!   once (a drop guard queues the delete on dlock's background runtime), so it never becomes a
//!   holder that nobody serves.
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
//! session of 30 s on ZooKeeper's default tick of 2 s. A longer ttl is shortened to that limit
//! by the [`Locker`](crate::Locker) — which costs only more frequent renewals, since a crashed
//! holder's node lives as long as its session whatever the ttl — and refused with
//! [`LockError::InvalidOptions`] by [`Backend::acquire`] called directly. Set
//! [`ZookeeperBuilder::tick_time`] to the ensemble's `tickTime` when it is not the default, and
//! raise [`ZookeeperBuilder::session_timeout`] (within the server's `maxSessionTimeout`) for
//! longer leases.
//!
//! A request the ensemble does not answer is bounded: an acquisition fails after its `wait`
//! plus the session timeout, a release after the session timeout (its delete keeps being retried
//! in the background while the session lives, so the key is not blocked for good).
//!
//! # Why zookeeper-client
//!
//! `zookeeper-client` is pure Rust and async, speaks the 3.5+ protocol (`create2` returns the
//! new node's stat, so the fence comes with the create; `multi` for batched renewal; needs
//! ZooKeeper 3.6 or newer), and drives its connection on its own `async-io` reactor, so the
//! session outlives whichever tokio runtime first used the backend. Its session task is spawned
//! through the `spawns` hook, which dlock points at its own background runtime.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::future::{poll_fn, Future};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use zookeeper_client::{
    Acls, Client, CreateMode, CreateOptions, Error as ZkError, EventType, MultiReadResult,
    MultiWriteError, SessionId,
};

use super::{AcquireRequest, Acquired, Backend, Renewal};
use crate::{background, LockError, Owner};

/// The root under which the per-key parents live, unless [`ZookeeperBuilder::root`] says
/// otherwise.
pub const DEFAULT_ROOT: &str = "/dlock";

/// The longest lock node path dlock asks ZooKeeper for, in bytes (chroot, root, the escaped key
/// and the node's own name). The server answers a request larger than its `jute.maxbuffer` (by
/// default 1 MiB less one byte) by dropping the connection: every call in flight on the session
/// fails, and nothing says why. A lock node's create request is its path and about a hundred
/// bytes more, so a key whose path would be longer than this is refused up front with
/// [`LockError::InvalidKey`] naming the limit, and never cut to fit: two keys cut alike would be
/// one lock.
pub const MAX_PATH_BYTES: usize = 1_000_000;

/// `/{owner}-{sequence}` after the parent: 32 hex digits, and a sequence of ten digits (eleven
/// once the server's 32-bit counter wraps negative).
const LOCK_NODE_NAME_BYTES: usize = 1 + 32 + 1 + 11;

/// The session timeout asked of the ensemble, unless [`ZookeeperBuilder::session_timeout`] says
/// otherwise. Leases may be as long as the timeout the ensemble grants.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(30);

/// The ensemble's tick, unless [`ZookeeperBuilder::tick_time`] says otherwise: ZooKeeper's
/// default `tickTime`. The client cannot ask the ensemble for it.
pub const DEFAULT_TICK_TIME: Duration = Duration::from_secs(2);

/// Leases renewed by one `multi` (and nodes read by one `multiRead`); more pipeline more
/// requests.
const RENEW_CHUNK: usize = 1_000;

/// How often an acquisition recreates a parent that a concurrent release deleted before giving
/// up. Each time needs a release to slip in between two of our requests.
const PARENT_RETRIES: usize = 16;

/// How often a background delete of an unanswered release is retried.
const DELETE_RETRIES: usize = 100;

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
/// so a release wakes one waiter and waiters are served first come, first served. Fences are the
/// lock nodes' creation zxids. A lease lives as long as the backend's ZooKeeper session: when the
/// ensemble expires the session, every lease on it is lost and later calls open a new session.
/// Hence a lease's ttl may be at most [`ttl_limit`](Self::ttl_limit), two thirds of the session
/// timeout the ensemble granted less one tick (see the module docs for why): a
/// [`Locker`](crate::Locker) shortens a longer ttl to it. Requires ZooKeeper 3.6 or newer.
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
    session: Mutex<Session>,
    /// Held while a new session is opened, so concurrent calls open one, not one each.
    reconnecting: tokio::sync::Mutex<()>,
    held: Mutex<HashMap<Owner, Held>>,
    watch_events: AtomicU64,
}

/// One ZooKeeper session.
#[derive(Clone)]
struct Session {
    client: Client,
    id: SessionId,
    /// The session timeout the ensemble granted.
    timeout: Duration,
}

/// A lock node this backend holds a lease through.
struct Held {
    path: String,
    parent: String,
    session: SessionId,
}

/// Options of a [`ZookeeperBackend`], from [`ZookeeperBackend::builder`].
#[derive(Debug, Clone)]
pub struct ZookeeperBuilder {
    hosts: String,
    chroot: String,
    root: String,
    session_timeout: Duration,
    tick_time: Duration,
}

impl ZookeeperBackend {
    /// Connects with the default options (root `/dlock`, session timeout 30 s).
    pub async fn connect(url: &str) -> Result<ZookeeperBackend, LockError> {
        Self::builder(url)?.connect().await
    }

    /// Options for a connection to `url`: `zk://host:port[,host:port…][/chroot]`. The chroot is
    /// created if missing.
    pub fn builder(url: &str) -> Result<ZookeeperBuilder, LockError> {
        let invalid = |reason: &str| LockError::invalid_url(url, reason);
        let rest = url
            .strip_prefix("zk://")
            .ok_or_else(|| invalid("expected zk://host:port[,host:port][/chroot]"))?;
        let (hosts, chroot) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if hosts.is_empty() || hosts.split(',').any(str::is_empty) {
            return Err(invalid(
                "expected one or more host:port, separated by commas",
            ));
        }
        let chroot = if chroot == "/" { "" } else { chroot };
        if !chroot.is_empty() {
            check_path(chroot).map_err(|reason| invalid(&format!("chroot {reason}")))?;
        }
        Ok(ZookeeperBuilder {
            hosts: hosts.to_owned(),
            chroot: chroot.to_owned(),
            root: DEFAULT_ROOT.to_owned(),
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            tick_time: DEFAULT_TICK_TIME,
        })
    }

    /// The absolute path (chroot included) the per-key parents live under.
    pub fn root(&self) -> &str {
        &self.shared.base
    }

    /// The session timeout the ensemble granted the current session.
    pub fn session_timeout(&self) -> Duration {
        self.shared.current().timeout
    }

    /// The longest ttl a lease may have on the current session: two thirds of its timeout less
    /// one tick ([`ZookeeperBuilder::tick_time`]). A [`Locker`](crate::Locker) shortens a longer
    /// ttl to this.
    pub fn ttl_limit(&self) -> Duration {
        safe_ttl(self.shared.current().timeout, self.shared.tick)
    }

    /// How many predecessor watches have fired: one per wake-up of a waiter by the deletion of
    /// the node below its own. A release wakes one waiter, never the whole queue.
    pub fn watch_events(&self) -> u64 {
        self.shared.watch_events.load(Ordering::Relaxed)
    }

    /// The lock nodes of `key` in queue order, the holder first, as `{owner}-{sequence}`. Empty
    /// when nobody holds or waits for the key.
    pub async fn queue(&self, key: &str) -> Result<Vec<String>, LockError> {
        let parent = self.shared.parent(key)?;
        let session = self.session().await?;
        queue_in_creation_order(&session.client, &parent)
            .await
            .map_err(zk_error)
    }

    /// Deletes the node of `key`'s holder, whoever it is, as an operator's `delete` in `zkCli`
    /// would: the holder sees the loss at its next renewal, and the next waiter gets the key.
    /// Returns whether the key was held.
    pub async fn force_release(&self, key: &str) -> Result<bool, LockError> {
        let parent = self.shared.parent(key)?;
        let session = self.session().await?;
        let queue = queue_in_creation_order(&session.client, &parent)
            .await
            .map_err(zk_error)?;
        let Some(holder) = queue.into_iter().next() else {
            return Ok(false);
        };
        match session
            .client
            .delete(&format!("{parent}/{holder}"), None)
            .await
        {
            Ok(()) => Ok(true),
            Err(ZkError::NoNode) => Ok(false),
            Err(error) => Err(zk_error(error)),
        }
    }

    /// The live session, opening a new one if the current one ended.
    async fn session(&self) -> Result<Session, LockError> {
        let current = self.shared.current();
        if !current.client.state().is_terminated() {
            return Ok(current);
        }
        let _one = self.shared.reconnecting.lock().await;
        let current = self.shared.current();
        if !current.client.state().is_terminated() {
            return Ok(current);
        }
        let fresh = open(&self.shared.hosts, self.shared.asked_timeout).await?;
        tracing::warn!(
            old = %current.id,
            new = %fresh.id,
            "distributed_lock: ZooKeeper session ended; its leases are lost; opened a new session"
        );
        // Nodes of the old session went with it: nothing of them is held any more.
        self.shared
            .held()
            .retain(|_, held| held.session != current.id);
        *self
            .shared
            .session
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = fresh.clone();
        Ok(fresh)
    }

    async fn acquire_on(
        &self,
        mut session: Session,
        request: &AcquireRequest<'_>,
        parent: String,
    ) -> Result<Option<Acquired>, LockError> {
        let now = Instant::now();
        // A wait too long to add is a wait without end.
        let deadline = now
            .checked_add(request.wait)
            .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600));
        let mut retried = false;
        let mut parent_missing = false;
        if request.wait.is_zero() {
            // A try that is sure to fail creates nothing: no churn of nodes and watches on a
            // busy key.
            loop {
                match session.client.list_children(&parent).await {
                    Ok(children) if children.iter().any(|c| sequence(c).is_some()) => {
                        return Ok(None)
                    }
                    Ok(_) => break,
                    Err(ZkError::NoNode) => {
                        parent_missing = true;
                        break;
                    }
                    Err(error) if !retried && is_retryable(&error) => {
                        retried = true;
                        session = self.session().await?;
                    }
                    Err(error) => return Err(zk_error(error)),
                }
            }
        }
        let mut node = LockNode::new(&session, parent, request.owner);
        node.parent_missing = parent_missing;
        loop {
            match self.contend(&mut node, request.owner, deadline).await {
                Ok(acquired) => return Ok(acquired),
                Err(error) if !retried && is_retryable(&error) => {
                    retried = true;
                    let fresh = self.session().await?;
                    if fresh.id != node.session {
                        // Our node, if any, went with the old session.
                        node.disarm();
                        node = LockNode::new(&fresh, node.parent.clone(), request.owner);
                    }
                }
                Err(error) => return Err(zk_error(error)),
            }
        }
    }

    /// Creates `node` if it does not exist yet and waits, watching its predecessor, until it is
    /// the lowest (granted) or `deadline` passes (`None`, the node deleted).
    async fn contend(
        &self,
        node: &mut LockNode,
        owner: Owner,
        deadline: Instant,
    ) -> Result<Option<Acquired>, ZkError> {
        let client = node.client.clone();
        // A listing that came with the create, and the create's send time: the create was a
        // write, so its success confirms the session and the node through the quorum.
        let mut listed: Option<(Vec<String>, Instant)> = None;
        let mut parents_made = 0;
        loop {
            if node.name.is_none() && node.in_flight {
                // A create whose reply was lost may have landed: find it by its owner prefix.
                let children = list_or_empty(&client, &node.parent).await?;
                if let Some(name) = children.iter().find(|c| node.is_ours(c)) {
                    let path = format!("{}/{name}", node.parent);
                    if let Some(stat) = client.check_stat(&path).await? {
                        node.adopt(name.clone(), stat.czxid);
                    }
                }
                node.in_flight = false;
            }
            if node.name.is_none() {
                node.in_flight = true;
                let sent_at = Instant::now();
                // Pipelined, one round trip: the session's requests are served in order, so the
                // create finds the parent made just before it (when it was seen missing), and
                // the list includes the node the create makes.
                let make_parent = node
                    .parent_missing
                    .then(|| client.create(&node.parent, &[], &PERSISTENT));
                let create =
                    client.create(&node.prefix, node.data.as_bytes(), &EPHEMERAL_SEQUENTIAL);
                let list = client.list_children(&node.parent);
                let make_parent = async move {
                    match make_parent {
                        Some(made) => made.await.map(drop),
                        None => Ok(()),
                    }
                };
                let (made, created, children) = tokio::join!(make_parent, create, list);
                match created {
                    Ok((stat, sequence)) => {
                        node.adopt(format!("{}{sequence}", node.own_prefix), stat.czxid);
                        listed = Some((children?, sent_at));
                    }
                    Err(ZkError::NoNode) if parents_made < PARENT_RETRIES => {
                        // The parent is missing, or a release deleted it between our steps.
                        node.in_flight = false;
                        parents_made += 1;
                        if node.parent_missing && matches!(made, Err(ZkError::NoNode)) {
                            // The root itself is gone.
                            client.mkdir(&node.parent, &PERSISTENT).await?;
                        }
                        node.parent_missing = true;
                        continue;
                    }
                    Err(ZkError::NoNode) => {
                        node.in_flight = false;
                        return Err(ZkError::UnexpectedError(format!(
                            "the parent {} kept vanishing",
                            node.parent
                        )));
                    }
                    Err(error) => return Err(error),
                }
            }
            let (children, confirmed_at) = match listed.take() {
                Some((children, sent_at)) => (children, Some(sent_at)),
                None => (list_or_empty(&client, &node.parent).await?, None),
            };
            if !children.iter().any(|name| node.is(name)) {
                // Deleted from outside (an operator, or a forced release of a waiter).
                node.name = None;
                if Instant::now() >= deadline {
                    node.disarm();
                    return Ok(None);
                }
                continue;
            }
            let ahead = node.still_ahead(&children).await?;
            if ahead.is_empty() {
                // No node is ahead any more, and none can come ahead: that holds whoever served
                // the listing. Whether our node and session still live is the leader's word,
                // which a server cut off from it would answer from a stale copy: unless the
                // create just confirmed it, a write does.
                let valid_from = match confirmed_at {
                    Some(sent_at) => sent_at,
                    None => {
                        let sent_at = Instant::now();
                        let path = format!(
                            "{}/{}",
                            node.parent,
                            node.name.as_deref().unwrap_or_default()
                        );
                        if !confirm_nodes(&client, &[path.as_str()]).await?[0] {
                            node.name = None;
                            continue;
                        }
                        sent_at
                    }
                };
                let path = node.grant();
                let fence = u64::try_from(node.fence).unwrap_or(0);
                self.shared.held().insert(
                    owner,
                    Held {
                        path,
                        parent: node.parent.clone(),
                        session: node.session,
                    },
                );
                return Ok(Some(Acquired { fence, valid_from }));
            }
            if Instant::now() >= deadline {
                node.remove().await;
                return Ok(None);
            }
            let (_, just_ahead) = &ahead[ahead.len() - 1];
            let predecessor = format!("{}/{just_ahead}", node.parent);
            let (stat, watcher) = client.check_and_watch_stat(&predecessor).await?;
            if stat.is_none() {
                // Gone between the list and the watch: list again.
                continue;
            }
            tokio::select! {
                event = watcher.changed() => {
                    if event.event_type == EventType::NodeDeleted {
                        self.shared.watch_events.fetch_add(1, Ordering::Relaxed);
                    }
                    // A session event ends the session's requests: the next one says so.
                }
                () = tokio::time::sleep_until(deadline.into()) => {}
            }
        }
    }

    fn check_ttl(&self, ttl: Duration, session: &Session) -> Result<(), LockError> {
        let limit = safe_ttl(session.timeout, self.shared.tick);
        if limit < MIN_TTL {
            return Err(LockError::InvalidOptions {
                reason: format!(
                    "the ZooKeeper session timeout of {:?} (asked {:?}) leaves no safe ttl with a                      tick of {:?}: a lease may last at most two thirds of the session timeout less                      a tick; raise the session timeout with `ZookeeperBuilder::session_timeout`                      (within the server's maxSessionTimeout), or set `ZookeeperBuilder::tick_time`                      to the ensemble's tickTime",
                    session.timeout, self.shared.asked_timeout, self.shared.tick
                ),
            });
        }
        if ttl > limit {
            return Err(LockError::InvalidOptions {
                reason: format!(
                    "ttl {ttl:?} is longer than {limit:?}, two thirds of the ZooKeeper session                      timeout of {:?} (asked {:?}) less a tick of {:?}: the leader could expire                      the session, and delete the lock node, while the client still trusts the                      lease; lower the ttl, or raise the session timeout with                      `ZookeeperBuilder::session_timeout` (within the server's maxSessionTimeout)",
                    session.timeout, self.shared.asked_timeout, self.shared.tick
                ),
            });
        }
        Ok(())
    }
}

/// The longest ttl that is safe on a session of `timeout` granted by an ensemble ticking every
/// `tick`: two thirds of the timeout, less one tick.
///
/// The client trusts a lease until ttl (less its safety margin) after it *sent* the request that
/// confirmed it, at `t`. The leader ends the session a session timeout after it last heard of
/// it, and a follower's clients it hears of only in the follower's ping replies: every half
/// tick, the follower lists the sessions that sent anything since its previous reply. A request
/// the follower forwards — the confirmation itself — does not restart the leader's count. Cut
/// off just after it forwarded the confirmation, a follower may never report it; the last
/// report then came at most half a tick before the cut, and covered the session's latest
/// request before it. The client sends something at least every third of the session timeout
/// (the Java client pings after that long idle; zookeeper-client sooner, and renewals come every
/// ttl/3 ≤ that), so that request was sent at most a third of the timeout before the last report.
/// Hence the leader may count from `t − timeout/3 − tick/2` and end the session at
/// `t + 2·timeout/3 − tick/2`; the leader's rounding of expiries up to a whole tick only ends it
/// later. A ttl of `2·timeout/3 − tick` leaves the ping rounds, paced by the leader's loop and
/// delayed in flight, another half tick, and keeps the client's safety margin for what it is
/// for: drift between the clocks and replies in flight.
fn safe_ttl(timeout: Duration, tick: Duration) -> Duration {
    (timeout * 2 / 3).saturating_sub(tick)
}

/// Below this the runtime refuses a ttl anyway.
const MIN_TTL: Duration = Duration::from_millis(1);

impl Shared {
    fn current(&self) -> Session {
        self.session
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn held(&self) -> MutexGuard<'_, HashMap<Owner, Held>> {
        // Nothing panics while the map is locked, and it is consistent between statements.
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn parent(&self, key: &str) -> Result<String, LockError> {
        parent_path(&self.base, key)
    }
}

impl ZookeeperBuilder {
    /// The path under which the per-key parents live (default `/dlock`), below the URL's chroot.
    /// Created if missing.
    pub fn root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into();
        self
    }

    /// The session timeout to ask of the ensemble (default 30 s). The ensemble grants a value
    /// within its `minSessionTimeout` and `maxSessionTimeout` (by default 2 and 20 tick times);
    /// a lease's ttl may be at most two thirds of the granted value less a tick (see
    /// [`ZookeeperBackend::ttl_limit`]).
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// The ensemble's `tickTime` (default 2 s, ZooKeeper's default): the client cannot ask the
    /// ensemble for it, and it enters the longest safe ttl
    /// ([`ZookeeperBackend::ttl_limit`]). A value larger than the real tick only shortens the
    /// leases; a smaller one makes them unsafe.
    pub fn tick_time(mut self, tick: Duration) -> Self {
        self.tick_time = tick;
        self
    }

    /// Opens the session (so an unreachable ensemble is reported here) and creates the root.
    pub async fn connect(self) -> Result<ZookeeperBackend, LockError> {
        check_path(&self.root).map_err(|reason| LockError::InvalidOptions {
            reason: format!("root {reason}"),
        })?;
        let base = format!("{}{}", self.chroot, self.root);
        let session = open(&self.hosts, self.session_timeout).await?;
        session
            .client
            .mkdir(&base, &PERSISTENT)
            .await
            .map_err(|error| {
                LockError::backend(format!("cannot create ZooKeeper node {base}: {error}"))
            })?;
        Ok(ZookeeperBackend {
            shared: Arc::new(Shared {
                hosts: self.hosts,
                base,
                asked_timeout: self.session_timeout,
                tick: self.tick_time,
                session: Mutex::new(session),
                reconnecting: tokio::sync::Mutex::new(()),
                held: Mutex::default(),
                watch_events: AtomicU64::new(0),
            }),
        })
    }
}

impl Backend for ZookeeperBackend {
    fn ttl_limit(&self) -> Option<Duration> {
        Some(ZookeeperBackend::ttl_limit(self))
    }

    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Option<Acquired>, LockError> {
        let parent = self.shared.parent(request.key)?;
        let session = self.session().await?;
        self.check_ttl(request.ttl, &session)?;
        let limit = request.wait.saturating_add(session.timeout);
        match tokio::time::timeout(limit, self.acquire_on(session, request, parent)).await {
            Ok(acquired) => acquired,
            // The node guard of the dropped attempt deletes whatever it created.
            Err(_) => Err(LockError::backend(format!(
                "ZooKeeper did not answer within {limit:?}"
            ))),
        }
    }

    async fn release(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
        let _ = key; // the node is found by its owner
        let Some(held) = self.shared.held().remove(&owner) else {
            return Ok(false);
        };
        let session = self.shared.current();
        if session.id != held.session || session.client.state().is_terminated() {
            // The node went with its session.
            return Ok(false);
        }
        let deleted = tokio::time::timeout(
            session.timeout,
            delete_node(&session.client, &held.path, &held.parent),
        )
        .await;
        let error = match deleted {
            Ok(Ok(existed)) => return Ok(existed),
            Ok(Err(error)) if ends_session(&error) => return Ok(false),
            Ok(Err(error)) => zk_error(error),
            Err(_) => LockError::backend(format!(
                "ZooKeeper did not answer a release within {:?}",
                session.timeout
            )),
        };
        // A node left behind would block the key for as long as the session lives.
        background::spawn(delete_until_gone(session.client, held.path, held.parent));
        Err(error)
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

/// The lock node of one acquisition in progress. Dropped before it was granted (the waiter
/// gave up or its future was dropped), it deletes the node at once, from the background.
struct LockNode {
    client: Client,
    session: SessionId,
    parent: String,
    /// `{owner}-`: the start of the node's name.
    own_prefix: String,
    /// `{parent}/{owner}-`: what the sequential create is given.
    prefix: String,
    /// The owner token, the node's data.
    data: String,
    /// The node's name, once created.
    name: Option<String>,
    fence: i64,
    /// The lock nodes created before this one that were still there at the last listing, oldest
    /// first, with their `czxid`s; `None` until a listing after the create was read.
    ahead: Option<Vec<(i64, String)>>,
    /// A create was sent whose answer has not been seen.
    in_flight: bool,
    /// The parent was seen missing: the create is preceded by one of the parent.
    parent_missing: bool,
    armed: bool,
}

impl LockNode {
    fn new(session: &Session, parent: String, owner: Owner) -> Self {
        let own_prefix = format!("{owner}-");
        LockNode {
            client: session.client.clone(),
            session: session.id,
            prefix: format!("{parent}/{own_prefix}"),
            parent,
            own_prefix,
            data: owner.to_string(),
            name: None,
            fence: 0,
            ahead: None,
            in_flight: false,
            parent_missing: false,
            armed: true,
        }
    }

    fn is_ours(&self, name: &str) -> bool {
        name.starts_with(&self.own_prefix) && sequence(name).is_some()
    }

    fn is(&self, name: &str) -> bool {
        self.name.as_deref() == Some(name)
    }

    fn adopt(&mut self, name: String, czxid: i64) {
        self.name = Some(name);
        self.fence = czxid;
        self.ahead = None;
        self.in_flight = false;
    }

    /// The nodes still ahead of this one, oldest first, from `children`: a listing read after
    /// this node was created. The first such listing holds every older node still there, so
    /// their ages are read then, once; a node missing from it is younger than this one, so
    /// later listings only drop the nodes that went.
    async fn still_ahead(&mut self, children: &[String]) -> Result<Vec<(i64, String)>, ZkError> {
        let ahead = match self.ahead.take() {
            Some(mut ahead) => {
                ahead.retain(|(_, name)| children.contains(name));
                ahead
            }
            None => {
                let others: Vec<String> = children
                    .iter()
                    .filter(|name| sequence(name).is_some() && !self.is(name))
                    .cloned()
                    .collect();
                let mut ahead: Vec<(i64, String)> =
                    creation_zxids(&self.client, &self.parent, others)
                        .await?
                        .into_iter()
                        .filter(|(czxid, _)| *czxid < self.fence)
                        .collect();
                ahead.sort_unstable();
                ahead
            }
        };
        self.ahead = Some(ahead.clone());
        Ok(ahead)
    }

    /// The node is the holder's now: the guard lets it be. Returns its path.
    fn grant(&mut self) -> String {
        self.armed = false;
        format!(
            "{}/{}",
            self.parent,
            self.name.as_deref().unwrap_or_default()
        )
    }

    fn disarm(&mut self) {
        self.armed = false;
    }

    /// Deletes the node now; if that fails, dropping the guard tries again from the background.
    async fn remove(&mut self) {
        let Some(name) = &self.name else {
            return;
        };
        let path = format!("{}/{name}", self.parent);
        match delete_node(&self.client, &path, &self.parent).await {
            Ok(_) => self.armed = false,
            Err(error) if ends_session(&error) => self.armed = false,
            Err(error) => {
                tracing::debug!(%path, %error, "distributed_lock: deleting an abandoned ZooKeeper node failed; retrying");
            }
        }
    }
}

impl Drop for LockNode {
    fn drop(&mut self) {
        if !self.armed || (self.name.is_none() && !self.in_flight) {
            return;
        }
        let client = self.client.clone();
        let parent = self.parent.clone();
        let own_prefix = self.own_prefix.clone();
        let name = self.name.clone();
        background::spawn(async move {
            if let Some(name) = name {
                let _ = delete_node(&client, &format!("{parent}/{name}"), &parent).await;
                return;
            }
            // The create's answer was never seen: find the node by its owner prefix. The list is
            // served after the create, which was sent first on the same session.
            let Ok(children) = client.list_children(&parent).await else {
                return;
            };
            for name in children.iter().filter(|c| c.starts_with(&own_prefix)) {
                let _ = delete_node(&client, &format!("{parent}/{name}"), &parent).await;
            }
        });
    }
}

/// Whether each node of `paths` exists, in the leader's word: a `multi` of version checks (any
/// version), one per thousand nodes, the requests pipelined. A `multi` is a write, so its
/// answer is the leader's, committed by a quorum, never a stale copy's: a server cut off from
/// the leader cannot answer it, which leaves the leases unconfirmed until the client's own
/// deadline. A `multi` fails whole when one check fails and names that check: the node is
/// gone, and the rest are checked again without it.
async fn confirm_nodes(client: &Client, paths: &[&str]) -> Result<Vec<bool>, ZkError> {
    let mut found = vec![true; paths.len()];
    let mut pending: Vec<Vec<usize>> = (0..paths.len())
        .collect::<Vec<_>>()
        .chunks(RENEW_CHUNK)
        .map(<[usize]>::to_vec)
        .collect();
    while !pending.is_empty() {
        let mut commits = Vec::with_capacity(pending.len());
        for chunk in &pending {
            let mut writer = client.new_multi_writer();
            for &i in chunk {
                writer.add_check_version(paths[i], -1)?;
            }
            commits.push(writer.commit());
        }
        // Every request is sent before any answer is awaited: one round trip in all.
        let mut again = Vec::new();
        for (chunk, commit) in pending.iter().zip(commits) {
            match commit.await {
                Ok(_) => {}
                Err(MultiWriteError::OperationFailed {
                    index,
                    source: ZkError::NoNode | ZkError::BadVersion,
                }) => {
                    found[chunk[index]] = false;
                    let rest: Vec<usize> = chunk
                        .iter()
                        .copied()
                        .filter(|&i| i != chunk[index])
                        .collect();
                    if !rest.is_empty() {
                        again.push(rest);
                    }
                }
                Err(MultiWriteError::OperationFailed { source, .. }) => return Err(source),
                Err(MultiWriteError::RequestFailed { source }) => return Err(source),
            }
        }
        pending = again;
    }
    Ok(found)
}

/// Deletes the lock node at `path` and, pipelined after it, its `parent` if that is left empty
/// (the server refuses with `NotEmpty` otherwise). Returns whether the node existed.
async fn delete_node(client: &Client, path: &str, parent: &str) -> Result<bool, ZkError> {
    let node = client.delete(path, None);
    let tidy = client.delete(parent, None);
    let (node, _) = tokio::join!(node, tidy);
    match node {
        Ok(()) => Ok(true),
        Err(ZkError::NoNode) => Ok(false),
        Err(error) => Err(error),
    }
}

/// Retries the delete of a release whose answer was lost, while the session lives.
async fn delete_until_gone(client: Client, path: String, parent: String) {
    for _ in 0..DELETE_RETRIES {
        match delete_node(&client, &path, &parent).await {
            Ok(_) => return,
            Err(error) if ends_session(&error) => return,
            Err(ZkError::ConnectionLoss) => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(error) => {
                tracing::warn!(%path, %error, "distributed_lock: cannot delete a released ZooKeeper node; it stays until the session ends");
                return;
            }
        }
    }
}

async fn list_or_empty(client: &Client, parent: &str) -> Result<Vec<String>, ZkError> {
    match client.list_children(parent).await {
        Ok(children) => Ok(children),
        Err(ZkError::NoNode) => Ok(Vec::new()),
        Err(error) => Err(error),
    }
}

/// Opens a session on `hosts`, asking for `timeout`.
async fn open(hosts: &str, timeout: Duration) -> Result<Session, LockError> {
    let connect = Client::connector()
        .with_session_timeout(timeout)
        // Report an unreachable ensemble once every host was tried, not after a session
        // timeout of retries. (Reconnection within a session retries as long as it lives.)
        .with_fail_eagerly()
        .connect(hosts);
    let client = with_spawner(connect).await.map_err(|error| {
        LockError::backend(format!("cannot connect to ZooKeeper at {hosts}: {error}"))
    })?;
    Ok(Session {
        id: client.session_id(),
        timeout: client.session_timeout(),
        client,
    })
}

/// Starts the tasks zookeeper-client spawns (its session task, spawned by `connect`) on dlock's
/// background runtime, so a session outlives the runtime of whichever caller opened it.
struct BackgroundSpawner;

impl spawns_core::Spawn for BackgroundSpawner {
    fn spawn(&self, task: spawns_core::Task) {
        drop(background::handle().spawn(Box::into_pin(task.future)));
    }
}

static SPAWNER: BackgroundSpawner = BackgroundSpawner;

/// Polls `future` with [`BackgroundSpawner`] as the thread's spawner.
async fn with_spawner<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    poll_fn(|cx| {
        let _scope = spawns_core::enter(&SPAWNER);
        future.as_mut().poll(cx)
    })
    .await
}

/// The lock nodes under `parent`, in creation order (the holder first); empty when there is no
/// parent.
async fn queue_in_creation_order(client: &Client, parent: &str) -> Result<Vec<String>, ZkError> {
    let children = list_or_empty(client, parent).await?;
    Ok(creation_order(
        creation_zxids(client, parent, children).await?,
    ))
}

/// The `czxid` of each lock node among `children` of `parent`, read in one `multiRead` per
/// thousand nodes, the requests pipelined. Other names, and nodes gone since the listing, are
/// left out.
async fn creation_zxids(
    client: &Client,
    parent: &str,
    children: Vec<String>,
) -> Result<Vec<(i64, String)>, ZkError> {
    let names: Vec<String> = children
        .into_iter()
        .filter(|name| sequence(name).is_some())
        .collect();
    let mut reads = Vec::new();
    for chunk in names.chunks(RENEW_CHUNK) {
        let mut reader = client.new_multi_reader();
        for name in chunk {
            reader.add_get_data(&format!("{parent}/{name}"))?;
        }
        reads.push(reader.commit());
    }
    let mut found = Vec::with_capacity(names.len());
    let mut names = names.into_iter();
    for read in reads {
        for result in read.await? {
            let name = names.next().unwrap_or_default();
            if let MultiReadResult::Data { stat, .. } = result {
                found.push((stat.czxid, name));
            }
        }
    }
    Ok(found)
}

/// Lock nodes with their `czxid`s, in creation order; other names are left out. The numbers in
/// the names play no part: they wrap (see the module docs).
fn creation_order(nodes: Vec<(i64, String)>) -> Vec<String> {
    let mut nodes: Vec<(i64, String)> = nodes
        .into_iter()
        .filter(|(_, name)| sequence(name).is_some())
        .collect();
    nodes.sort_unstable();
    nodes.into_iter().map(|(_, name)| name).collect()
}

/// The number in a lock node's name, `{owner}-{number}`, where ZooKeeper wrote the number as
/// Java's `%010d` of its signed counter: ten digits, or a minus sign and ten digits (or
/// `-000000001`) once the counter wrapped. `None` for names of another shape. Only says whether
/// a child is a lock node: the queue is ordered by creation, not by this number.
fn sequence(name: &str) -> Option<i64> {
    let digits_at = name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (head, digits) = name.split_at(digits_at);
    let (owner, number) = match head.strip_suffix("--") {
        Some(owner) => (owner, &name[digits_at - 1..]),
        None => (head.strip_suffix('-')?, digits),
    };
    if owner.is_empty() || owner.ends_with('-') || digits.is_empty() || number.len() < 10 {
        return None;
    }
    number.parse().ok()
}

/// The path of `key`'s parent under `base`, or [`LockError::InvalidKey`] when the lock nodes
/// under it would be longer than [`MAX_PATH_BYTES`].
fn parent_path(base: &str, key: &str) -> Result<String, LockError> {
    parent_path_within(base, key, MAX_PATH_BYTES)
}

fn parent_path_within(base: &str, key: &str, max_path_bytes: usize) -> Result<String, LockError> {
    let parent = format!("{base}/{}", node_name(key)?);
    let len = parent.len() + LOCK_NODE_NAME_BYTES;
    if len > max_path_bytes {
        return Err(LockError::InvalidKey {
            key: key.to_owned(),
            reason: format!(
                "its ZooKeeper lock node path would be {len} bytes, longer than the \
                 {max_path_bytes} dlock sends (the server's jute.maxbuffer, 1 MiB by default, \
                 caps a whole request)"
            ),
        });
    }
    Ok(parent)
}

/// The parent's name for `key`: the key with `/`, `%` and what a znode name cannot hold
/// percent-encoded, and `.` / `..` escaped.
fn node_name(key: &str) -> Result<String, LockError> {
    if key.is_empty() {
        return Err(LockError::InvalidKey {
            key: String::new(),
            reason: "an empty key cannot name a ZooKeeper node".into(),
        });
    }
    let mut name = String::with_capacity(key.len());
    for c in key.chars() {
        if c == '/' || c == '%' || !allowed_in_znode(c) {
            let mut bytes = [0; 4];
            for byte in c.encode_utf8(&mut bytes).bytes() {
                let _ = write!(name, "%{byte:02X}");
            }
        } else {
            name.push(c);
        }
    }
    if name == "." || name == ".." {
        name = name.replace('.', "%2E");
    }
    Ok(name)
}

/// Whether ZooKeeper accepts `c` in a node name (its `PathUtils.validatePath`).
fn allowed_in_znode(c: char) -> bool {
    let c = u32::from(c);
    ![
        0x0000..=0x001f,
        0x007f..=0x009f,
        0xd800..=0xf8ff,
        0xfff0..=0xffff,
    ]
    .iter()
    .any(|range| range.contains(&c))
}

/// Checks an absolute node path given as an option: `/a/b`, no empty, `.` or `..` segment, no
/// trailing `/`, no character ZooKeeper refuses.
fn check_path(path: &str) -> Result<(), String> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err(format!("`{path}` must start with `/`"));
    };
    for segment in rest.split('/') {
        if segment.is_empty() || segment == "." || segment == ".." {
            return Err(format!(
                "`{path}` must be `/`-separated names, none empty, `.` or `..`"
            ));
        }
        if !segment.chars().all(allowed_in_znode) {
            return Err(format!("`{path}` has a character ZooKeeper refuses"));
        }
    }
    Ok(())
}

/// Errors after which the session can serve no request: its nodes are gone.
fn ends_session(error: &ZkError) -> bool {
    matches!(
        error,
        ZkError::SessionExpired
            | ZkError::SessionMoved
            | ZkError::ClientClosed
            | ZkError::AuthFailed
    )
}

/// Errors a second try may not meet: a lost connection (the client reconnects by itself) or an
/// ended session (the backend opens a new one).
fn is_retryable(error: &ZkError) -> bool {
    matches!(error, ZkError::ConnectionLoss) || ends_session(error)
}

fn zk_error(error: ZkError) -> LockError {
    LockError::backend(format!("ZooKeeper: {error}"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::{
        check_path, creation_order, node_name, parent_path, parent_path_within, safe_ttl, sequence,
        ZookeeperBackend, MAX_PATH_BYTES,
    };
    use crate::LockError;

    #[test]
    fn the_safe_ttl_is_two_thirds_of_the_session_less_a_tick() {
        let s = Duration::from_secs;
        assert_eq!(safe_ttl(s(30), s(2)), s(18));
        assert_eq!(
            safe_ttl(s(6), Duration::from_millis(500)),
            Duration::from_millis(3500)
        );
        assert_eq!(safe_ttl(s(3), s(2)), Duration::ZERO);
    }

    #[test]
    fn the_path_limit_is_exact() {
        // "/dlock" + "/" + key + "/" + 32 + "-" + 11 bytes.
        let longest = MAX_PATH_BYTES - 6 - 1 - 45;
        assert!(parent_path("/dlock", &"k".repeat(longest)).is_ok());
        let error = parent_path("/dlock", &"k".repeat(longest + 1)).unwrap_err();
        assert!(
            matches!(&error, LockError::InvalidKey { reason, .. }
                if reason.contains("1000001 bytes") && reason.contains("1000000")),
            "{error}"
        );
        // The limit counts the escaped name: `/` becomes `%2F`.
        let slashes = "/".repeat(longest / 3);
        assert!(parent_path("/dlock", &format!("{slashes}{}", "k".repeat(longest % 3))).is_ok());
        assert!(parent_path("/dlock", &format!("{slashes}/")).is_err());
    }

    #[test]
    fn node_names_escape_what_a_znode_cannot_hold() {
        assert_eq!(node_name("acct:a%3Ab").unwrap(), "acct:a%253Ab");
        assert_eq!(node_name("a/b").unwrap(), "a%2Fb");
        assert_eq!(node_name(".").unwrap(), "%2E");
        assert_eq!(node_name("..").unwrap(), "%2E%2E");
        assert_eq!(node_name("...").unwrap(), "...");
        assert_eq!(node_name("tab\there").unwrap(), "tab%09here");
        assert_eq!(node_name("\u{fff0}").unwrap(), "%EF%BF%B0");
        assert_eq!(node_name("zookeeper").unwrap(), "zookeeper");
        assert_eq!(node_name("ключ").unwrap(), "ключ");
        assert!(node_name("").is_err());
        // Injective: `%` is always an escape.
        assert_ne!(node_name("a/b").unwrap(), node_name("a%2Fb").unwrap());
        assert_ne!(node_name(".").unwrap(), node_name("%2E").unwrap());
    }

    #[test]
    fn the_queue_is_in_creation_order_and_skips_foreign_nodes() {
        let nodes = vec![
            (12, "b-0000000010".to_owned()),
            (11, "a-0000000009".to_owned()),
            (5, "readme".to_owned()),
            (13, "c-2147483648000".to_owned()),
            (1, "-0000000001".to_owned()),
        ];
        assert_eq!(
            creation_order(nodes),
            vec!["a-0000000009", "b-0000000010", "c-2147483648000"]
        );
        assert_eq!(sequence("x-y-0000000003"), Some(3));
        assert_eq!(sequence("x-003"), None);
    }

    /// Around the counter's wrap the numbers in the names fall from the largest to the smallest
    /// while the nodes keep being created in order: the queue follows the creation zxids, so
    /// the node created before the wrap stays first, and one whose number is `-1` is not lost.
    #[test]
    fn the_queue_keeps_creation_order_across_the_counter_wrap() {
        let czxid = |n: i64| 0x0000_0007_0000_0000 + n;
        let nodes = vec![
            (czxid(4), "e--000000001".to_owned()),
            (czxid(3), "d--2147483647".to_owned()),
            (czxid(1), "b-2147483647".to_owned()),
            (czxid(0), "a-2147483646".to_owned()),
            (czxid(2), "c--2147483648".to_owned()),
            (czxid(5), "f-0000000000".to_owned()),
        ];
        assert_eq!(
            creation_order(nodes),
            vec![
                "a-2147483646",
                "b-2147483647",
                "c--2147483648",
                "d--2147483647",
                "e--000000001",
                "f-0000000000"
            ]
        );
    }

    /// ZooKeeper writes a lock node's number as Java's `%010d` of a signed 32-bit counter, so
    /// past 2^31 changes to a key's children the names go on with a minus sign.
    #[test]
    fn node_names_past_the_counter_wrap_are_lock_nodes() {
        assert_eq!(sequence("a-2147483647"), Some(2147483647));
        assert_eq!(sequence("a--2147483648"), Some(-2147483648));
        assert_eq!(sequence("a--000000001"), Some(-1));
        assert_eq!(sequence("a-0000000000"), Some(0));
        assert_eq!(sequence("a--"), None);
        assert_eq!(sequence("a---000000001"), None);
    }

    #[test]
    fn urls_and_paths_are_checked() {
        assert!(ZookeeperBackend::builder("zk://127.0.0.1:2181").is_ok());
        assert!(ZookeeperBackend::builder("zk://a:1,b:2/apps/locks").is_ok());
        assert!(ZookeeperBackend::builder("zk://a:1/").is_ok());
        for bad in [
            "zk://",
            "zk:///chroot",
            "zk://a:1,,b:2",
            "zk://a:1/x/",
            "zk://a:1/x//y",
            "redis://a:1",
        ] {
            assert!(ZookeeperBackend::builder(bad).is_err(), "{bad}");
        }
        assert!(check_path("/dlock").is_ok());
        for bad in ["dlock", "/", "/a/../b", "/a/"] {
            assert!(check_path(bad).is_err(), "{bad}");
        }
    }

    proptest! {
        /// A key is refused exactly when its path would pass the limit, and one that is taken is
        /// taken whole. (With a small limit, so that each case is quick; `the_path_limit_is_exact`
        /// checks the real one.)
        #[test]
        fn keys_near_the_path_limit_are_taken_whole_or_refused(
            base in "(/[a-z]{1,8}){1,3}",
            key in "[k/é\u{1}%.]{1,60}",
        ) {
            const LIMIT: usize = 120;
            let len = base.len() + 1 + node_name(&key).unwrap().len() + 45;
            match parent_path_within(&base, &key, LIMIT) {
                Ok(parent) => {
                    prop_assert!(len <= LIMIT);
                    prop_assert_eq!(parent, format!("{base}/{}", node_name(&key).unwrap()));
                }
                Err(LockError::InvalidKey { key: refused, reason }) => {
                    prop_assert!(len > LIMIT);
                    prop_assert!(refused == key, "the refused key was cut");
                    prop_assert!(reason.contains(&format!("{len} bytes")), "{}", reason);
                    prop_assert!(reason.contains(&format!("the {LIMIT} dlock sends")), "{}", reason);
                }
                Err(other) => prop_assert!(false, "unexpected {other}"),
            }
        }
    }
}
