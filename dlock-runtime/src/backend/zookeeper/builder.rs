//! The options of a [`ZookeeperBackend`]: the URL (hosts and chroot), the root, the session
//! timeout and the ensemble's tick; and the connection that opens the session and makes the
//! root.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::paths::check_path;
use super::session::open;
use super::{
    Shared, ZookeeperBackend, DEFAULT_ROOT, DEFAULT_SESSION_TIMEOUT, DEFAULT_TICK_TIME, PERSISTENT,
};
use crate::url::Scheme;
use crate::LockError;

/// Options of a [`ZookeeperBackend`], from [`ZookeeperBackend::builder`].
#[derive(Debug, Clone)]
pub struct ZookeeperBuilder {
    hosts: String,
    chroot: String,
    root: String,
    session_timeout: Duration,
    tick_time: Duration,
}

impl ZookeeperBuilder {
    /// Options for a connection to `url`: `zk://host:port[,host:port…][/chroot]`, the chroot
    /// checked here and created on connection.
    pub(super) fn from_url(url: &str) -> Result<ZookeeperBuilder, LockError> {
        let invalid = |reason: &str| LockError::invalid_url(url, reason);
        let rest = match url.split_once("://") {
            Some((_, rest)) if Scheme::of(url) == Some(Scheme::Zookeeper) => rest,
            _ => return Err(invalid("expected zk://host:port[,host:port][/chroot]")),
        };
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

#[cfg(test)]
mod tests {
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
        ] {
            assert!(ZookeeperBackend::builder(bad).is_err(), "{bad}");
        }
    }
}
