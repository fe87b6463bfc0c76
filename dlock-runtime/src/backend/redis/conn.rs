//! The command connections: one multiplexed connection (or one cluster connection) per tokio
//! runtime that calls the backend, replaced when it breaks, with one retry on a fresh connection
//! for the call that found it broken.
//!
//! A connection's driver task runs on the runtime that made it. Calls from a caller's runtime use
//! a connection made there, so a request and its reply never hop threads (on a current-thread
//! runtime that hop would cost more than the round trip); dlock's own work (the watchdog, queued
//! releases) uses one made on the background runtime. When a runtime ends, its connection dies
//! with it, and nothing uses it again: runtime ids are never reused, and only the last few
//! runtimes' connections are kept.
//!
//! (redis-rs's own `ConnectionManager` is not used: it spawns its reconnection work on whichever
//! runtime created it or happened to await it, which is the caller's, and it dies with that
//! runtime.)

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};

use super::builder::Target;
use crate::{background, LockError};

/// The connection a call runs on.
#[derive(Clone)]
pub(super) enum Conn {
    Single(MultiplexedConnection),
    #[cfg(feature = "redis-cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Conn {
    /// Sends `cmd` to `node` of a cluster (by the host and port the cluster names it by), or to
    /// wherever the connection sends a command without a key where `node` is `None`: for the
    /// commands that walk or describe one server, not the keyspace.
    pub(super) async fn query_node<T: redis::FromRedisValue>(
        &mut self,
        cmd: Cmd,
        node: Option<super::inspect::Node>,
    ) -> RedisResult<T> {
        match (self, node) {
            #[cfg(feature = "redis-cluster")]
            (Conn::Cluster(conn), node) => {
                use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
                let routing = match node {
                    Some((host, port)) => SingleNodeRoutingInfo::ByAddress { host, port },
                    None => SingleNodeRoutingInfo::Random,
                };
                let value = conn
                    .route_command(cmd, RoutingInfo::SingleNode(routing))
                    .await?;
                redis::from_redis_value(value).map_err(Into::into)
            }
            (conn, _) => cmd.query_async(conn).await,
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(conn) => conn.req_packed_command(cmd),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(conn) => conn.req_packed_commands(cmd, offset, count),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(conn) => conn.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(conn) => conn.get_db(),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(conn) => conn.get_db(),
        }
    }
}

/// The connection attempts of one backend.
#[derive(Default)]
struct Attempts {
    /// The generation of the last connection made.
    generation: u64,
    /// Why the last attempt failed, if it did.
    last_error: Option<RedisError>,
}

/// Timeouts of the connections of one backend.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timeouts {
    pub(super) connect: Duration,
    pub(super) response: Duration,
}

/// How many callers' runtimes keep a connection at once. A test binary makes a runtime per test;
/// the connections of runtimes that ended are dropped oldest first.
const RUNTIME_SLOTS: usize = 8;

/// The connections of one backend: one for the background runtime, one per calling runtime.
pub(super) struct Connection {
    background: Slot,
    runtimes: Mutex<VecDeque<(tokio::runtime::Id, Arc<Slot>)>>,
}

impl Connection {
    pub(super) fn new(target: Target, timeouts: Timeouts, description: Arc<str>) -> Self {
        Connection {
            background: Slot::new(target, timeouts, description, true),
            runtimes: Mutex::new(VecDeque::with_capacity(RUNTIME_SLOTS)),
        }
    }

    /// The connection slot of the calling runtime: its own for a caller's runtime, the background
    /// one for dlock's own work or a caller outside any runtime.
    fn slot(&self) -> Option<Arc<Slot>> {
        let handle = tokio::runtime::Handle::try_current().ok()?;
        let id = handle.id();
        if id == background::handle().id() {
            return None;
        }
        let mut runtimes = self
            .runtimes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((_, slot)) = runtimes.iter().find(|(runtime, _)| *runtime == id) {
            return Some(slot.clone());
        }
        if runtimes.len() == RUNTIME_SLOTS {
            runtimes.pop_front();
        }
        let slot = Arc::new(self.background.sibling());
        runtimes.push_back((id, slot.clone()));
        Some(slot)
    }

