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
//! | `P{K}:fences` | integer, no expiry | the last fence handed out (`INCR`, never below the server's clock in µs); while `P{K}` holds an owner, the fence of that owner's grant |
//! | `P{K}:q` | list, expires when idle | the owners waiting for the lock, in arrival order |
//! | `P{K}:w:<owner>` | string, with PX | one waiter's liveness: `<ttl in ms> <backend id>`, kept alive while it waits |
//! | `P{K}:ch` | pub/sub channel | `<owner> <fence>`: the owner a release handed the lock to, and its fence |
//!
//! So `redis-cli GET 'dlock:{acct:42}'` shows who holds `acct:42`. Rendered keys never contain
//! `{` or `}` from placeholder values, which are percent-encoded; a brace written in a key
//! template's literal text still works (all keys of one lock keep sharing one slot, and two
//! locks never share a key), but the hash tag then ends at the first `}`. A prefix that holds a
//! hash tag itself (say `{dlock}:`) puts every lock in one slot.
//!
//! The fence counter never expires, so that fences keep increasing across releases, expiries and
//! restarts of clients: it costs one small key per distinct lock key ever used. A grant's fence is
//! one more than the last and never below the server's clock in microseconds, so fences keep
//! rising even where Redis loses the counter (a restart without persistence, an older snapshot
//! restored, a fail-over to a replica that missed writes), as long as the clock of the server
//! that grants does not lag the one before by more than the time between the two grants. Run
//! Redis with a `maxmemory-policy` that never evicts keys without a ttl (`noeviction` or a
//! `volatile-*` policy).
//!
//! Leases are another matter: a restart forgets every lease unless Redis keeps them —
//! `appendonly yes` with `appendfsync always` restores each lock with its expiry (the
//! configuration `tests/faults.rs` restarts under load). Without it, a newcomer can get a key
//! whose holder is still in its body until that holder's next renewal finds the lease gone
//! (at most ttl/3): fences are what protect the data then.
//!
//! # Round trips
//!
//! - Acquire is one Lua script (`SET NX PX` in effect, plus the fence's `INCR`): one round trip.
//!   Uncontended, it runs three commands: an `EXISTS` of the lock and its queue together, the
//!   `INCR` and the `SET`. It is idempotent for its owner: where the lock already holds the owner,
//!   it extends it to the full ttl and answers the same fence (the counter's value: every grant
//!   counts its fence and sets the lock in one step), so a call retried after a lost reply is
//!   harmless.
//! - Release is one script: compare-and-delete, hand-off to the first live waiter, `PUBLISH`.
//!   Where nobody waits, that is a `GET`, an `LPOP` that finds no queue, and a `DEL`.
//!
//! Each script runs its uncontended path before it defines the functions the other paths share
//! (common.lua is spliced in after it), and takes only the names it needs: Redis spends about as
//! long on a script's overhead as on a plain `SET`, so every command and argument saved shows.
//!   A waiter handed the lock holds it when the message (or, in the releasing process, the
//!   release's reply) reaches it: a contended hand-off costs the release's round trip and no
//!   other.
//! - Renewal is one compare-and-`PEXPIRE` script per lease, all leases of a `renew` call in one
//!   pipeline: one round trip per watchdog tick, whatever the number of leases. (On a cluster,
//!   one pipeline per hash slot, sent concurrently.)
//!
//! Scripts are sent by `EVALSHA`, falling back to `EVAL` where the server has not seen them yet
//! (after a restart, say). They need Redis 6.2 or later (`GETDEL`, `LPOS`).
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
//!    ttl and its backend's id, with a PX of the *liveness window*).
//! 3. A release hands the lock straight to the first live waiter, for that waiter's full ttl
//!    (read from its waiter key): the lock is set to the waiter's owner with that PX, a fresh
//!    fence is counted for it, and `<owner> <fence>` is published on the channel. (Where nobody
//!    waits, the lock is deleted.) Waiters whose waiter key expired (their process died) are skipped and dropped.
//!    The release script answers the owner and fence it handed the lock to; where that owner
//!    waits on the releasing backend (the same process), it is woken at once, in-process, with
//!    the fence, and the script publishes nothing: each waiter key names the backend its waiter
//!    waits on, and a release names its own. (Should the release's reply be lost, that waiter
//!    finds the lock its own at its next fallback poll.)
//! 4. The waiter told of a hand-off to its owner returns the lease at once, with the fence it
//!    was given. The lease's validity counts from the send time of the waiter's last acquire
//!    call, the one that answered busy: every busy answer carries the last fence handed out for
//!    the key, and a hand-off whose fence is greater ran after that call, so the server started
//!    the ttl after the call was sent. A hand-off whose fence is not greater (its message was
//!    overtaken by a later look at the key, and its lease may be gone), or one that would leave
//!    the lease less than half its ttl of validity counted from that send time (the waiter was
//!    slow to run), is confirmed first by one more acquire call, which finds the lock already
//!    the owner's, extends it to the full ttl and answers its fence; the validity then counts
//!    from that call's send time.
//!
//! While waiting, a waiter re-runs the acquire script on a timer — jittered exponential back-off
//! up to a third of the liveness window — which keeps its waiter key alive and is the fallback
//! for a missed message: it finds the lock its owner's and takes it as in step 4's confirmation.
//! The head of the queue also wakes when the holder's PTTL runs out, since a holder that expired
//! without releasing hands nothing on; any acquire call that finds the lock free with live
//! waiters hands it to the first of them. A waiter that gives up (its `wait` ran out) makes a
//! last attempt and leaves the queue in the same script; a waiter whose future is dropped leaves
//! the queue (or, if the lock was handed to it meanwhile, releases it with hand-off) from dlock's
//! background runtime. A waiter whose process died within the liveness window before its turn
//! is handed the lock all the same, which then stays blocked for that waiter's ttl, as it would
//! for a holder that died.
//!
//! Messages from a release by an older dlock name the owner alone: the waiter confirms them
//! with one acquire call. A waiter of an older dlock does not recognise `<owner> <fence>` and
//! finds the hand-off at its next fallback poll.
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
use crate::{background, clock, LockError, Owner};

