//! The options of a [`ZookeeperBackend`]: the URL (hosts, chroot and settings), the root, the
//! session timeout, the connect time-out and the ensemble's tick; and the connection that opens
//! the session and makes the root.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::claim::MIN_CLAIM_WINDOW;
use super::paths::check_path;
use super::session::open;
use super::{
    Shared, ZookeeperBackend, DEFAULT_CLAIM_WINDOW, DEFAULT_ROOT, DEFAULT_SESSION_TIMEOUT,
    DEFAULT_TICK_TIME, PERSISTENT,
};
use crate::url::{duration_param, query_param, Scheme};
use crate::LockError;

/// How long [`ZookeeperBuilder::connect`] waits for a session, unless told otherwise.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Options of a [`ZookeeperBackend`], from [`ZookeeperBackend::builder`].
///
/// The URL may carry the same settings as query parameters, which a method called later
/// overrides: `root`, `session_timeout`, `connect_timeout`, `tick_time` and `claim_window`.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
/// use std::time::Duration;
/// use dlock::backend::ZookeeperBackend;
///
/// let backend = ZookeeperBackend::builder("zk://zk1:2181,zk2:2181/apps/orders?root=/locks")?
///     .session_timeout(Duration::from_secs(20))
///     .connect_timeout(Duration::from_secs(2))
///     .connect()
///     .await?;
/// assert_eq!(backend.root(), "/apps/orders/locks");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `connect`"]
pub struct ZookeeperBuilder {
    hosts: String,
    chroot: String,
    root: String,
    session_timeout: Duration,
    connect_timeout: Duration,
    tick_time: Duration,
    claim_window: Duration,
}

impl ZookeeperBuilder {
    /// Options for a connection to `url`: `zk://host:port[,host:port…][/chroot][?settings]`,
    /// the chroot and the settings checked here, the chroot created on connection. A URL with
    /// user information (any `@`) is refused: dlock sends ZooKeeper no credentials, and a
    /// password kept in the host list would be printed by every connection error.
    pub(super) fn from_url(url: &str) -> Result<ZookeeperBuilder, LockError> {
        let invalid = |reason: &str| LockError::invalid_url(url, reason);
        let rest = match url.split_once("://") {
            Some((_, rest)) if Scheme::of(url) == Some(Scheme::Zookeeper) => rest,
            _ => return Err(invalid("expected zk://host:port[,host:port][/chroot]")),
        };
        // Anywhere in the URL, not only before the first `/`: a password holding `/`, `?` or
        // `#` would end the host list early and leave a piece of itself in the hosts, which
        // errors print. (The masking of `InvalidUrl` hides what runs up to the last `@`.)
        if rest.contains('@') {
            return Err(invalid(
                "ZooKeeper URLs carry no credentials: `user:password@` (or any `@`) has no \
                 place in a zk:// URL, and dlock opens ZooKeeper sessions without \
                 authentication (it has no digest or SASL option); write \
                 zk://host:port[,host:port][/chroot], and restrict the nodes with ACLs or the \
                 network",
            ));
        }
        let rest = rest.split(['?', '#']).next().unwrap_or(rest);
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
        let root = query_param(url, "root").unwrap_or(DEFAULT_ROOT);
        check_path(root).map_err(|reason| invalid(&format!("root {reason}")))?;
        Ok(ZookeeperBuilder {
            hosts: hosts.to_owned(),
            chroot: chroot.to_owned(),
            root: root.to_owned(),
            session_timeout: duration_param(url, "session_timeout")?
                .unwrap_or(DEFAULT_SESSION_TIMEOUT),
            connect_timeout: duration_param(url, "connect_timeout")?
                .unwrap_or(DEFAULT_CONNECT_TIMEOUT),
            tick_time: duration_param(url, "tick_time")?.unwrap_or(DEFAULT_TICK_TIME),
            claim_window: duration_param(url, "claim_window")?.unwrap_or(DEFAULT_CLAIM_WINDOW),
        })
    }