    /// Runs `op` on the calling runtime's connection (see [`Slot::run`]).
    pub(super) async fn run<T, F, Fut>(&self, what: &str, op: F) -> Result<T, LockError>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        self.run_resending(what, Resend::AfterTimeout, op)
            .await
            .map(|(value, _)| value)
    }

    /// [`run`](Self::run) for an acquisition: one that timed out is not sent again. Its first copy
    /// still waits on the old connection and may yet run; a second copy granted on a fresh one,
    /// then released, would leave that late first copy to grant the key to nobody for a whole
    /// ttl. Failing instead hands the call to the caller's undo, whose cancel marker makes the
    /// late copy take no effect.
    ///
    /// With the reply, whether it came from a copy sent again after the first connection
    /// dropped: the first copy may then still be on its way, to land after this acquisition's
    /// release.
    pub(super) async fn run_acquire<T, F, Fut>(&self, op: F) -> Result<(T, bool), LockError>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        self.run_resending("acquire", Resend::OnlyIfDropped, op)
            .await
    }

    async fn run_resending<T, F, Fut>(
        &self,
        what: &str,
        resend: Resend,
        op: F,
    ) -> Result<(T, bool), LockError>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        match self.slot() {
            Some(slot) => slot.run(what, resend, op).await,
            None => self.background.run(what, resend, op).await,
        }
    }

    pub(super) fn error(&self, what: &str, error: RedisError) -> LockError {
        self.background.error(what, error)
    }

    /// What the server is called in errors: its URL without the password.
    pub(super) fn description(&self) -> &str {
        &self.background.description
    }
}

/// One connection, made when first needed and again after it breaks.
struct Slot {
    target: Target,
    timeouts: Timeouts,
    /// The current connection and its generation.
    current: Mutex<Option<(u64, Conn)>>,
    /// Held while connecting, so concurrent callers make one connection, not one each.
    connecting: tokio::sync::Mutex<Attempts>,
    /// How many connection attempts have finished.
    finished: AtomicU64,
    /// What the redacted URL reads, for errors.
    description: Arc<str>,
    /// Whether the connection is made on the background runtime rather than the caller's.
    on_background: bool,
}

impl Slot {
    fn new(target: Target, timeouts: Timeouts, description: Arc<str>, on_background: bool) -> Self {
        Slot {
            target,
            timeouts,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(Attempts::default()),
            finished: AtomicU64::new(0),
            description,
            on_background,
        }
    }

    /// A slot for the same server whose connection is made on the caller's runtime.
    fn sibling(&self) -> Slot {
        Slot::new(
            self.target.clone(),
            self.timeouts,
            self.description.clone(),
            false,
        )
    }

    fn current(&self) -> MutexGuard<'_, Option<(u64, Conn)>> {
        self.current
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The current connection, or a new one. Callers that queued behind an attempt that failed
    /// share its failure rather than each waiting out an attempt of their own (an unreachable
    /// server costs every caller at most one connect timeout, not one per caller ahead of it).
    async fn get(&self) -> Result<(u64, Conn), LockError> {
        if let Some(current) = self.current().clone() {
            return Ok(current);
        }
        let seen = self.finished.load(Ordering::Acquire);
        let mut attempts = self.connecting.lock().await;
        if let Some(current) = self.current().clone() {
            return Ok(current);
        }
        if self.finished.load(Ordering::Acquire) != seen {
            if let Some(error) = &attempts.last_error {
                return Err(self.error("cannot connect", error.clone()));
            }
        }
        let result = self.connect().await;
        self.finished.fetch_add(1, Ordering::AcqRel);
        match result {
            Ok(conn) => {
                attempts.generation += 1;
                attempts.last_error = None;
                *self.current() = Some((attempts.generation, conn.clone()));
                Ok((attempts.generation, conn))
            }
            Err(error) => {
                attempts.last_error = Some(error.clone());
                Err(self.error("cannot connect", error))
            }
        }
    }

