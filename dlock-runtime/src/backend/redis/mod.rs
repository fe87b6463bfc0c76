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
//! `redis://[[user]:password@]host[:port][/db]`, as redis-rs reads it: `redis://:secret@host`
//! authenticates with a password, `redis://user:secret@host` as an ACL user. `rediss://` is the
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
//! Redis replicates asynchronously: a lock granted by a primary that fails before replicating it
//! can be granted again by the promoted replica, and a fence counter that had not reached the
//! replica counts again from an older value — which the clock floor lifts past every fence the
//! old primary handed out. Mutual exclusion holds as long as the store keeps its writes; fences
//! are what protect the data when it does not — pass them to the protected store.

mod conn;
mod subscriber;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisResult, ServerErrorKind, Value};

use self::conn::{Conn, Connection, Timeouts};
use self::subscriber::{Subscriber, Subscription};
use super::{AcquireRequest, Acquired, Backend, Renewal};
use crate::locker::mask_password;
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
}

impl std::fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackendBuilder")
            .field("url", &mask_password(&self.url))
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("liveness", &self.liveness)
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
        let reply = self
            .inner
            .conn
            .run("acquire", |conn| eval(conn, &ACQUIRE, &script_keys, args))
            .await?;
        parse_attempt(reply).map_err(|reason| self.inner.conn.error("acquire", reason))
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

/// Renews `leases` in one pipeline on `conn`: one round trip (two where the server had to be
/// taught the script).
async fn renew_pipelined(mut conn: Conn, leases: &[(&str, &str, u64)]) -> RedisResult<Vec<bool>> {
    let pipeline = |by_hash: bool| {
        let mut pipe = redis::pipe();
        for &(lock, owner, ttl) in leases {
            pipe.add_command(RENEW.cmd(by_hash, &[lock], &[Arg::Text(owner), Arg::Number(ttl)]));
        }
        pipe
    };
    let mut replies = conn
        .req_packed_commands(&pipeline(true), 0, leases.len())
        .await?;
    let noscript =
        |value: &Value| matches!(value.clone().extract_error(), Err(error) if is_noscript(&error));
    if replies.iter().any(noscript) {
        replies = conn
            .req_packed_commands(&pipeline(false), 0, leases.len())
            .await?;
    }
    replies
        .into_iter()
        .map(|reply| match reply.extract_error()? {
            Value::Int(held) => Ok(held == 1),
            other => Err(unexpected(&other)),
        })
        .collect()
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
        }
    }

    async fn release(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
        self.release_or_leave(key, owner).await
    }

    async fn renew(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
        if leases.is_empty() {
            return Ok(Vec::new());
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
        if !self.inner.cluster {
            let batch: Vec<_> = args.iter().map(renew_batch_entry).collect();
            return self
                .inner
                .conn
                .run("renew", |conn| renew_pipelined(conn, &batch))
                .await;
        }
        #[cfg(feature = "redis-cluster")]
        {
            let (held, error) = self.renew_by_slot(&args).await;
            match error {
                Some(error) => Err(error),
                None => Ok(held.into_iter().map(|held| held == Some(true)).collect()),
            }
        }
        #[cfg(not(feature = "redis-cluster"))]
        unreachable!("a cluster backend needs the redis-cluster feature")
    }

    async fn renew_each(&self, leases: &[Renewal<'_>]) -> Result<Vec<Option<bool>>, LockError> {
        #[cfg(feature = "redis-cluster")]
        if self.inner.cluster && !leases.is_empty() {
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
            // Per slot: a node down costs the leases on its slots, not the others'.
            let (held, error) = self.renew_by_slot(&args).await;
            return match error {
                Some(error) if held.iter().all(Option::is_none) => Err(error),
                Some(error) => {
                    tracing::warn!(%error, "distributed_lock: renewal failed on part of the cluster; retrying those leases");
                    Ok(held)
                }
                None => Ok(held),
            };
        }
        Ok(self.renew(leases).await?.into_iter().map(Some).collect())
    }
}

#[cfg(feature = "redis-cluster")]
impl RedisBackend {
    /// Renews on a cluster: one pipeline per hash slot (a cluster pipeline cannot span slots),
    /// all sent at once. Answers per lease, `None` for the leases of a slot that failed, with
    /// the first failure.
    async fn renew_by_slot(&self, args: &[RenewArgs]) -> (Vec<Option<bool>>, Option<LockError>) {
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
                .run("renew", |conn| renew_pipelined(conn, &batch));
            let held = match tokio::time::timeout(bound, renewed).await {
                Ok(held) => held?,
                Err(_) => {
                    return Err(LockError::backend(format!(
                        "redis cluster: renewing a slot's leases took longer than {bound:?}"
                    )))
                }
            };
            Ok::<_, LockError>(indices.into_iter().zip(held).collect::<Vec<_>>())
        });
        let mut answers = vec![None; args.len()];
        let mut first_error = None;
        for result in futures_util::future::join_all(calls).await {
            match result {
                Ok(held) => {
                    for (index, held) in held {
                        answers[index] = Some(held);
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
