//! The Redis store: single node, and Redis Cluster behind the `redis-cluster` feature.
//!
//! # Keys
//!
//! A lock on the rendered key `K`, with the key prefix `P` (default `dlock:`), lives in these
//! Redis keys, which share a hash slot because `{K}` is their hash tag:
//!
//! | Redis key | type | what |
//! | --- | --- | --- |
//! | `P{K}` | string, with PX | the holder's owner token (32 hex digits); the lease's ttl is its PTTL |
//! | `P{K}:fences` | integer, with PX 1 h | the last fence handed out (one more than the last, never below the server's clock in µs); while `P{K}` holds an owner (for up to an hour), the fence of that owner's grant |
//! | `P{K}:q` | list, expires when idle | the owners waiting for the lock, in arrival order |
//! | `P{K}:w:<owner>` | string, with PX | one waiter's liveness: `<claim window in ms> <backend id>`, kept alive while it waits |
//! | `P{K}:x:<owner>` | string, with PX 60 s | an acquisition cancelled by its caller (see below): an acquire call of that owner that reaches the server after the undo takes no effect |
//! | `P{K}:ch` | pub/sub channel | `<owner>`: the owner a release handed the lock to, which is to claim it |
//!
//! So `redis-cli GET 'dlock:{acct:42}'` shows who holds `acct:42`. Rendered keys never contain
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
//! `appendonly yes` with `appendfsync always` restores each lock with its expiry (the
//! configuration `tests/faults.rs` restarts under load). Without it, a newcomer can get a key
//! whose holder is still in its body until that holder's next renewal finds the lease gone
//! (at most ttl/3): fences are what protect the data then.
//!
//! # Round trips
//!
//! - Acquire is one Lua script (`SET NX PX` in effect, plus the fence's count): one round trip.
//!   Uncontended, it runs five commands: an `EXISTS` of the lock, its queue and the owner's
//!   cancel marker together, the server's `TIME`, the `GET` and `SET` of the counter, and the
//!   `SET` of the lock. It is idempotent for its owner: where the lock already holds the owner,
//!   it extends it to the full ttl and answers the same fence (the counter's value: every grant
//!   counts its fence and sets the lock in one step), so a call retried after a lost reply is
//!   harmless.
//! - Release is one script: compare-and-delete, hand-off to the first live waiter, `PUBLISH`.
//!   Where nobody waits, that is a `GET`, an `LPOP` that finds no queue, and a `DEL`.
//!
//! Each script runs its uncontended path before it defines the functions the other paths share
//! (common.lua is spliced in after it), and takes only the names it needs: Redis spends about as
//! long on a script's overhead as on a plain `SET`, so every command and argument saved shows.
//!   A waiter handed the lock claims it with one acquire call when the message (or, in the
//!   releasing process, the release's reply) reaches it: a contended hand-off costs the
//!   release's round trip and the claim's.
//! - Renewal is one compare-and-`PEXPIRE` script per lease, all leases of a `renew` call in one
//!   pipeline: one round trip per watchdog tick, whatever the number of leases. (On a cluster,
//!   one pipeline per hash slot, sent concurrently, each awaited for a third of the shortest
//!   ttl at most: a slot that fails — its primary down — leaves its own leases unconfirmed that
//!   round, and the other slots' leases are confirmed all the same.)
//!
//! With [`min_replicas`](RedisBackendBuilder::min_replicas) set, each acquire call and each
//! renewal pipeline carries a `WAIT` after its script(s), in the same round trip (see
//! *Fail-over* below); without it (the default), nothing is added.
//!
//! Scripts are sent by `EVALSHA`, falling back to `EVAL` where the server has not seen them yet
//! (after a restart, say). They need Redis 6.2 or later (`GETDEL`, `SET … GET`): each connection
//! asks the server's version (`INFO server`) when it is made, and a connection to an older server
//! fails with an error that names the version needed.
//!
//! # Waiting
//!
//! Waiters on a key are served in arrival order, and woken rather than polling:
//!
//! 1. A waiter first tries once (an uncontended acquire costs one round trip), unless other
//!    waiters of the same backend wait for the key already: it then goes straight to step 2,
//!    whose first call takes a free key all the same.
//! 2. If the key is busy, it subscribes to the key's channel on the backend's one pub/sub
//!    connection (one `SUBSCRIBE` per channel, shared by all the backend's waiters on the key,
//!    and an `UNSUBSCRIBE` when the last of them leaves), then runs the acquire script in
//!    queueing mode, which appends its owner to the key's queue and sets its waiter key (its
//!    *claim window* and its backend's id, with a PX of the *liveness window*). The claim window
//!    is the liveness window, or the waiter's ttl where that is shorter.
//! 3. A release hands the lock straight to the first live waiter, for that waiter's claim
//!    window only (read from its waiter key): the lock is set to the waiter's owner with that
//!    PX, a fresh fence is counted for it, and the owner is published on the channel. (Where
//!    nobody waits, the lock is deleted.) Waiters whose waiter key expired (their process died)
//!    are skipped and dropped. The release script answers the owner it handed the lock to;
//!    where that owner waits on the releasing backend (the same process), it is woken at once,
//!    in-process, and the script publishes nothing: each waiter key names the backend its waiter
//!    waits on, and a release names its own.
//! 4. The waiter woken claims the lock with one acquire call, which finds the lock already the
//!    owner's, extends it to the waiter's full ttl and answers its fence; the lease's validity
//!    counts from that call's send time. A waiter whose process died before its turn never
//!    claims the lock: the grant lapses after the claim window, and the next acquire call that
//!    finds the lock free (the head of the queue watches its PTTL) hands it on. A waiter that
//!    died costs the waiters after it at most one claim window, never a ttl.
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
//! A release by an older dlock publishes `<owner> <fence>` and grants a waiter's full ttl: the
//! waiter claims it all the same. A waiter of an older dlock confirms a message naming its owner
//! alone with one acquire call, which claims the lock; its waiter key holds its ttl where a
//! claim window goes, and a release grants it that.
//!
//! # Cancellation
//!
//! A caller that drops its acquire (a timeout, a `select!`) cannot tell whether the call reached
//! the server: dlock undoes it with a release from its background runtime, on another
//! connection than the call's own, so the undo may reach the server first. Where the undo finds
//! the owner not holding the lock, it leaves a cancel marker for that owner, and an acquire call
//! of that owner arriving later finds the marker and takes no effect. Checking for the marker
//! costs the uncontended acquire one more key in its `EXISTS`, no command and no round trip.
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
//! Connection and response timeouts are [builder](RedisBackendBuilder) options (3 s each by
//! default); callers that queued behind a connection attempt that failed share its failure, so an
//! unreachable server costs each call at most one attempt. A wrong password fails at once with
//! the server's `WRONGPASS`/`NOAUTH` answer and a hint to put the credentials in the URL.
//!
//! (redis-rs's own `ConnectionManager` is not used: it spawns its reconnection work on whichever
//! runtime created it or happened to await it, which is the caller's, and it dies with that
//! runtime.)
//!
//! # URLs, AUTH and TLS
//!
//! `redis://[[user]:password@]host[:port][/db][?min_replicas=n]`, as redis-rs reads it:
//! `redis://:secret@host` authenticates with a password, `redis://user:secret@host` as an ACL
//! user; `min_replicas` is dlock's (see *Fail-over*). `rediss://` is the
//! same over TLS, and needs the `redis-tls` feature (`dlock = { features = ["redis-tls"] }`).
//! TLS comes from rustls with the `ring` provider, which builds with a C compiler but no system
//! libraries or cmake; it is not on by default because it is heavy for what most users need:
//! a clean `-j1` debug build of `dlock-runtime` took 51 s without it and 87 s with it. The
//! server's certificate is checked against the system's roots (`SSL_CERT_FILE` and
//! `SSL_CERT_DIR` are honoured).
//!
//! # Redis Cluster
//!
//! With the `redis-cluster` feature, `redis+cluster://host:port,host:port` (or `rediss+cluster://`
//! for TLS, or a `redis://` URL naming several hosts) connects to a cluster through those seed
//! nodes; AUTH in the URL applies to every node. Every key of one lock shares a hash slot, so
//! each script runs on the one node that owns the lock. The pub/sub connection subscribes on one
//! seed node at a time (a classic `PUBLISH` reaches every node of a cluster), moving to the next
//! seed when it drops. (Sharded pub/sub would spare the other nodes that broadcast, at the cost of
//! one subscriber connection per node; it is not used.)
//!
//! # Fail-over
//!
//! Redis replicates asynchronously: a lock granted by a primary that fails before replicating it
//! can be granted again by the promoted replica, and a fence counter that had not reached the
//! replica counts again from an older value — which the clock floor lifts past every fence the
//! old primary handed out. Renewals are no different: a holder whose primary is cut off from its
//! replicas goes on renewing there, and a replica promoted after the lease's ttl ran out on its
//! copy lets a second caller in while the first still holds the lease by every confirmation it
//! received (`tests/failover.rs` shows it: the two bodies overlapped for about half a second, the
//! time the holder's side of the partition took to heal). By default, then, mutual exclusion
//! holds as long as the store keeps its writes; fences still rise across the fail-over and are
//! what protect the data — pass them to the protected store.
//!
//! [`min_replicas(n)`](RedisBackendBuilder::min_replicas) (or `?min_replicas=n` in the URL)
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