    /// Connects on the runtime this slot serves: the connection's driver task is spawned by
    /// whichever runtime connects, so the background slot's must not be the caller's.
    async fn connect(&self) -> Result<Conn, RedisError> {
        let target = self.target.clone();
        let timeouts = self.timeouts;
        let connecting = async move {
            let connect = async {
                match target {
                    Target::Single(client) => {
                        let config = AsyncConnectionConfig::new()
                            .set_connection_timeout(Some(timeouts.connect))
                            .set_response_timeout(Some(timeouts.response));
                        client
                            .get_multiplexed_async_connection_with_config(&config)
                            .await
                            .map(Conn::Single)
                    }
                    #[cfg(feature = "redis-cluster")]
                    Target::Cluster(client, _) => {
                        client.get_async_connection().await.map(Conn::Cluster)
                    }
                }
            };
            let connect = async {
                let mut conn = connect.await?;
                check_version(&mut conn).await?;
                Ok(conn)
            };
            // The overall bound covers DNS, TCP, TLS, AUTH and the version check together.
            match tokio::time::timeout(timeouts.connect.saturating_mul(2), connect).await {
                Ok(result) => result,
                Err(_) => Err(RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "timed out connecting",
                ))),
            }
        };
        if !self.on_background {
            return connecting.await;
        }
        match background::handle().spawn(connecting).await {
            Ok(result) => result,
            Err(join) => Err(RedisError::from(std::io::Error::other(format!(
                "connecting failed: {join}"
            )))),
        }
    }

    /// Forgets connection `generation` if it is still the current one.
    fn discard(&self, generation: u64) {
        let mut current = self.current();
        if current.as_ref().is_some_and(|(g, _)| *g == generation) {
            *current = None;
        }
    }

    /// Runs `op` on the current connection; where the connection turns out broken, once more on a
    /// fresh one (every operation of this backend is idempotent for its owner), unless it only
    /// timed out and `resend` says a late first copy must not meet a second. With the value,
    /// whether it was sent twice.
    async fn run<T, F, Fut>(
        &self,
        what: &str,
        resend: Resend,
        op: F,
    ) -> Result<(T, bool), LockError>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let (generation, conn) = self.get().await?;
        match op(conn).await {
            Ok(value) => Ok((value, false)),
            Err(error) if error.is_timeout() && resend == Resend::OnlyIfDropped => {
                // The connection may be stuck: the next call takes a fresh one.
                self.discard(generation);
                Err(self.error(what, error))
            }
            Err(error) if is_broken(&error) => {
                tracing::debug!(%error, "distributed_lock: redis connection broken; retrying on a fresh one");
                self.discard(generation);
                let (generation, conn) = self.get().await?;
                op(conn).await.map(|value| (value, true)).map_err(|error| {
                    if is_broken(&error) {
                        self.discard(generation);
                    }
                    self.error(what, error)
                })
            }
            Err(error) => Err(self.error(what, error)),
        }
    }

    fn error(&self, what: &str, error: RedisError) -> LockError {
        let refused = error.kind() == redis::ErrorKind::AuthenticationFailed
            || matches!(error.code(), Some("NOAUTH" | "WRONGPASS"))
            || error.to_string().contains("NOAUTH");
        let hint = if refused {
            " (give the credentials in the URL: redis://:password@host:port or redis://user:password@host:port)"
        } else {
            ""
        };
        LockError::backend(RedisBackendError {
            context: format!("redis at {}: {what}", self.description),
            source: error,
            hint,
        })
    }
}

/// The oldest Redis the scripts run on: they use `GETDEL` and `SET … GET`.
pub(super) const MIN_SERVER_VERSION: (u32, u32) = (6, 2);

/// Checks the `redis_version` an `INFO server` reply names against [`MIN_SERVER_VERSION`].
/// A reply that names none (a server that hides it) passes: the scripts then fail on their own.
fn check_server_version(info: &str) -> Result<(), String> {
    let Some(version) = info_field(info, "redis_version") else {
        return Ok(());
    };
    let mut parts = version.split('.').map(str::parse::<u32>);
    let (Some(Ok(major)), Some(Ok(minor))) = (parts.next(), parts.next()) else {
        return Ok(());
    };
    if (major, minor) >= MIN_SERVER_VERSION {
        return Ok(());
    }
    let (need_major, need_minor) = MIN_SERVER_VERSION;
    Err(format!(
        "the server runs Redis {version}; dlock needs Redis {need_major}.{need_minor} or later"
    ))
}

