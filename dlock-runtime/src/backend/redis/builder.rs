//! The builder of a [`RedisBackend`] and the reading of its URL into what to connect to.

use std::sync::Arc;
use std::time::Duration;

use super::conn::{Connection, Timeouts};
use super::keys::KeyLayout;
use super::resent::Resent;
use super::subscriber::{self, Subscriber};
use super::{Inner, RedisBackend};
use crate::url::{bool_param, duration_param, mask_password, number_param, query_param, Scheme};
use crate::{LockError, Owner};

const DEFAULT_PREFIX: &str = "dlock:";
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);
const DEFAULT_LIVENESS: Duration = Duration::from_secs(3);

/// Options of a [`RedisBackend`], from [`RedisBackend::builder`].
///
/// ```
/// use std::time::Duration;
/// use dlock::backend::RedisBackend;
///
/// // No I/O until the first call.
/// let backend = RedisBackend::builder("redis://:secret@127.0.0.1:6379/0")?
///     .key_prefix("app:locks:")
///     .connect_timeout(Duration::from_secs(1))
///     .build()?;
/// assert_eq!(backend.lock_key("job:7"), "app:locks:{job:7}");
/// # Ok::<(), dlock::LockError>(())
/// ```
#[derive(Clone)]
#[must_use = "a builder does nothing until `build` or `connect`"]
pub struct RedisBuilder {
    url: String,
    prefix: String,
    connect_timeout: Duration,
    response_timeout: Duration,
    liveness: Duration,
    /// As set by [`min_replicas`](RedisBuilder::min_replicas); else the URL's, else 0.
    min_replicas: Option<usize>,
    allow_eviction: bool,
}

impl std::fmt::Debug for RedisBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBuilder")
            .field("url", &mask_password(&self.url))
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("liveness", &self.liveness)
            .field("min_replicas", &self.min_replicas)
            .field("allow_eviction", &self.allow_eviction)
            .finish()
    }
}

/// What to connect to. One per backend, cloned only to connect: its size does not matter.
#[derive(Clone)]
#[allow(clippy::large_enum_variant)]
pub(super) enum Target {
    Single(redis::Client),
    /// The cluster, and a client per node its URL names, for pub/sub.
    #[cfg(feature = "redis-cluster")]
    Cluster(redis::cluster::ClusterClient, Vec<redis::Client>),
}

impl RedisBuilder {
    /// Prepends `prefix` to every Redis key and channel of this backend (default `dlock:`): to
    /// keep the locks of two applications on one Redis apart, or to find them by pattern. A
    /// prefix holding an empty hash tag (`{}`) makes [`build`](Self::build) fail.
    ///
    /// ```
    /// use dlock::backend::RedisBackend;
    ///
    /// let backend = RedisBackend::builder("redis://127.0.0.1:6379")?.key_prefix("billing:").build()?;
    /// assert_eq!(backend.lock_key("acct:42"), "billing:{acct:42}");
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long connecting (TCP, TLS and AUTH) may take (default 3 s).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// use std::time::Duration;
    /// use dlock::backend::RedisBackend;
    ///
    /// // Fail a service's boot within a second when Redis is down.
    /// let backend = RedisBackend::builder("redis://10.0.0.7:6379")?
    ///     .connect_timeout(Duration::from_secs(1))
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long the server may take to answer a call (default 3 s). A call not answered in time
    /// fails with [`LockError::Backend`], or is first sent once more on a fresh connection where
    /// a second copy is harmless.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// use std::time::Duration;
    /// use dlock::backend::RedisBackend;
    ///
    /// let backend = RedisBackend::builder("redis://10.0.0.7:6379")?
    ///     .response_timeout(Duration::from_millis(500))
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How long a waiter stays in a key's queue without showing it is alive (default 3 s). A
    /// waiter refreshes it at least three times per window; a waiter whose process died is
    /// skipped once the window runs out. It is also the *claim window*: a release hands the
    /// lock to the first waiter for this window only (or the waiter's ttl where shorter), and
    /// the waiter, woken, claims it for its ttl; a lock handed to a waiter that died is free
    /// again after at most one window. Windows under 30 ms make [`build`](Self::build) fail.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// use std::time::Duration;
    /// use dlock::backend::RedisBackend;
    ///
    /// // Waiters of a crashed process hold up the queue for at most a second.
    /// let backend = RedisBackend::builder("redis://10.0.0.7:6379")?
    ///     .waiter_liveness(Duration::from_secs(1))
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
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
    /// rise across the fail-over whatever happens (see the [module documentation](super)). A
    /// fail-over that promotes a replica which had not acknowledged the last write — a
    /// configuration with more replicas than `n`, whose promotion picks another — can still
    /// forget it: ask for every replica that can be promoted.
    ///
    /// `Locker::connect` takes it from the URL too: `redis://host:6379/?min_replicas=1`.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::{backend::RedisBackend, Locker};
    ///
    /// // A primary with one replica that Sentinel may promote.
    /// let backend = RedisBackend::builder("redis://10.0.0.7:6379")?.min_replicas(1).connect().await?;
    /// let locker = Locker::with_backend(backend);
    /// // The same from a URL:
    /// let locker = Locker::connect("redis://10.0.0.7:6379/?min_replicas=1").await?;
    /// # Ok(()) }
    /// ```
    pub fn min_replicas(mut self, replicas: usize) -> Self {
        self.min_replicas = Some(replicas);
        self
    }