mod conn;
mod subscriber;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisResult, ServerErrorKind, Value};

use self::conn::{Conn, Connection, Timeouts};
use self::subscriber::{Subscriber, Subscription};
use super::{AcquireRequest, Acquired, Backend, Renewal};
use crate::url::mask_password;
use crate::{background, LockError, Owner};

const DEFAULT_PREFIX: &str = "dlock:";

/// The longest rendered key a Redis lock takes, in bytes (16 KiB). Each call names the key three
/// times (the lock, its counter and its queue) and the scripts build two more names from it, so
/// a call carries about five times the key; a longer key fails at once with
/// [`LockError::InvalidKey`] rather than costing the client and the server that much per call.
pub const MAX_KEY_BYTES: usize = 16 * 1024;
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);
const DEFAULT_LIVENESS: Duration = Duration::from_secs(3);
/// The first fallback poll of a waiter; it doubles (with jitter) up to a third of the liveness
/// window.
const FIRST_POLL: Duration = Duration::from_millis(250);

/// A lock store on Redis. Clones share the connections.
///
/// See the [module documentation](self) for how locks are laid out in Redis, what each call
/// costs, and how waiters are queued and woken.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
/// use dlock::{backend::RedisBackend, LockOptions, Locker};
///
/// let backend = RedisBackend::builder("redis://127.0.0.1:6379").key_prefix("billing:").connect().await?;
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
    prefix: String,
    /// Whether the prefix holds a `{`: the hash tag of every name then starts in the prefix.
    prefix_has_tag_open: bool,
    liveness: Duration,
    cluster: bool,
    /// How many replicas must acknowledge a grant or a renewal before it counts (0: none asked).
    min_replicas: usize,
    /// The response timeout: `WAIT` never blocks for more than half of it.
    response_timeout: Duration,
}

/// Options of a [`RedisBackend`], from [`RedisBackend::builder`].
///
/// ```
/// use std::time::Duration;
/// use dlock::backend::RedisBackend;
///
/// // No I/O until the first call.
/// let backend = RedisBackend::builder("redis://:secret@127.0.0.1:6379/0")
///     .key_prefix("app:locks:")
///     .connect_timeout(Duration::from_secs(1))
///     .build()?;
/// assert_eq!(backend.lock_key("job:7"), "app:locks:{job:7}");
/// # Ok::<(), dlock::LockError>(())
/// ```
#[derive(Clone)]
#[must_use = "a builder does nothing until `build` or `connect`"]
pub struct RedisBackendBuilder {
    url: String,
    prefix: String,
    connect_timeout: Duration,
    response_timeout: Duration,
    liveness: Duration,
    /// As set by [`min_replicas`](RedisBackendBuilder::min_replicas); else the URL's, else 0.
    min_replicas: Option<usize>,
}

impl std::fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackendBuilder")
            .field("url", &mask_password(&self.url))
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("liveness", &self.liveness)
            .field("min_replicas", &self.min_replicas)
            .finish()
    }
}

/// What to connect to. One per backend, cloned only to connect: its size does not matter.
#[derive(Clone)]
#[allow(clippy::large_enum_variant)]
enum Target {
    Single(redis::Client),
    /// The cluster, and a client per seed node for pub/sub.
    #[cfg(feature = "redis-cluster")]
    Cluster(redis::cluster::ClusterClient, Vec<redis::Client>),
}

impl RedisBackendBuilder {
    /// Prepends `prefix` to every Redis key and channel of this backend (default `dlock:`).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long connecting (TCP, TLS and AUTH) may take (default 3 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long the server may take to answer a call (default 3 s).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How long a waiter stays in a key's queue without showing it is alive (default 3 s). A
    /// waiter refreshes it at least three times per window; a waiter whose process died is
    /// skipped once the window runs out. It is also the *claim window*: a release hands the
    /// lock to the first waiter for this window only (or the waiter's ttl where shorter), and
    /// the waiter, woken, claims it for its ttl; a lock handed to a waiter that died is free
    /// again after at most one window.
    pub fn waiter_liveness(mut self, window: Duration) -> Self {
        self.liveness = window;
        self
    }

    /// How many replicas must have a grant or a renewal before it counts (default 0: the
    /// primary's word is enough, and nothing is added to any call).
    ///
    /// Redis replicates asynchronously: a primary that dies before a write reached its replicas
    /// takes the write with it, and a replica promoted in its place never heard of the grant, or
    /// of the renewals since the partition, so it can grant the key to a second caller while the
    /// first still holds it by every confirmation it received. With `min_replicas(n)`, every
    /// acquire call is followed by `WAIT n timeout` in the same round trip (a pipeline: `WAIT`
    /// counts the replicas that acknowledged the connection's writes so far), and so is every
    /// renewal pipeline:
    ///
    /// - a grant counts only once `n` replicas acknowledged it. A grant acknowledged by fewer is
    ///   asked for again within the caller's `wait` (the acquire script re-extends a lock its
    ///   owner holds, a write `WAIT` counts anew), with the back-off of a waiter's polls; when
    ///   `wait` runs out (at once for `wait = 0`) it is released (owner-checked) and the call
    ///   fails with [`LockError::Backend`], whose message names `min_replicas` and how many
    ///   replicas acknowledged it;
    /// - a renewal counts only where `n` replicas acknowledged it: one they did not leaves its
    ///   leases unconfirmed that round, each judged by its own deadline (a renewal the primary
    ///   refused is a loss all the same). A holder cut off from its replicas so loses its lease
    ///   by its own clock, a ttl less the margin after the last acknowledged renewal — before
    ///   the replicas' copy of the lease runs out, so before a promoted replica can grant the
    ///   key again.
    ///
    /// `WAIT` blocks for at most a quarter of the renewal interval (ttl/12, the shortest ttl of
    /// a renewal batch; the watchdog tries an unanswered renewal again after about that long),
    /// no more than half the [response timeout](Self::response_timeout), and at least 1 ms.
    /// Healthy replicas answer within a replication round trip; a `WAIT` that times out holds
    /// up the calls behind it on the same connection for that long.
    ///
    /// Cost: the `WAIT` in each acquire call and each renewal round trip, which lasts until the
    /// replicas acknowledge; `WAIT` blocks its connection meanwhile, so calls sharing it (one
    /// connection per runtime) queue behind it. On Redis Cluster each call's `WAIT` goes to the
    /// primary that ran its script, in the same pipeline, and counts that primary's replicas.
    /// Redisson's replica-sync check (`WAIT` after each lock write) is the analogue.
    ///
    /// What it does not give: persistence. A replica promoted with the lease keeps it; fences
    /// rise across the fail-over whatever happens (see the [module documentation](self)). A
    /// fail-over that promotes a replica which had not acknowledged the last write — a
    /// configuration with more replicas than `n`, whose promotion picks another — can still
    /// forget it: ask for every replica that can be promoted.
    ///
    /// `Locker::connect` takes it from the URL too: `redis://host:6379/?min_replicas=1`.
    pub fn min_replicas(mut self, replicas: usize) -> Self {
        self.min_replicas = Some(replicas);
        self
    }

