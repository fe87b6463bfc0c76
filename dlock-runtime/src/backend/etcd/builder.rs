//! The options of an [`EtcdBackend`]: the URL (endpoints, credentials and settings), the root
//! prefix, the etcd lease's TTL, the time-outs and the claim window; and the connection.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

use super::{
    etcd_error, EtcdBackend, Shared, DEFAULT_CLAIM_WINDOW, DEFAULT_LEASE_TTL, DEFAULT_ROOT,
};
use crate::url::{duration_param, query_param, Scheme};
use crate::LockError;

/// How long a connection or one request may take, unless told otherwise.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Options of an [`EtcdBackend`], from [`EtcdBackend::builder`].
///
/// The URL may carry the same settings as query parameters, which a method called later
/// overrides: `root`, `lease_ttl`, `timeout` and `claim_window`.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
/// use std::time::Duration;
/// use dlock::backend::EtcdBackend;
///
/// let backend = EtcdBackend::builder("etcd://etcd1:2379,etcd2:2379,etcd3:2379?root=orders")?
///     .lease_ttl(Duration::from_secs(20))
///     .timeout(Duration::from_secs(2))
///     .connect()
///     .await?;
/// assert_eq!(backend.root(), "orders");
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "a builder does nothing until `connect`"]
pub struct EtcdBuilder {
    endpoints: Vec<String>,
    /// User and password, from the URL's user information.
    user: Option<(String, String)>,
    root: String,
    lease_ttl: Duration,
    timeout: Duration,
    claim_window: Duration,
}

impl std::fmt::Debug for EtcdBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBuilder")
            .field("endpoints", &self.endpoints)
            .field("user", &self.user.as_ref().map(|(user, _)| user))
            .field("root", &self.root)
            .field("lease_ttl", &self.lease_ttl)
            .field("timeout", &self.timeout)
            .field("claim_window", &self.claim_window)
            .finish()
    }
}

impl EtcdBuilder {
    /// Options for `etcd://[user:password@]host:port[,host:port…][?settings]`.
    pub(super) fn from_url(url: &str) -> Result<EtcdBuilder, LockError> {
        let invalid = |reason: &str| LockError::invalid_url(url, reason);
        let rest = match url.split_once("://") {
            Some((_, rest)) if Scheme::of(url) == Some(Scheme::Etcd) => rest,
            _ => return Err(invalid("expected etcd://host:port[,host:port]")),
        };
        // Credentials end at the last `@` before the settings: one in a setting is a value's.
        let authority = rest.split(['?', '#']).next().unwrap_or(rest);
        let (user, rest) = match authority.rsplit_once('@') {
            Some((userinfo, _)) => {
                let (name, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
                (
                    Some((name.to_owned(), password.to_owned())),
                    &rest[userinfo.len() + 1..],
                )
            }
            None => (None, rest),
        };
        let hosts = rest.split(['?', '#', '/']).next().unwrap_or(rest);
        if hosts.is_empty() || hosts.split(',').any(str::is_empty) {
            return Err(invalid(
                "expected one or more host:port, separated by commas",
            ));
        }
        let mut builder = EtcdBuilder {
            endpoints: hosts.split(',').map(|h| format!("http://{h}")).collect(),
            user,
            root: DEFAULT_ROOT.to_owned(),
            lease_ttl: DEFAULT_LEASE_TTL,
            timeout: DEFAULT_TIMEOUT,
            claim_window: DEFAULT_CLAIM_WINDOW,
        };
        if let Some(root) = query_param(url, "root") {
            builder = builder.root(root);
        }
        if let Some(ttl) = duration_param(url, "lease_ttl")? {
            builder = builder.lease_ttl(ttl);
        }
        if let Some(timeout) = duration_param(url, "timeout")? {
            builder = builder.timeout(timeout);
        }
        if let Some(window) = duration_param(url, "claim_window")? {
            builder = builder.claim_window(window);
        }
        Ok(builder)
    }

    /// The prefix every lock node's etcd key starts with (`dlock` unless set): a key's nodes are
    /// `{root}/{key}/{owner}-{attempt}`.
    ///
    /// ```
    /// let builder = dlock::backend::EtcdBackend::builder("etcd://127.0.0.1:2379")?.root("orders");
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    pub fn root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into().trim_end_matches('/').to_owned();
        self
    }