    /// Whether [`connect`](Self::connect) accepts a server that may evict keys when its memory
    /// runs short (default `false`): one with a `maxmemory` and a `maxmemory-policy` other than
    /// `noeviction` (managed Redis services default to `volatile-lru`). Every key dlock writes
    /// has an expiry, so such a server may drop a held lock under memory pressure, and the
    /// next caller then gets the key while its holder is still at work; fences still rise, so a
    /// fenced write of the evicted holder is refused. Give dlock a Redis whose policy is
    /// `noeviction` (one of its own, say) rather than turn this on.
    ///
    /// `Locker::connect` takes it from the URL too: `redis://host:6379/?allow_eviction=true`.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::backend::RedisBackend;
    ///
    /// // A shared cache whose eviction policy cannot be changed, its risk accepted.
    /// let backend = RedisBackend::builder("redis://cache.internal:6379")?
    ///     .allow_eviction(true)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn allow_eviction(mut self, allow: bool) -> Self {
        self.allow_eviction = allow;
        self
    }

    /// The backend, without connecting: the first call connects. For a backend made before its
    /// server can be reached, or where start-up must not wait on Redis.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidOptions`] where a [key prefix](Self::key_prefix) holds an empty hash
    /// tag `{}`, or the [waiter liveness](Self::waiter_liveness) is under 30 ms.
    ///
    /// ```
    /// use dlock::{backend::RedisBackend, Locker};
    ///
    /// // No I/O here: a Redis that is down fails the first lock, not this.
    /// let backend = RedisBackend::builder("redis://10.0.0.7:6379")?.build()?;
    /// let locker = Locker::with_backend(backend);
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    pub fn build(self) -> Result<RedisBackend, LockError> {
        let masked: Arc<str> = mask_password(&self.url).into();
        let invalid = |reason: String| LockError::invalid_url(&self.url, reason);
        if self.liveness < Duration::from_millis(30) {
            return Err(LockError::InvalidOptions {
                reason: format!("waiter liveness {:?} is shorter than 30ms", self.liveness),
            });
        }
        let layout = KeyLayout::new(self.prefix)?;
        let target = parse_target(&self.url, self.connect_timeout, self.response_timeout)
            .map_err(invalid)?;
        let min_replicas = match self.min_replicas {
            Some(replicas) => replicas,
            None => url_min_replicas(&self.url)?.unwrap_or(0),
        };
        let (subscribe_on, cluster) = match &target {
            Target::Single(client) => (vec![client.clone()], false),
            #[cfg(feature = "redis-cluster")]
            Target::Cluster(_, nodes) => (nodes.clone(), true),
        };
        let timeouts = Timeouts {
            connect: self.connect_timeout,
            response: self.response_timeout,
        };
        let instance = String::from_utf8_lossy(&Owner::random().hex()[..16]).into_owned();
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                conn: Connection::new(target, timeouts, masked),
                subscriber: Subscriber::new(
                    subscribe_on,
                    self.connect_timeout.max(self.response_timeout),
                    subscriber::channel_of(layout.prefix(), &instance),
                ),
                instance,
                layout,
                liveness: self.liveness,
                cluster,
                min_replicas,
                response_timeout: self.response_timeout,
                cleanups: Arc::default(),
                resent: Resent::default(),
            }),
        })
    }

    /// The backend, connected: fails at once when the server cannot be reached or refuses the
    /// credentials.
    ///
    /// # Errors
    ///
    /// As [`build`](Self::build), and [`LockError::Backend`] where the server cannot be reached
    /// within the [connect timeout](Self::connect_timeout), refuses the credentials, does not
    /// answer within the [response timeout](Self::response_timeout), or is older than Redis 6.2;
    /// [`LockError::InvalidOptions`] where it may evict keys (see
    /// [`allow_eviction`](Self::allow_eviction)), or where the user may not publish on the
    /// lock channels (an ACL user without `&<prefix>*` or `allchannels`).
    ///
    /// # Cancel safety
    ///
    /// If this future is dropped, the attempt is abandoned: no backend exists, and its
    /// connection is dropped.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::{backend::RedisBackend, Locker};
    ///
    /// let backend = RedisBackend::builder("redis://:secret@10.0.0.7:6379/0")?
    ///     .key_prefix("billing:")
    ///     .connect()
    ///     .await?;
    /// let locker = Locker::with_backend(backend);
    /// # Ok(()) }
    /// ```
    pub async fn connect(self) -> Result<RedisBackend, LockError> {
        let allow_eviction = self.allow_eviction;
        let backend = self.build()?;
        backend.ping().await?;
        if !allow_eviction {
            backend.refuse_eviction().await?;
        }
        backend.refuse_unpublishable().await?;
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
    let cluster = match Scheme::of(url) {
        Some(Scheme::Redis) => false,
        Some(Scheme::RedisCluster) => true,
        _ => {
            return Err(
                "the scheme must be redis://, rediss://, redis+cluster:// or rediss+cluster://"
                    .into(),
            )
        }
    };
    // `rediss://` and `rediss+cluster://`.
    let tls = scheme.starts_with("rediss");
    if tls && !cfg!(feature = "redis-tls") {
        return Err("rediss:// needs TLS: enable dlock's `redis-tls` feature in Cargo.toml".into());
    }
    // Several hosts (`a:1,b:2`) name the nodes a cluster is reached through.
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
        let nodes = hosts
            .iter()
            .map(|host| open(&node_url(host)))
            .collect::<Result<Vec<_>, _>>()?;
        let client = redis::cluster::ClusterClient::builder(
            nodes.iter().map(|c| c.get_connection_info().clone()),
        )
        .connection_timeout(connect_timeout)
        .response_timeout(response_timeout)
        .build()
        .map_err(|e| e.to_string())?;
        Ok(Target::Cluster(client, nodes))
    }
    #[cfg(not(feature = "redis-cluster"))]
    {
        let _ = (connect_timeout, response_timeout);
        Err("Redis Cluster (several hosts, or redis+cluster://) needs dlock's `redis-cluster` feature".into())
    }
}