    /// The backend, without connecting: the first call connects.
    pub fn build(self) -> Result<RedisBackend, LockError> {
        let masked: Arc<str> = mask_password(&self.url).into();
        let invalid = |reason: String| LockError::invalid_url(&self.url, reason);
        if self.liveness < Duration::from_millis(30) {
            return Err(LockError::InvalidOptions {
                reason: format!("waiter liveness {:?} is shorter than 30ms", self.liveness),
            });
        }
        if let Some(open) = self.prefix.find('{') {
            if self.prefix[open + 1..].starts_with('}') {
                return Err(LockError::InvalidOptions {
                    reason: format!(
                        "key prefix `{}` holds an empty hash tag `{{}}`, with which Redis Cluster \
                         would hash each name of a lock to a slot of its own",
                        self.prefix
                    ),
                });
            }
        }
        let target = parse_target(&self.url, self.connect_timeout, self.response_timeout)
            .map_err(invalid)?;
        let min_replicas = match (self.min_replicas, query_param(&self.url, "min_replicas")) {
            (Some(replicas), _) => replicas,
            (None, Some(replicas)) => replicas.parse().map_err(|_| {
                invalid(format!(
                    "min_replicas=`{replicas}`: expected the number of replicas"
                ))
            })?,
            (None, None) => 0,
        };
        let (subscribe_on, cluster) = match &target {
            Target::Single(client) => (vec![client.clone()], false),
            #[cfg(feature = "redis-cluster")]
            Target::Cluster(_, seeds) => (seeds.clone(), true),
        };
        let timeouts = Timeouts {
            connect: self.connect_timeout,
            response: self.response_timeout,
        };
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                conn: Connection::new(target, timeouts, masked),
                subscriber: Subscriber::new(
                    subscribe_on,
                    self.connect_timeout.max(self.response_timeout),
                ),
                instance: String::from_utf8_lossy(&Owner::random().hex()[..16]).into_owned(),
                prefix_has_tag_open: self.prefix.contains('{'),
                prefix: self.prefix,
                liveness: self.liveness,
                cluster,
                min_replicas,
                response_timeout: self.response_timeout,
            }),
        })
    }

    /// The backend, connected: fails at once when the server cannot be reached or refuses the
    /// credentials.
    pub async fn connect(self) -> Result<RedisBackend, LockError> {
        let backend = self.build()?;
        backend.ping().await?;
        Ok(backend)
    }
}

/// The value of the query parameter `name` of `url` (`…?name=value&…`), if it has one.
fn query_param<'a>(url: &'a str, name: &str) -> Option<&'a str> {
    let query = url.split_once('?')?.1;
    let query = query.split('#').next().unwrap_or(query);
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
}

/// Reads a URL into what to connect to.
fn parse_target(
    url: &str,
    connect_timeout: Duration,
    response_timeout: Duration,
) -> Result<Target, String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err("expected redis://host:port".into());
    };
    let (tls, cluster) = match scheme {
        "redis" => (false, false),
        "rediss" => (true, false),
        "redis+cluster" => (false, true),
        "rediss+cluster" => (true, true),
        _ => {
            return Err(
                "the scheme must be redis://, rediss://, redis+cluster:// or rediss+cluster://"
                    .into(),
            )
        }
    };
    if tls && !cfg!(feature = "redis-tls") {
        return Err("rediss:// needs TLS: enable dlock's `redis-tls` feature in Cargo.toml".into());
    }
    // Several hosts (`a:1,b:2`) name the seed nodes of a cluster.
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (Some(userinfo), hosts),
        None => (None, authority),
    };
    let hosts: Vec<&str> = hosts.split(',').collect();
    if hosts.iter().any(|h| h.is_empty()) {
        return Err("a host is missing".into());
    }
    let single_scheme = if tls { "rediss" } else { "redis" };
    let node_url = |host: &str| match userinfo {
        Some(userinfo) => format!("{single_scheme}://{userinfo}@{host}{tail}"),
        None => format!("{single_scheme}://{host}{tail}"),
    };
    let open = |url: &str| redis::Client::open(url).map_err(|e| e.to_string());
    if !cluster && hosts.len() == 1 {
        return open(&node_url(hosts[0])).map(Target::Single);
    }
    #[cfg(feature = "redis-cluster")]
    {
        let seeds = hosts
            .iter()
            .map(|host| open(&node_url(host)))
            .collect::<Result<Vec<_>, _>>()?;
        let client = redis::cluster::ClusterClient::builder(
            seeds.iter().map(|c| c.get_connection_info().clone()),
        )
        .connection_timeout(connect_timeout)
        .response_timeout(response_timeout)
        .build()
        .map_err(|e| e.to_string())?;
        Ok(Target::Cluster(client, seeds))
    }
    #[cfg(not(feature = "redis-cluster"))]
    {
        let _ = (connect_timeout, response_timeout);
        Err("Redis Cluster (several hosts, or redis+cluster://) needs dlock's `redis-cluster` feature".into())
    }
}

impl RedisBackend {
    /// Options for a backend on `url`: `redis://[[user]:password@]host[:port][/db]`,
    /// `rediss://…` (with the `redis-tls` feature), or with the `redis-cluster` feature
    /// `redis+cluster://host:port,host:port` (see the [module documentation](self)).
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder {
        RedisBackendBuilder {
            url: url.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            connect_timeout: DEFAULT_TIMEOUT,
            response_timeout: DEFAULT_TIMEOUT,
            liveness: DEFAULT_LIVENESS,
            min_replicas: None,
        }
    }

    /// A backend on `url` with the default options, connected.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = dlock::backend::RedisBackend::connect("redis://127.0.0.1:6379").await?;
    /// let locker = dlock::Locker::with_backend(backend);
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<RedisBackend, LockError> {
        Self::builder(url).connect().await
    }

    /// The Redis key that holds the lock on the rendered key `key`: the owner's token, with the
    /// lease's ttl as its PTTL.
    ///
    /// ```
    /// let backend = dlock::backend::RedisBackend::builder("redis://127.0.0.1").build()?;
    /// assert_eq!(backend.lock_key("acct:42"), "dlock:{acct:42}");
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    pub fn lock_key(&self, key: &str) -> String {
        self.lock_name(key, "")
    }