    /// The path under which the per-key parents live (default `/dlock`), below the URL's chroot.
    /// Created if missing.
    ///
    /// ```
    /// # use dlock::backend::ZookeeperBackend;
    /// let builder = ZookeeperBackend::builder("zk://zk1:2181/apps/orders")?.root("/locks");
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    pub fn root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into();
        self
    }

    /// The session timeout to ask of the ensemble (default 30 s). The ensemble grants a value
    /// within its `minSessionTimeout` and `maxSessionTimeout` (by default 2 and 20 tick times);
    /// a lease's ttl may be at most two thirds of the granted value less a tick (see
    /// [`ZookeeperBackend::ttl_limit`]).
    ///
    /// Every server of the ensemble must grant the same value: give them all the same
    /// `tickTime`, `minSessionTimeout` and `maxSessionTimeout`. A session that reconnects to
    /// another server is granted that server's value, and the ensemble counts it by that from
    /// then on; the client goes on reporting the value granted when the session was opened, so
    /// dlock would go on trusting leases for as long as the first server's timeout allows,
    /// possibly after the ensemble expired the session and gave their keys to others.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use dlock::backend::ZookeeperBackend;
    /// // Leases of up to 2/3 × 45 s − 2 s = 28 s, if the ensemble grants 45 s.
    /// let builder = ZookeeperBackend::builder("zk://zk1:2181")?
    ///     .session_timeout(Duration::from_secs(45));
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// How long [`connect`](Self::connect) waits for the ensemble to open a session (default
    /// 5 s) before it fails, so a service's boot fails fast when ZooKeeper is out of reach.
    /// Every host of the URL is tried within it.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use dlock::backend::ZookeeperBackend;
    /// let builder = ZookeeperBackend::builder("zk://zk1:2181,zk2:2181")?
    ///     .connect_timeout(Duration::from_secs(1));
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The ensemble's `tickTime` (default 2 s, ZooKeeper's default): the client cannot ask the
    /// ensemble for it, and it enters the longest safe ttl
    /// ([`ZookeeperBackend::ttl_limit`]). A value larger than the real tick only shortens the
    /// leases; a smaller one makes them unsafe.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use dlock::backend::ZookeeperBackend;
    /// // An ensemble configured with tickTime=500.
    /// let builder = ZookeeperBackend::builder("zk://zk1:2181")?
    ///     .tick_time(Duration::from_millis(500));
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    pub fn tick_time(mut self, tick: Duration) -> Self {
        self.tick_time = tick;
        self
    }

    /// How long a key handed to a waiter waits for the waiter to claim it (default 3 s), as
    /// with Redis's [waiter liveness](crate::backend::RedisBuilder::waiter_liveness). An
    /// acquisition runs on dlock's background runtime, so the queue moves on whether or not the
    /// caller's future is polled; when the key comes to it, the waiter has this long (or its
    /// ttl, where shorter) to take it. A waiter whose caller stalled (a runtime blocked by
    /// synchronous code, a future parked in a `select!` that no longer polls it) then costs
    /// the next waiter this window, not the time until its caller comes back; that caller,
    /// polled again, queues again for what is left of its wait. A window under 30 ms makes
    /// [`connect`](Self::connect) fail.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use dlock::backend::ZookeeperBackend;
    /// // A waiter that is not polled holds up the queue for at most a second.
    /// let builder = ZookeeperBackend::builder("zk://zk1:2181")?
    ///     .claim_window(Duration::from_secs(1));
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    pub fn claim_window(mut self, window: Duration) -> Self {
        self.claim_window = window;
        self
    }

    /// Opens the session (so an unreachable ensemble is reported here) and creates the root.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidOptions`] for a root that is not a ZooKeeper path or a
    /// [claim window](Self::claim_window) under 30 ms;
    /// [`LockError::Backend`] when no host opens a session within the
    /// [connect timeout](Self::connect_timeout), or the root cannot be created.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future takes no lock and holds no key: it may be called again.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::{backend::ZookeeperBackend, Locker};
    ///
    /// let backend = ZookeeperBackend::builder("zk://zk1:2181,zk2:2181,zk3:2181")?
    ///     .connect()
    ///     .await?;
    /// let locker = Locker::with_backend(backend);
    /// # Ok(()) }
    /// ```
    pub async fn connect(self) -> Result<ZookeeperBackend, LockError> {
        check_path(&self.root).map_err(|reason| LockError::InvalidOptions {
            reason: format!("root {reason}"),
        })?;
        if self.claim_window < MIN_CLAIM_WINDOW {
            return Err(LockError::InvalidOptions {
                reason: format!(
                    "claim window {:?} is shorter than {MIN_CLAIM_WINDOW:?}",
                    self.claim_window
                ),
            });
        }
        let base = format!("{}{}", self.chroot, self.root);
        let session = tokio::time::timeout(
            self.connect_timeout,
            open(&self.hosts, self.session_timeout),
        )
        .await
        .map_err(|_| {
            LockError::backend(format!(
                "no ZooKeeper server of {} opened a session within {:?} (the connect timeout)",
                self.hosts, self.connect_timeout
            ))
        })??;
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
                claim_window: self.claim_window,
                session: Mutex::new(session),
                reconnecting: tokio::sync::Mutex::new(()),
                held: Mutex::default(),
                watch_events: AtomicU64::new(0),
                cleanups: Arc::default(),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::ZookeeperBackend;

    #[test]
    fn urls_are_checked() {
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
            "zk://a:1?connect_timeout=soon",
            "zk://a:1?claim_window=soon",
            "zk://a:1?root=locks",
            "zk://app:s3cret@a:1",
            "zk://app@a:1",
            "zk://app:pa/ss@a:1",
        ] {
            assert!(ZookeeperBackend::builder(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn a_claim_window_under_30_ms_is_refused_before_connecting() {
        let builder = ZookeeperBackend::builder("zk://127.0.0.1:1").unwrap();
        assert_eq!(builder.claim_window, Duration::from_secs(3));
        let refused = builder
            .claim_window(Duration::from_millis(29))
            .connect()
            .await
            .err()
            .expect("a 29 ms claim window was taken");
        assert!(
            matches!(&refused, crate::LockError::InvalidOptions { reason } if reason.contains("claim window")),
            "{refused}"
        );
    }

    #[test]
    fn the_url_carries_the_settings_and_a_method_called_later_wins() {
        let builder = ZookeeperBackend::builder(
            "zk://a:1,b:2/apps?root=/locks&session_timeout=20s&connect_timeout=1500ms&tick_time=500ms&claim_window=1s",
        )
        .unwrap();
        assert_eq!(builder.hosts, "a:1,b:2");
        assert_eq!(builder.chroot, "/apps");
        assert_eq!(builder.root, "/locks");
        assert_eq!(builder.session_timeout, Duration::from_secs(20));
        assert_eq!(builder.connect_timeout, Duration::from_millis(1500));
        assert_eq!(builder.tick_time, Duration::from_millis(500));
        assert_eq!(builder.claim_window, Duration::from_secs(1));
        let builder = builder.session_timeout(Duration::from_secs(9));
        assert_eq!(builder.session_timeout, Duration::from_secs(9));
    }
}