/// The `min_replicas` of `url`'s query, if it has one.
fn url_min_replicas(url: &str) -> Result<Option<usize>, LockError> {
    number_param(url, "min_replicas")
}

impl RedisBackend {
    /// Options for a backend on `url`: `redis://[[user]:password@]host[:port][/db]`,
    /// `rediss://…` (with the `redis-tls` feature), or with the `redis-cluster` feature
    /// `redis+cluster://host:port,host:port` (see the [module documentation](super)).
    ///
    /// The URL's query may hold the options below, so that a deployment configures the lock
    /// store with one variable; a method of the builder called later overrides them:
    /// `key_prefix=app:locks:`, `connect_timeout=1s`, `response_timeout=2s`,
    /// `waiter_liveness=3s`, `min_replicas=1`, `allow_eviction=true` (durations as the attribute
    /// writes them). Other
    /// parameters are the Redis client's (`protocol=resp3`).
    ///
    /// ```
    /// use dlock::backend::RedisBackend;
    ///
    /// let url = "redis://127.0.0.1:6379/0?key_prefix=billing:&response_timeout=500ms";
    /// let backend = RedisBackend::builder(url)?.build()?;
    /// assert_eq!(backend.lock_key("job:7"), "billing:{job:7}");
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidUrl`] where `url` is not such a URL, or names a kind of Redis this
    /// build lacks the feature for. Nothing is connected yet.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dlock::{backend::RedisBackend, LockError};
    ///
    /// let builder = RedisBackend::builder("redis://:secret@10.0.0.7:6379/0")?
    ///     .response_timeout(Duration::from_secs(1));
    /// // A bad URL fails here, with its password masked:
    /// let error = RedisBackend::builder("redis//:secret@10.0.0.7").unwrap_err();
    /// assert!(matches!(error, LockError::InvalidUrl { .. }));
    /// assert!(!error.to_string().contains("secret"));
    /// # Ok::<(), LockError>(())
    /// ```
    pub fn builder(url: &str) -> Result<RedisBuilder, LockError> {
        let invalid = |reason: String| LockError::invalid_url(url, reason);
        // Checked now, so a bad URL fails where it is given; parsed again with the timeouts
        // the builder ends up with.
        parse_target(url, DEFAULT_TIMEOUT, DEFAULT_TIMEOUT).map_err(invalid)?;
        url_min_replicas(url)?;
        Ok(RedisBuilder {
            url: url.to_owned(),
            prefix: query_param(url, "key_prefix")
                .unwrap_or(DEFAULT_PREFIX)
                .to_owned(),
            connect_timeout: duration_param(url, "connect_timeout")?.unwrap_or(DEFAULT_TIMEOUT),
            response_timeout: duration_param(url, "response_timeout")?.unwrap_or(DEFAULT_TIMEOUT),
            liveness: duration_param(url, "waiter_liveness")?.unwrap_or(DEFAULT_LIVENESS),
            min_replicas: None,
            allow_eviction: bool_param(url, "allow_eviction")?.unwrap_or(false),
        })
    }