    /// `P{key}` followed by `suffix`, the name of one of `key`'s Redis keys. Built by hand, in one
    /// allocation of the right size: every call of a script names its keys anew.
    ///
    /// A key that is empty or starts with `}` would make an empty hash tag, which Redis Cluster
    /// ignores (it hashes the whole name, so the lock's names would fall in different slots):
    /// such a key is named `P}{=key}` instead, whose hash tag is `=`. No other key's names begin
    /// with `P}`, so two locks still never share a name.
    fn lock_name(&self, key: &str, suffix: &str) -> String {
        let prefix = &self.inner.prefix;
        let empty_tag = (key.is_empty() || key.starts_with('}')) && !self.inner.prefix_has_tag_open;
        let mut name = String::with_capacity(prefix.len() + key.len() + 4 + suffix.len());
        name.push_str(prefix);
        name.push_str(if empty_tag { "}{=" } else { "{" });
        name.push_str(key);
        name.push('}');
        name.push_str(suffix);
        name
    }

    /// The Redis key that counts the fences of `key`: an integer, the last fence handed out. It
    /// expires an hour after the last grant (fences go on rising from the server's clock).
    ///
    /// ```
    /// let backend = dlock::backend::RedisBackend::builder("redis://127.0.0.1").build()?;
    /// assert_eq!(backend.fence_key("acct:42"), "dlock:{acct:42}:fences");
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    pub fn fence_key(&self, key: &str) -> String {
        self.lock_name(key, COUNTER_SUFFIX)
    }

    /// The Redis key that queues the waiters of `key`, in arrival order.
    ///
    /// ```
    /// let backend = dlock::backend::RedisBackend::builder("redis://127.0.0.1").build()?;
    /// assert_eq!(backend.queue_key("acct:42"), "dlock:{acct:42}:q");
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    pub fn queue_key(&self, key: &str) -> String {
        self.lock_name(key, QUEUE_SUFFIX)
    }

    /// Checks that the server answers (and accepted the credentials).
    async fn ping(&self) -> Result<(), LockError> {
        self.inner
            .conn
            .run("PING", |mut conn| async move {
                conn.req_packed_command(&redis::cmd("PING"))
                    .await
                    .and_then(Value::extract_error)
            })
            .await
            .map(drop)
    }

    fn lock_keys(&self, key: &str, owner: Owner) -> LockKeys {
        LockKeys {
            lock: self.lock_key(key),
            counter: self.lock_name(key, COUNTER_SUFFIX),
            queue: self.lock_name(key, QUEUE_SUFFIX),
            owner: owner.hex(),
        }
    }

    /// Runs the acquire script once, as `mode` says.
    async fn try_acquire(
        &self,
        keys: &LockKeys,
        ttl: Duration,
        mode: Mode,
    ) -> Result<Attempt, LockError> {
        let liveness = match mode {
            Mode::Queue => millis(self.inner.liveness),
            // A liveness window of 0 says to leave the queue.
            Mode::Leave => 0,
            Mode::FirstTry => 0,
        };
        let all = [
            Arg::Text(keys.owner()),
            Arg::Number(millis(ttl)),
            Arg::Number(liveness),
            Arg::Text(&self.inner.instance),
        ];
        // A first try passes no more than the ttl: the uncontended path reads nothing else.
        let args = if mode == Mode::FirstTry {
            &all[..2]
        } else {
            &all[..]
        };
        let script_keys = keys.script_keys();
        if self.inner.min_replicas == 0 {
            let reply = self
                .inner
                .conn
                .run_acquire(|conn| eval(conn, &ACQUIRE, &script_keys, args))
                .await?;
            return parse_attempt(reply).map_err(|reason| self.inner.conn.error("acquire", reason));
        }
        let replicas = self.replicas_for(ttl);
        let (reply, acknowledged) = self
            .inner
            .conn
            .run_acquire(|conn| eval_then_wait(conn, &ACQUIRE, &script_keys, args, replicas))
            .await?;
        match parse_attempt(reply).map_err(|reason| self.inner.conn.error("acquire", reason))? {
            Attempt::Granted(_) if acknowledged < replicas.count => {
                Ok(Attempt::Unreplicated { acknowledged })
            }
            attempt => Ok(attempt),
        }
    }

    /// The `WAIT` that follows a write whose leases have ttl `ttl` at the shortest: for
    /// `min_replicas` replicas, for a quarter of the renewal interval, no more than half the
    /// response timeout (a `WAIT` that outlasted it would break the connection), at least 1 ms
    /// (`WAIT` with 0 blocks for ever).
    fn replicas_for(&self, ttl: Duration) -> ReplicaWait {
        let timeout = (crate::clock::renew_interval(ttl) / 4).min(self.inner.response_timeout / 2);
        ReplicaWait {
            count: self.inner.min_replicas as u64,
            timeout_ms: millis(timeout),
        }
    }

    /// Undoes a grant that too few replicas acknowledged (an owner-checked release), and says
    /// why the acquisition failed.
    async fn undo_unreplicated(
        &self,
        request: &AcquireRequest<'_>,
        acknowledged: u64,
    ) -> LockError {
        let key = request.key;
        if let Err(error) = self.release_or_leave(key, request.owner).await {
            tracing::debug!(%key, %error, "distributed_lock: undoing a grant the replicas did not acknowledge failed; it will expire");
        }
        let replicas = self.replicas_for(request.ttl);
        LockError::backend(format!(
            "redis at {}: acquire: the grant was acknowledged by {acknowledged} of the {} \
             replica(s) min_replicas asks for within {} ms; it was released",
            self.inner.conn.description(),
            replicas.count,
            replicas.timeout_ms,
        ))
    }

    /// Runs the release script: releases with hand-off where `owner` holds `key`, else leaves its
    /// queue.
    async fn release_or_leave(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
        let keys = self.lock_keys(key, owner);
        let script_keys = keys.script_keys();
        let args = [Arg::Text(keys.owner()), Arg::Text(&self.inner.instance)];
        let reply = self
            .inner
            .conn
            .run("release", |conn| eval(conn, &RELEASE, &script_keys, &args))
            .await?;
        let released =
            parse_release(reply).map_err(|reason| self.inner.conn.error("release", reason))?;
        if let Some(head) = &released.handed_to {
            // A waiter of this process need not wait for the published message. It must claim
            // the lock now: let it run before this caller goes on (to queue for the key again,
            // say), so that its claim is not sent behind the caller's request.
            if self.inner.subscriber.wake_local(&keys.channel(), head) {
                tokio::task::yield_now().await;
            }
        }
        Ok(released.held)
    }