const DEFAULT_PREFIX: &str = "dlock:";
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
    /// skipped once the window runs out, and a lock handed to a waiter that died is free again
    /// after at most one window.
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
    fn lock_name(&self, key: &str, suffix: &str) -> String {
        let prefix = &self.inner.prefix;
        let mut name = String::with_capacity(prefix.len() + key.len() + 2 + suffix.len());
        name.push_str(prefix);
        name.push('{');
        name.push_str(key);
        name.push('}');
        name.push_str(suffix);
        name
    }

    /// The Redis key that counts the fences of `key`: an integer, the last fence handed out. It
    /// never expires.
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
        if let Some((head, fence)) = &released.handed_to {
            // A waiter of this process need not wait for the published message. It holds the
            // lock now: let it run before this caller goes on (to queue for the key again, say),
            // so that its first request is not sent behind the caller's.
            if self
                .inner
                .subscriber
                .grant_local(&keys.channel(), head, *fence)
            {
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
                Attempt::Busy { pttl, first, fence } => {
                    let now = Instant::now();
                    let mut until = (now + backoff.next()).min(deadline);
                    if let (true, Some(pttl)) = (first, pttl) {
                        // The head also watches the holder's expiry, which hands nothing on.
                        until = until.min(now + pttl);
                    }
                    tokio::select! {
                        () = subscription.woken() => {}
                        () = tokio::time::sleep_until(until.into()) => {}
                    }
                    // A hand-off to this owner with a greater fence than this answer saw ran
                    // after this call, and started the lease's ttl later than `sent_at`: the
                    // lease is ours and valid from then, with no more round trips.
                    let granted = subscription.granted();
                    let now = Instant::now();
                    if let Some(acquired) = handed_over(granted, (sent_at, fence), request.ttl, now)
                    {
                        guard.armed = false;
                        return Ok(Some(acquired));
                    }
                    // Else the next acquire call looks again, and confirms a hand-off that leaves
                    // too little validity (or whose message was missed): it finds the lock its
                    // owner's, extends it to the full ttl and answers the fence.
                }
            }
        }
    }
}

/// The lease a hand-off gave this waiter without another round trip, where it can be trusted.
/// `last_busy` is the send time of the waiter's last acquire call, which answered busy, and the
/// last fence handed out for the key when it ran. Where `granted` (the fence a hand-off to this
/// owner carried) is greater, the hand-off ran after that call, and its ttl started after the
/// call's send time, which is then the lease's `valid_from`. `None` (confirm with an acquire
/// call) when there is no such hand-off — none came, or the one that came is older than that
/// call, and its lease may be gone — or when less than half the ttl of validity, counted from
/// that send time, would remain.
fn handed_over(
    granted: Option<u64>,
    last_busy: (Instant, u64),
    ttl: Duration,
    now: Instant,
) -> Option<Acquired> {
    let (fence, (valid_from, seen)) = (granted?, last_busy);
    if fence <= seen {
        return None;
    }
    let valid_until = valid_from + ttl.saturating_sub(clock::safety_margin(ttl));
    (valid_until.saturating_duration_since(now) >= ttl / 2)
        .then_some(Acquired { fence, valid_from })
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
    /// heads the queue, `fence` the last fence handed out for the key when the call ran.
    Busy {
        pttl: Option<Duration>,
        first: bool,
        fence: u64,
    },
}