    /// The TTL of the backend's etcd lease (whole seconds, rounded up; 30 s unless set): how
    /// long etcd keeps the keys of a process that died, and the longest ttl a lock may have (a
    /// [`Locker`](crate::Locker) shortens a longer one to it and renews it more often). etcd
    /// grants no lease shorter than its own minimum (about 1.5 × its election timeout).
    ///
    /// ```
    /// use std::time::Duration;
    /// let builder = dlock::backend::EtcdBackend::builder("etcd://127.0.0.1:2379")?
    ///     .lease_ttl(Duration::from_secs(10));
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl.max(Duration::from_secs(1));
        self
    }

    /// How long a connection or one request to etcd may take (5 s unless set).
    ///
    /// ```
    /// use std::time::Duration;
    /// let builder = dlock::backend::EtcdBackend::builder("etcd://127.0.0.1:2379")?
    ///     .timeout(Duration::from_secs(1));
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long a grant waits for its caller to claim it (3 s, or the ttl where shorter, unless
    /// set): a waiter whose caller stopped polling is passed over after it.
    ///
    /// ```
    /// use std::time::Duration;
    /// let builder = dlock::backend::EtcdBackend::builder("etcd://127.0.0.1:2379")?
    ///     .claim_window(Duration::from_millis(500));
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    pub fn claim_window(mut self, window: Duration) -> Self {
        self.claim_window = window.max(Duration::from_millis(30));
        self
    }

    /// Connects. The etcd lease is granted by the first acquisition.
    ///
    /// # Errors
    ///
    /// [`LockError::Backend`] when no endpoint answers within the time-out.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = dlock::backend::EtcdBackend::builder("etcd://127.0.0.1:2379")?.connect().await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(self) -> Result<EtcdBackend, LockError> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(self.timeout)
            // etcd closes the connection of a client that pings more often than every 5 s
            // (`--grpc-keepalive-min-time`), breaking every watch and keep-alive stream on it.
            .with_keep_alive(Duration::from_secs(10), self.timeout)
            // A watch on a member cut off from the leader would otherwise stay open and silent
            // while the majority deletes the node it waits for: with this, such a member ends
            // the watch, and the waiter reads the line again elsewhere.
            .with_require_leader(true)
            // An authentication token expires (`--auth-token-ttl`, 5 minutes by default): renewed
            // when the server says so, or every call after it fails, releases included.
            .with_auto_token_refresh(true);
        if let Some((user, password)) = &self.user {
            options = options.with_user(user.clone(), password.clone());
        }
        let endpoints = self.endpoints.clone();
        let timeout = self.timeout;
        // Made on dlock's background runtime, where the channel's tasks then live: a `Locker` in
        // a `static` outlives the runtime that first used it.
        let client = crate::background::handle()
            .spawn(async move {
                let client =
                    tokio::time::timeout(timeout, Client::connect(endpoints, Some(options)))
                        .await
                        .map_err(|_| {
                            LockError::backend(format!("etcd did not answer within {timeout:?}"))
                        })?
                        .map_err(etcd_error)?;
                // One read, so that an unreachable cluster fails here, not at the first lock.
                let mut probe = client.kv_client();
                tokio::time::timeout(timeout, probe.get("dlock", None))
                    .await
                    .map_err(|_| {
                        LockError::backend(format!("etcd did not answer within {timeout:?}"))
                    })?
                    .map_err(etcd_error)?;
                Ok::<_, LockError>(client)
            })
            .await
            .map_err(|_| LockError::backend("dlock's background runtime stopped"))??;
        Ok(EtcdBackend {
            shared: Arc::new(Shared {
                client,
                root: self.root,
                lease_ttl: self.lease_ttl,
                timeout: self.timeout,
                claim_window: self.claim_window,
                lease: tokio::sync::Mutex::new(None),
                held: Mutex::default(),
                cleanups: Arc::default(),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::EtcdBuilder;

    #[test]
    fn the_url_carries_endpoints_credentials_and_settings() {
        let builder =
            EtcdBuilder::from_url("etcd://app:s3cret@e1:2379,e2:2379?root=orders&lease_ttl=10s")
                .unwrap();
        assert_eq!(builder.endpoints, ["http://e1:2379", "http://e2:2379"]);
        assert_eq!(builder.root, "orders");
        assert_eq!(builder.lease_ttl, Duration::from_secs(10));
        assert!(!format!("{builder:?}").contains("s3cret"));
        // An `@` in the settings is not the end of credentials.
        let builder = EtcdBuilder::from_url("etcd://e1:2379?root=team@prod").unwrap();
        assert_eq!(builder.endpoints, ["http://e1:2379"]);
        assert_eq!(builder.root, "team@prod");
        assert!(builder.user.is_none());
        for bad in [
            "redis://h:1",
            "etcd://",
            "etcd://h:1,,h:2",
            "etcd://h:1?lease_ttl=soon",
        ] {
            assert!(EtcdBuilder::from_url(bad).is_err(), "{bad}");
        }
    }
}