    /// Waits for a busy key in its queue, until it is handed over or `deadline` passes.
    async fn wait_in_queue(
        &self,
        keys: &LockKeys,
        request: &AcquireRequest<'_>,
        deadline: Instant,
    ) -> Result<Option<Acquired>, LockError> {
        let mut subscription: Subscription = self
            .inner
            .subscriber
            .register(keys.channel(), keys.owner().to_owned());
        // Leaves the queue (or releases a key handed over meanwhile) if this future is dropped
        // or fails.
        let mut guard = LeaveGuard {
            backend: self.clone(),
            key: request.key.to_owned(),
            owner: request.owner,
            armed: true,
        };
        let mut backoff = Backoff::new(FIRST_POLL, self.inner.liveness / 3, request.owner);
        loop {
            // Subscribed before the script queues this waiter, so the hand-off's message cannot
            // come first. Without pub/sub (it failed), the timer below still finds the hand-off.
            if let Err(error) = subscription.ensure().await {
                tracing::debug!(%error, key = request.key, "distributed_lock: redis subscribe failed; polling meanwhile");
            }
            let sent_at = Instant::now();
            let last = sent_at >= deadline;
            let mode = if last { Mode::Leave } else { Mode::Queue };
            let attempt = self.try_acquire(keys, request.ttl, mode).await?;
            match attempt {
                Attempt::Granted(fence) => {
                    guard.armed = false;
                    return Ok(Some(Acquired {
                        fence,
                        valid_from: sent_at,
                    }));
                }
                // The last attempt left the queue in the same script.
                Attempt::Busy { .. } if last => {
                    guard.armed = false;
                    return Ok(None);
                }
                Attempt::Unreplicated { acknowledged } if last => {
                    guard.armed = false;
                    return Err(self.undo_unreplicated(request, acknowledged).await);
                }
                Attempt::Unreplicated { acknowledged } => {
                    // The lock is this owner's on the primary, unconfirmed: asked again (the
                    // next call extends it, a fresh write to acknowledge) after the back-off.
                    tracing::debug!(
                        key = request.key,
                        acknowledged,
                        "distributed_lock: a grant too few replicas acknowledged; asking again"
                    );
                    let until = (Instant::now() + backoff.next()).min(deadline);
                    tokio::time::sleep_until(until.into()).await;
                }
                Attempt::Busy { pttl, first } => {
                    let now = Instant::now();
                    let mut until = (now + backoff.next()).min(deadline);
                    if let (true, Some(pttl)) = (first, pttl) {
                        // The head also watches the holder's expiry, which hands nothing on, and
                        // the lapse of a grant to a waiter before it that never claimed it.
                        until = until.min(now + pttl);
                    }
                    tokio::select! {
                        () = subscription.woken() => {}
                        () = tokio::time::sleep_until(until.into()) => {}
                    }
                    // Woken by a hand-off (or to look again): the next acquire call claims a lock
                    // handed to this owner — it finds it its own, extends it to the full ttl and
                    // answers the fence — within the claim window the hand-off granted.
                }
            }
        }
    }
}

/// The suffixes that name a lock's other keys after its own. The scripts name the waiter keys
/// (`:w:<owner>`) and the channel (`:ch`) themselves (see common.lua).
const COUNTER_SUFFIX: &str = ":fences";
const QUEUE_SUFFIX: &str = ":q";
const CHANNEL_SUFFIX: &str = ":ch";

/// The Redis names one call of the scripts needs, for one owner. The channel, which only a waiter
/// needs, is named on demand.
struct LockKeys {
    lock: String,
    counter: String,
    queue: String,
    owner: [u8; 32],
}

impl LockKeys {
    fn owner(&self) -> &str {
        std::str::from_utf8(&self.owner).expect("hex digits are ASCII")
    }

    /// `KEYS` of the acquire and release scripts (see common.lua).
    fn script_keys(&self) -> [&str; 3] {
        [&self.lock, &self.counter, &self.queue]
    }

    fn channel(&self) -> String {
        format!("{}{CHANNEL_SUFFIX}", self.lock)
    }
}

/// How a run of the acquire script treats a busy lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A first try, in no queue: answer busy.
    FirstTry,
    /// Queue up (or stay queued), refreshing the waiter's liveness.
    Queue,
    /// A waiter's last try: leave the queue.
    Leave,
}

/// What one run of the acquire script said.
#[derive(Debug)]
enum Attempt {
    Granted(u64),
    /// Granted on the primary, but acknowledged by fewer replicas than `min_replicas`: it does
    /// not count.
    Unreplicated {
        acknowledged: u64,
    },
    /// Busy; `pttl` is the holder's remaining ttl where it has one, `first` whether this owner
    /// heads the queue.
    Busy {
        pttl: Option<Duration>,
        first: bool,
    },
}

/// What one run of the release script said.
#[derive(Debug)]
struct Released {
    /// Whether the owner held the lock.
    held: bool,
    /// The owner the lock was handed to, for its claim window.
    handed_to: Option<String>,
}

fn parse_release(reply: Value) -> Result<Released, redis::RedisError> {
    let held = |held: i64| match held {
        0 | 1 => Ok(held == 1),
        _ => Err(unexpected(&reply)),
    };
    match &reply {
        // Nobody was handed the lock: the common case, a bare integer.
        Value::Int(n) => Ok(Released {
            held: held(*n)?,
            handed_to: None,
        }),
        Value::Array(items) => {
            // {held, head, the hand-off's fence}
            let [Value::Int(n), Value::BulkString(head), Value::Int(_)] = items.as_slice() else {
                return Err(unexpected(&reply));
            };
            let head = std::str::from_utf8(head).map_err(|_| unexpected(&reply))?;
            Ok(Released {
                held: held(*n)?,
                handed_to: Some(head.to_owned()),
            })
        }
        _ => Err(unexpected(&reply)),
    }
}

fn parse_attempt(reply: Value) -> Result<Attempt, redis::RedisError> {
    match &reply {
        // Granted: the fence, a bare integer.
        Value::Int(fence) => u64::try_from(*fence)
            .map(Attempt::Granted)
            .map_err(|_| unexpected(&reply)),
        Value::Array(items) => {
            let [Value::Int(pttl), Value::Int(first)] = items.as_slice() else {
                return Err(unexpected(&reply));
            };
            Ok(Attempt::Busy {
                // Negative where the caller does not head the queue (only the head is told), the
                // lock has no ttl (-1), or it is gone (-2).
                pttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
                first: *first == 1,
            })
        }
        _ => Err(unexpected(&reply)),
    }
}

fn unexpected(value: &Value) -> redis::RedisError {
    redis::RedisError::from((
        ErrorKind::UnexpectedReturnType,
        "unexpected reply from a dlock script",
        format!("{value:?}"),
    ))
}

/// Leaves the queue when a waiter's future is dropped or fails: from the background runtime,
/// since `Drop` cannot await.
struct LeaveGuard {
    backend: RedisBackend,
    key: String,
    owner: Owner,
    armed: bool,
}

impl Drop for LeaveGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (backend, key, owner) = (
            self.backend.clone(),
            std::mem::take(&mut self.key),
            self.owner,
        );
        background::spawn(async move {
            if let Err(error) = backend.release_or_leave(&key, owner).await {
                tracing::debug!(%key, %error, "distributed_lock: leaving the redis queue failed; the waiter key will expire");
            }
        });
    }
}

/// Jittered exponential back-off for the fallback polls of a waiter.
struct Backoff {
    next: Duration,
    cap: Duration,
    seed: u64,
}

impl Backoff {
    fn new(first: Duration, cap: Duration, owner: Owner) -> Self {
        // The owner token is random: a fine seed for jitter.
        Backoff {
            next: first.min(cap),
            cap,
            seed: owner.as_u128() as u64 | 1,
        }
    }

    fn next(&mut self) -> Duration {
        // xorshift64
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        // 75 % to 125 % of the nominal delay.
        let permille = 750 + self.seed % 501;
        let delay = self.next.mul_f64(permille as f64 / 1000.0).min(self.cap);
        self.next = self.next.saturating_mul(2).min(self.cap);
        delay
    }
}

/// A Lua script, sent by its SHA1 where the server knows it.
struct Lua {
    /// The script's file; `--!common` on a line of its own marks where common.lua goes.
    source: &'static str,
    /// The code as sent, and its SHA1.
    code: OnceLock<(String, String)>,
}

/// One `ARGV` of a script call.
#[derive(Clone, Copy)]
enum Arg<'a> {
    Text(&'a str),
    Number(u64),
}

impl Lua {
    const fn new(source: &'static str) -> Self {
        Lua {
            source,
            code: OnceLock::new(),
        }
    }