/// Asks the server(s) behind `conn` for their version and refuses one that is too old, so that
/// an old server fails at connect with a clear message, not at the first contended wait with a
/// script error. A server that does not allow `INFO` passes.
async fn check_version(conn: &mut Conn) -> Result<(), RedisError> {
    let info = match conn
        .req_packed_command(redis::cmd("INFO").arg("server"))
        .await
        .and_then(Value::extract_error)
    {
        Ok(info) => info,
        Err(error) if error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) => {
            return Ok(())
        }
        Err(error)
            if error
                .code()
                .is_some_and(|code| code == "NOPERM" || code == "ERR") =>
        {
            return Ok(())
        }
        Err(error) => return Err(error),
    };
    // One node's reply, or (from a cluster connection) one per node.
    let mut texts = Vec::new();
    collect_text(&info, &mut texts);
    for text in texts {
        check_server_version(&text).map_err(|reason| {
            RedisError::from((redis::ErrorKind::Client, "server too old", reason))
        })?;
    }
    Ok(())
}

/// Reads an `INFO memory` reply (one node's text): the eviction policy of a server that may
/// evict keys (a memory limit set, and a policy other than `noeviction`), else `None`.
pub(super) fn evicting_policy(info: &str) -> Option<String> {
    let limit: u64 = info_field(info, "maxmemory")?.parse().ok()?;
    let policy = info_field(info, "maxmemory_policy")?;
    (limit > 0 && policy != "noeviction").then(|| policy.to_owned())
}

/// Whether an `INFO memory` reply's text (one node's) states the eviction policy.
pub(super) fn states_policy(info: &str) -> bool {
    info_field(info, "maxmemory_policy").is_some()
}

/// The value of the field `name` in an `INFO` reply's text (`name:value` lines).
fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':'))
}

/// Every text in `value`, however nested.
pub(super) fn collect_text(value: &Value, texts: &mut Vec<String>) {
    match value {
        Value::BulkString(bytes) => texts.push(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(text) => texts.push(text.clone()),
        Value::VerbatimString { text, .. } => texts.push(text.clone()),
        Value::Array(values) | Value::Set(values) => {
            values.iter().for_each(|value| collect_text(value, texts))
        }
        Value::Map(pairs) => pairs
            .iter()
            .for_each(|(_, value)| collect_text(value, texts)),
        _ => {}
    }
}

/// When a call whose connection failed is sent again on a fresh one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resend {
    /// Also after a time-out, where the first copy may still run later.
    AfterTimeout,
    /// Only where the connection dropped, taking the first copy with it.
    OnlyIfDropped,
}

/// Whether `error` means the connection is unusable and a fresh one may succeed.
fn is_broken(error: &RedisError) -> bool {
    error.is_unrecoverable_error()
        || error.is_io_error()
        || error.is_connection_dropped()
        || error.is_timeout()
}

/// A Redis failure with what dlock was doing, and where.
#[derive(Debug)]
pub(super) struct RedisBackendError {
    pub(super) context: String,
    pub(super) source: RedisError,
    pub(super) hint: &'static str,
}

impl std::fmt::Display for RedisBackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}{}", self.context, self.source, self.hint)
    }
}

impl std::error::Error for RedisBackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::{check_server_version, evicting_policy};

    #[test]
    fn servers_older_than_6_2_are_refused_by_name() {
        let info = |version: &str| {
            format!("# Server\r\nredis_version:{version}\r\nredis_mode:standalone\r\n")
        };
        for version in ["6.2.0", "6.2.14", "7.0.15", "7.4.1", "10.0.0"] {
            assert_eq!(check_server_version(&info(version)), Ok(()), "{version}");
        }
        for version in ["6.0.9", "5.0.14", "2.8.24"] {
            let error = check_server_version(&info(version)).unwrap_err();
            assert!(error.contains(version) && error.contains("6.2"), "{error}");
        }
        assert_eq!(check_server_version("# Server\r\nos:Linux\r\n"), Ok(()));
        assert_eq!(check_server_version("redis_version:garbage\r\n"), Ok(()));
    }

    #[test]
    fn only_a_memory_limit_with_an_evicting_policy_counts_as_evicting() {
        let info = |limit: u64, policy: &str| {
            format!("# Memory\r\nused_memory:1\r\nmaxmemory:{limit}\r\nmaxmemory_human:x\r\nmaxmemory_policy:{policy}\r\n")
        };
        assert_eq!(evicting_policy(&info(0, "volatile-lru")), None);
        assert_eq!(evicting_policy(&info(1 << 20, "noeviction")), None);
        assert_eq!(
            evicting_policy(&info(1 << 20, "volatile-lru")).as_deref(),
            Some("volatile-lru")
        );
        assert_eq!(evicting_policy("no such fields"), None);
    }
}