/// What one run of the release script said.
#[derive(Debug)]
struct Released {
    /// Whether the owner held the lock.
    held: bool,
    /// The owner the lock was handed to, and that hand-off's fence.
    handed_to: Option<(String, u64)>,
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
            let [Value::Int(n), Value::BulkString(head), Value::Int(fence)] = items.as_slice()
            else {
                return Err(unexpected(&reply));
            };
            let head = std::str::from_utf8(head).map_err(|_| unexpected(&reply))?;
            let fence = u64::try_from(*fence).map_err(|_| unexpected(&reply))?;
            Ok(Released {
                held: held(*n)?,
                handed_to: Some((head.to_owned(), fence)),
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
            let [Value::Int(pttl), Value::Int(first), Value::Int(fence)] = items.as_slice() else {
                return Err(unexpected(&reply));
            };
            Ok(Attempt::Busy {
                // Negative where the caller does not head the queue (only the head is told), the
                // lock has no ttl (-1), or it is gone (-2).
                pttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
                first: *first == 1,
                fence: u64::try_from(*fence).map_err(|_| unexpected(&reply))?,
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
            self.renew_by_slot(&args).await
        }
        #[cfg(not(feature = "redis-cluster"))]
        unreachable!("a cluster backend needs the redis-cluster feature")
    }
}

#[cfg(feature = "redis-cluster")]
impl RedisBackend {
    /// Renews on a cluster: one pipeline per hash slot (a cluster pipeline cannot span slots),
    /// all sent at once.
    async fn renew_by_slot(&self, args: &[RenewArgs]) -> Result<Vec<bool>, LockError> {
        let mut by_slot: std::collections::BTreeMap<u16, Vec<usize>> =
            std::collections::BTreeMap::new();
        for (index, (lock, _, _)) in args.iter().enumerate() {
            by_slot
                .entry(cluster_slot(lock.as_bytes()))
                .or_default()
                .push(index);
        }
        let calls = by_slot.into_values().map(|indices| async move {
            let batch: Vec<_> = indices
                .iter()
                .map(|&i| renew_batch_entry(&args[i]))
                .collect();
            let held = self
                .inner
                .conn
                .run("renew", |conn| renew_pipelined(conn, &batch))
                .await?;
            Ok::<_, LockError>(indices.into_iter().zip(held).collect::<Vec<_>>())
        });
        let mut answers = vec![false; args.len()];
        for result in futures_util::future::join_all(calls).await {
            for (index, held) in result? {
                answers[index] = held;
            }
        }
        Ok(answers)
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
    fn a_hand_off_counts_from_the_last_busy_answer_only_where_it_came_after_it() {
        let ttl = Duration::from_secs(10);
        let busy_sent = Instant::now();
        let soon = busy_sent + Duration::from_millis(5);
        // A hand-off after the busy answer (which saw fence 7): valid from the answer's send time.
        assert_eq!(
            handed_over(Some(8), (busy_sent, 7), ttl, soon),
            Some(Acquired {
                fence: 8,
                valid_from: busy_sent
            })
        );
        // No hand-off, or one that ran before the busy answer: its lease may be gone; confirm.
        assert_eq!(handed_over(None, (busy_sent, 7), ttl, soon), None);
        assert_eq!(handed_over(Some(7), (busy_sent, 7), ttl, soon), None);
        assert_eq!(handed_over(Some(3), (busy_sent, 7), ttl, soon), None);
        // Half the ttl of validity left (9 s from the answer, 4 s in): still taken as it is.
        let four_in = busy_sent + Duration::from_secs(4);
        assert!(handed_over(Some(8), (busy_sent, 7), ttl, four_in).is_some());
        // Less than half left: confirm.
        let four_and_a_bit_in = four_in + Duration::from_millis(1);
        assert_eq!(
            handed_over(Some(8), (busy_sent, 7), ttl, four_and_a_bit_in),
            None
        );
        assert_eq!(
            handed_over(Some(8), (busy_sent, 7), ttl, busy_sent + ttl * 2),
            None
        );
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
        assert_eq!(released.handed_to, Some(("abc".to_owned(), 9)));
        let released = parse_release(reply(0, "abc", 3)).unwrap();
        assert!(!released.held);
        assert_eq!(released.handed_to, Some(("abc".to_owned(), 3)));
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
        let busy = Value::Array(vec![Value::Int(1500), Value::Int(1), Value::Int(7)]);
        let Attempt::Busy { pttl, first, fence } = parse_attempt(busy).unwrap() else {
            panic!("not busy");
        };
        assert_eq!(
            (pttl, first, fence),
            (Some(Duration::from_millis(1500)), true, 7)
        );
        let gone = Value::Array(vec![Value::Int(-2), Value::Int(0), Value::Int(7)]);
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