    fn code(&self) -> &(String, String) {
        self.code.get_or_init(|| {
            let code = self
                .source
                .replacen("--!common\n", include_str!("common.lua"), 1);
            let hash = redis::Script::new(&code).get_hash().to_owned();
            (code, hash)
        })
    }

    /// `EVALSHA` (or, with `by_hash` false, `EVAL`) of this script, with `KEYS` `keys` and `ARGV`
    /// `args`. Sized up front, so that building it allocates twice rather than growing its
    /// buffers argument by argument.
    fn cmd(&self, by_hash: bool, keys: &[&str], args: &[Arg<'_>]) -> Cmd {
        let (code, hash) = self.code();
        let (name, script) = if by_hash {
            ("EVALSHA", hash.as_str())
        } else {
            ("EVAL", code.as_str())
        };
        // u64::MAX has 20 digits; the key count, far fewer.
        let data = name.len()
            + script.len()
            + 20
            + keys.iter().map(|key| key.len()).sum::<usize>()
            + args
                .iter()
                .map(|arg| match arg {
                    Arg::Text(text) => text.len(),
                    Arg::Number(_) => 20,
                })
                .sum::<usize>();
        let mut cmd = Cmd::with_capacity(3 + keys.len() + args.len(), data);
        cmd.arg(name).arg(script).arg(keys.len()).arg(keys);
        for arg in args {
            match *arg {
                Arg::Text(text) => cmd.arg(text),
                Arg::Number(number) => cmd.arg(number),
            };
        }
        cmd
    }
}

static ACQUIRE: Lua = Lua::new(include_str!("acquire.lua"));
static RELEASE: Lua = Lua::new(include_str!("release.lua"));
static RENEW: Lua = Lua::new(include_str!("renew.lua"));

fn is_noscript(error: &redis::RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// Runs `lua`: `EVALSHA`, then `EVAL` where the server does not know the script (which also
/// caches it there).
async fn eval(mut conn: Conn, lua: &Lua, keys: &[&str], args: &[Arg<'_>]) -> RedisResult<Value> {
    match conn
        .req_packed_command(&lua.cmd(true, keys, args))
        .await
        .and_then(Value::extract_error)
    {
        Err(error) if is_noscript(&error) => conn
            .req_packed_command(&lua.cmd(false, keys, args))
            .await
            .and_then(Value::extract_error),
        result => result,
    }
}

/// A `WAIT` for `count` replicas, for at most `timeout_ms`.
#[derive(Debug, Clone, Copy)]
struct ReplicaWait {
    count: u64,
    timeout_ms: u64,
}

impl ReplicaWait {
    fn cmd(self) -> Cmd {
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(self.count).arg(self.timeout_ms);
        cmd
    }
}

/// How many replicas a `WAIT` reply says acknowledged the connection's writes.
fn parse_acknowledged(reply: Value) -> RedisResult<u64> {
    match reply.extract_error()? {
        Value::Int(acknowledged) => Ok(u64::try_from(acknowledged).unwrap_or(0)),
        other => Err(unexpected(&other)),
    }
}

/// Runs `lua` and `WAIT`s for `replicas` in one pipeline: one round trip (two where the server
/// had to be taught the script). `WAIT` counts the replicas that acknowledged every write the
/// connection made so far, so the script's writes among them.
async fn eval_then_wait(
    mut conn: Conn,
    lua: &Lua,
    keys: &[&str],
    args: &[Arg<'_>],
    replicas: ReplicaWait,
) -> RedisResult<(Value, u64)> {
    let pipeline = |by_hash: bool| {
        let mut pipe = redis::pipe();
        pipe.add_command(lua.cmd(by_hash, keys, args))
            .add_command(replicas.cmd());
        pipe
    };
    let mut replies = conn.req_packed_commands(&pipeline(true), 0, 2).await?;
    if matches!(replies[0].clone().extract_error(), Err(error) if is_noscript(&error)) {
        replies = conn.req_packed_commands(&pipeline(false), 0, 2).await?;
    }
    let [reply, acknowledged]: [Value; 2] = replies
        .try_into()
        .map_err(|replies: Vec<Value>| unexpected(&Value::Array(replies)))?;
    Ok((reply.extract_error()?, parse_acknowledged(acknowledged)?))
}

/// Refuses a key longer than [`MAX_KEY_BYTES`], whole: never cut, since two keys cut alike would
/// be one lock.
fn check_key(key: &str) -> Result<(), LockError> {
    if key.len() > MAX_KEY_BYTES {
        return Err(LockError::InvalidKey {
            // The reason says why; the key itself may be megabytes.
            key: format!(
                "{}…",
                &key[..(0..=64)
                    .rev()
                    .find(|&i| key.is_char_boundary(i))
                    .unwrap_or(0)]
            ),
            reason: format!(
                "{} bytes is longer than the {MAX_KEY_BYTES} a Redis lock key may be",
                key.len()
            ),
        });
    }
    Ok(())
}

/// `duration` in whole milliseconds, at least 1 (a `PX` of 0 is an error).
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// One lease to renew: its lock's name, its owner's hex digits, the ttl in ms.
type RenewArgs = (String, [u8; 32], u64);

fn renew_batch_entry((lock, owner, ttl): &RenewArgs) -> (&str, &str, u64) {
    let owner = std::str::from_utf8(owner).expect("hex digits are ASCII");
    (lock, owner, *ttl)
}

/// What one renewal pipeline said.
struct Renewed {
    /// Per lease, whether its owner held it on the primary (now extended there).
    held: Vec<bool>,
    /// With `min_replicas`: how many replicas acknowledged the pipeline's writes, and how many
    /// were asked for.
    replicas: Option<(u64, ReplicaWait)>,
}

impl Renewed {
    /// Per lease: `Some(true)` where renewed (and acknowledged by the replicas asked for),
    /// `Some(false)` where the primary refused it, `None` where renewed on the primary alone —
    /// not confirmed this round.
    fn judged(&self) -> Vec<Option<bool>> {
        let replicated = self
            .replicas
            .is_none_or(|(acknowledged, asked)| acknowledged >= asked.count);
        self.held
            .iter()
            .map(|&held| (replicated || !held).then_some(held))
            .collect()
    }
}

/// Renews `leases` in one pipeline on `conn`, followed by a `WAIT` where `replicas` asks for
/// one: one round trip (two where the server had to be taught the script).
async fn renew_pipelined(
    mut conn: Conn,
    leases: &[(&str, &str, u64)],
    replicas: Option<ReplicaWait>,
) -> RedisResult<Renewed> {
    let pipeline = |by_hash: bool| {
        let mut pipe = redis::pipe();
        for &(lock, owner, ttl) in leases {
            pipe.add_command(RENEW.cmd(by_hash, &[lock], &[Arg::Text(owner), Arg::Number(ttl)]));
        }
        if let Some(replicas) = replicas {
            pipe.add_command(replicas.cmd());
        }
        pipe
    };
    let count = leases.len() + usize::from(replicas.is_some());
    let mut replies = conn.req_packed_commands(&pipeline(true), 0, count).await?;
    let noscript =
        |value: &Value| matches!(value.clone().extract_error(), Err(error) if is_noscript(&error));
    if replies.iter().any(noscript) {
        replies = conn.req_packed_commands(&pipeline(false), 0, count).await?;
    }
    if replies.len() != count {
        return Err(unexpected(&Value::Array(replies)));
    }
    let acknowledged = match replicas {
        Some(replicas) => {
            let reply = replies.pop().expect("counted above");
            Some((parse_acknowledged(reply)?, replicas))
        }
        None => None,
    };
    let held = replies
        .into_iter()
        .map(|reply| match reply.extract_error()? {
            Value::Int(held) => Ok(held == 1),
            other => Err(unexpected(&other)),
        })
        .collect::<RedisResult<_>>()?;
    Ok(Renewed {
        held,
        replicas: acknowledged,
    })
}

impl Backend for RedisBackend {
    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Option<Acquired>, LockError> {
        check_key(request.key)?;
        let keys = self.lock_keys(request.key, request.owner);
        let deadline = Instant::now() + request.wait;
        if !request.wait.is_zero() && self.inner.subscriber.is_subscribed(&keys.channel()) {
            // Other waiters of this backend wait for the key: it is most likely busy, so queue
            // up in the first call, which spares a round trip. The channel is subscribed
            // already, so the hand-off's message cannot come before it.
            return self.wait_in_queue(&keys, request, deadline).await;
        }
        let sent_at = Instant::now();
        // First without queueing: an uncontended acquire is one round trip, and `wait = 0`
        // never leaves anything behind.
        match self.try_acquire(&keys, request.ttl, Mode::FirstTry).await? {
            Attempt::Granted(fence) => Ok(Some(Acquired {
                fence,
                valid_from: sent_at,
            })),
            Attempt::Busy { .. } if request.wait.is_zero() => Ok(None),
            Attempt::Busy { .. } => self.wait_in_queue(&keys, request, deadline).await,
            Attempt::Unreplicated { acknowledged } if request.wait.is_zero() => {
                Err(self.undo_unreplicated(request, acknowledged).await)
            }
            // Asked again while the caller may wait: the first call of the queue finds the lock
            // this owner's and extends it, which the replicas may acknowledge this time.
            Attempt::Unreplicated { .. } => self.wait_in_queue(&keys, request, deadline).await,
        }
    }

    async fn release(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
        self.release_or_leave(key, owner).await
    }

    async fn renew(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
        let (held, error) = self.renew_judged(leases).await;
        // All or nothing: a lease not confirmed makes the whole answer an error.
        match error {
            Some(error) if held.iter().any(Option::is_none) => Err(error),
            _ => Ok(held.into_iter().map(|held| held == Some(true)).collect()),
        }
    }

    async fn renew_each(&self, leases: &[Renewal<'_>]) -> Result<Vec<Option<bool>>, LockError> {
        let (held, error) = self.renew_judged(leases).await;
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

impl RedisBackend {
    /// Renews `leases`, answering per lease (see [`Renewed::judged`]), with the first failure
    /// where some lease was not confirmed: a call that failed, or renewals that fewer replicas
    /// acknowledged than `min_replicas` asks for.
    async fn renew_judged(&self, leases: &[Renewal<'_>]) -> (Vec<Option<bool>>, Option<LockError>) {
        if leases.is_empty() {
            return (Vec::new(), None);
        }
        let args: Vec<RenewArgs> = leases
            .iter()
            .map(|lease| {
                (
                    self.lock_key(lease.key),
                    lease.owner.hex(),
                    millis(lease.ttl),
                )
            })
            .collect();
        let replicas = (self.inner.min_replicas > 0).then(|| {
            let shortest = leases.iter().map(|lease| lease.ttl).min();
            self.replicas_for(shortest.unwrap_or_default())
        });
        if self.inner.cluster {
            #[cfg(feature = "redis-cluster")]
            return self.renew_by_slot(&args, replicas).await;
            #[cfg(not(feature = "redis-cluster"))]
            unreachable!("a cluster backend needs the redis-cluster feature")
        }
        let batch: Vec<_> = args.iter().map(renew_batch_entry).collect();
        let renewed = self
            .inner
            .conn
            .run("renew", |conn| renew_pipelined(conn, &batch, replicas))
            .await;
        match renewed {
            Ok(renewed) => {
                let error = self.unreplicated_renewal(&renewed);
                (renewed.judged(), error)
            }
            Err(error) => (vec![None; leases.len()], Some(error)),
        }
    }

    /// Why the leases of `renewed` that the primary renewed are not confirmed, if they are not.
    fn unreplicated_renewal(&self, renewed: &Renewed) -> Option<LockError> {
        let (acknowledged, asked) = renewed.replicas?;
        (acknowledged < asked.count).then(|| {
            LockError::backend(format!(
                "redis at {}: renew: the renewal was acknowledged by {acknowledged} of the {} \
                 replica(s) min_replicas asks for within {} ms; its leases are not confirmed \
                 this round",
                self.inner.conn.description(),
                asked.count,
                asked.timeout_ms,
            ))
        })
    }
}

#[cfg(feature = "redis-cluster")]
impl RedisBackend {
    /// Renews on a cluster: one pipeline per hash slot (a cluster pipeline cannot span slots),
    /// all sent at once. Answers per lease, `None` for the leases of a slot that failed, with
    /// the first failure.
    async fn renew_by_slot(
        &self,
        args: &[RenewArgs],
        replicas: Option<ReplicaWait>,
    ) -> (Vec<Option<bool>>, Option<LockError>) {
        let mut by_slot: std::collections::BTreeMap<u16, Vec<usize>> =
            std::collections::BTreeMap::new();
        for (index, (lock, _, _)) in args.iter().enumerate() {
            by_slot
                .entry(cluster_slot(lock.as_bytes()))
                .or_default()
                .push(index);
        }
        // A node that went down can keep its slots' calls waiting (the cluster client retries);
        // the others' answers must not wait for it past the point where their leases could use
        // them: a renewal comes every ttl/3, and is awaited for no longer than that.
        let bound =
            Duration::from_millis(args.iter().map(|(_, _, ttl)| *ttl).min().unwrap_or(1) / 3);
        let calls = by_slot.into_values().map(|indices| async move {
            let batch: Vec<_> = indices
                .iter()
                .map(|&i| renew_batch_entry(&args[i]))
                .collect();
            let renewed = self
                .inner
                .conn
                .run("renew", |conn| renew_pipelined(conn, &batch, replicas));
            let renewed = match tokio::time::timeout(bound, renewed).await {
                Ok(renewed) => renewed?,
                Err(_) => {
                    return Err(LockError::backend(format!(
                        "redis cluster: renewing a slot's leases took longer than {bound:?}"
                    )))
                }
            };
            Ok::<_, LockError>((indices, renewed))
        });
        let mut answers = vec![None; args.len()];
        let mut first_error = None;
        for result in futures_util::future::join_all(calls).await {
            match result {
                Ok((indices, renewed)) => {
                    for (index, held) in indices.into_iter().zip(renewed.judged()) {
                        answers[index] = held;
                    }
                    if let Some(error) = self.unreplicated_renewal(&renewed) {
                        first_error.get_or_insert(error);
                    }
                }
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        (answers, first_error)
    }
}

/// The cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag, or of the whole key.
#[cfg(feature = "redis-cluster")]
fn cluster_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            key[open + 1..]
                .iter()
                .position(|&b| b == b'}')
                .map(|len| &key[open + 1..open + 1 + len])
        })
        .filter(|tag| !tag.is_empty())
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in tagged {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_one_lock_share_the_hash_tag() {
        let backend = RedisBackend::builder("redis://127.0.0.1").build().unwrap();
        let keys = backend.lock_keys("acct:42", Owner::random());
        for name in [&keys.lock, &keys.counter, &keys.queue, &keys.channel()] {
            assert!(name.starts_with("dlock:{acct:42}"), "{name}");
        }
    }

    #[cfg(feature = "redis-cluster")]
    #[test]
    fn every_key_keeps_its_names_in_one_slot() {
        for prefix in ["dlock:", "a}", "x{", "{app}:"] {
            let backend = RedisBackend::builder("redis://127.0.0.1")
                .key_prefix(prefix)
                .build()
                .unwrap();
            for key in ["", "}", "}abc", "{", "{}", "a}b", "acct:42"] {
                let keys = backend.lock_keys(key, Owner::random());
                let slot = cluster_slot(keys.lock.as_bytes());
                for name in [&keys.counter, &keys.queue, &keys.channel()] {
                    assert_eq!(
                        cluster_slot(name.as_bytes()),
                        slot,
                        "{prefix:?} {key:?}: {name}"
                    );
                }
            }
        }
        assert!(RedisBackend::builder("redis://127.0.0.1")
            .key_prefix("locks{}:")
            .build()
            .is_err());
    }

    #[test]
    fn urls_are_checked_without_io() {
        assert!(RedisBackend::builder("redis://:pw@localhost:6380/2")
            .build()
            .is_ok());
        assert!(matches!(
            RedisBackend::builder("http://localhost").build(),
            Err(LockError::InvalidUrl { .. })
        ));
        let error = RedisBackend::builder("redis://:secret@a:1,b:2")
            .build()
            .map(drop);
        if cfg!(feature = "redis-cluster") {
            assert!(error.is_ok());
        } else {
            let error = error.unwrap_err().to_string();
            assert!(
                error.contains("redis-cluster") && !error.contains("secret"),
                "{error}"
            );
        }
        #[cfg(not(feature = "redis-tls"))]
        assert!(RedisBackend::builder("rediss://localhost")
            .build()
            .unwrap_err()
            .to_string()
            .contains("redis-tls"));
    }

    #[test]
    fn min_replicas_comes_from_the_builder_or_else_the_url() {
        let min_replicas =
            |builder: RedisBackendBuilder| builder.build().unwrap().inner.min_replicas;
        assert_eq!(min_replicas(RedisBackend::builder("redis://h")), 0);
        assert_eq!(
            min_replicas(RedisBackend::builder("redis://:pw@h:1/0?min_replicas=2")),
            2
        );
        assert_eq!(
            min_replicas(RedisBackend::builder(
                "redis://h/?protocol=resp2&min_replicas=1#x"
            )),
            1
        );
        assert_eq!(
            min_replicas(RedisBackend::builder("redis://h/?min_replicas=2").min_replicas(0)),
            0
        );
        let error = RedisBackend::builder("redis://:secret@h/?min_replicas=all")
            .build()
            .map(drop)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("min_replicas") && !error.contains("secret"),
            "{error}"
        );
    }

    #[test]
    fn wait_blocks_for_a_twelfth_of_the_ttl_within_half_the_response_timeout() {
        let backend = RedisBackend::builder("redis://h")
            .min_replicas(1)
            .response_timeout(Duration::from_secs(3))
            .build()
            .unwrap();
        let timeout = |ttl: u64| backend.replicas_for(Duration::from_millis(ttl)).timeout_ms;
        assert_eq!(timeout(2_400), 200);
        assert_eq!(timeout(30_000), 1_500);
        assert_eq!(timeout(1), 1, "WAIT 0 would block for ever");
        assert_eq!(backend.replicas_for(Duration::from_secs(1)).count, 1);
    }

    #[test]
    fn a_renewal_too_few_replicas_acknowledged_confirms_nothing_but_a_refusal() {
        let asked = ReplicaWait {
            count: 2,
            timeout_ms: 100,
        };
        let renewed = |acknowledged| Renewed {
            held: vec![true, false],
            replicas: Some((acknowledged, asked)),
        };
        assert_eq!(renewed(1).judged(), vec![None, Some(false)]);
        assert_eq!(renewed(2).judged(), vec![Some(true), Some(false)]);
        let unasked = Renewed {
            held: vec![true, false],
            replicas: None,
        };
        assert_eq!(unasked.judged(), vec![Some(true), Some(false)]);
    }

    #[test]
    fn backoff_grows_with_jitter_up_to_the_cap() {
        let mut backoff = Backoff::new(
            Duration::from_millis(100),
            Duration::from_secs(1),
            Owner::random(),
        );
        let delays: Vec<Duration> = (0..8).map(|_| backoff.next()).collect();
        assert!(
            delays[0] >= Duration::from_millis(75) && delays[0] <= Duration::from_millis(125),
            "{delays:?}"
        );
        assert!(
            delays.iter().all(|d| *d <= Duration::from_secs(1)),
            "{delays:?}"
        );
        assert!(delays[7] >= Duration::from_millis(750), "{delays:?}");
    }

    #[test]
    fn release_replies_name_the_waiter_handed_the_lock() {
        let reply = |held: i64, head: &str, fence: i64| {
            Value::Array(vec![
                Value::Int(held),
                Value::BulkString(head.as_bytes().to_vec()),
                Value::Int(fence),
            ])
        };
        let released = parse_release(reply(1, "abc", 9)).unwrap();
        assert!(released.held);
        assert_eq!(released.handed_to.as_deref(), Some("abc"));
        let released = parse_release(reply(0, "abc", 3)).unwrap();
        assert!(!released.held);
        assert_eq!(released.handed_to.as_deref(), Some("abc"));
        for (reply, held) in [(Value::Int(1), true), (Value::Int(0), false)] {
            let released = parse_release(reply).unwrap();
            assert_eq!(released.held, held);
            assert_eq!(released.handed_to, None);
        }
        assert!(parse_release(Value::Int(2)).is_err());
        assert!(parse_release(Value::Array(vec![Value::Int(1)])).is_err());
    }

    #[test]
    fn shared_functions_are_spliced_in_after_the_uncontended_path() {
        for lua in [&ACQUIRE, &RELEASE] {
            let (code, hash) = lua.code();
            let (uncontended, rest) = lua.source.split_once("--!common\n").unwrap();
            assert!(uncontended.contains("return"), "{uncontended}");
            assert!(!uncontended.contains("local function"), "{uncontended}");
            let spliced = [uncontended, include_str!("common.lua"), rest].concat();
            assert_eq!(code, &spliced);
            assert_eq!(hash.len(), 40);
        }
        assert_eq!(RENEW.code().0, include_str!("renew.lua"));
    }

    #[test]
    fn acquire_replies_are_a_fence_or_a_busy_answer() {
        assert!(matches!(
            parse_attempt(Value::Int(7)).unwrap(),
            Attempt::Granted(7)
        ));
        let busy = Value::Array(vec![Value::Int(1500), Value::Int(1)]);
        let Attempt::Busy { pttl, first } = parse_attempt(busy).unwrap() else {
            panic!("not busy");
        };
        assert_eq!((pttl, first), (Some(Duration::from_millis(1500)), true));
        let gone = Value::Array(vec![Value::Int(-2), Value::Int(0)]);
        assert!(matches!(
            parse_attempt(gone).unwrap(),
            Attempt::Busy { pttl: None, .. }
        ));
        assert!(parse_attempt(Value::Int(-1)).is_err());
        assert!(parse_attempt(Value::Nil).is_err());
    }

    #[cfg(feature = "redis-cluster")]
    #[test]
    fn slots_follow_the_hash_tag() {
        // Reference values from CLUSTER KEYSLOT.
        assert_eq!(cluster_slot(b"foo"), 12182);
        assert_eq!(
            cluster_slot(b"{user1000}.following"),
            cluster_slot(b"user1000")
        );
        assert_eq!(
            cluster_slot(b"dlock:{acct:42}:fence"),
            cluster_slot(b"acct:42")
        );
    }
}