    /// A backend on `url` with the default options, connected: the same as
    /// [`Locker::connect`](crate::Locker::connect) with a Redis URL, as a backend to wrap or to
    /// hand to [`Locker::with_backend`](crate::Locker::with_backend).
    ///
    /// # Errors
    ///
    /// As [`builder`](Self::builder) and [`RedisBuilder::connect`].
    ///
    /// # Cancel safety
    ///
    /// If this future is dropped, the attempt is abandoned: no backend exists, and its
    /// connection is dropped.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = dlock::backend::RedisBackend::connect("redis://127.0.0.1:6379").await?;
    /// let locker = dlock::Locker::with_backend(backend);
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<RedisBackend, LockError> {
        Self::builder(url)?.connect().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_without_io() {
        assert!(RedisBackend::builder("redis://:pw@localhost:6380/2")
            .unwrap()
            .build()
            .is_ok());
        assert!(matches!(
            RedisBackend::builder("http://localhost"),
            Err(LockError::InvalidUrl { .. })
        ));
        let error = RedisBackend::builder("redis://:secret@a:1,b:2").map(drop);
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
            .unwrap_err()
            .to_string()
            .contains("redis-tls"));
    }

    #[test]
    fn min_replicas_comes_from_the_builder_or_else_the_url() {
        let min_replicas = |builder: Result<RedisBuilder, LockError>| {
            builder.unwrap().build().unwrap().inner.min_replicas
        };
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
            min_replicas(
                RedisBackend::builder("redis://h/?min_replicas=2").map(|b| b.min_replicas(0))
            ),
            0
        );
        let error = RedisBackend::builder("redis://:secret@h/?min_replicas=all")
            .map(drop)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("min_replicas") && !error.contains("secret"),
            "{error}"
        );
    }
}
