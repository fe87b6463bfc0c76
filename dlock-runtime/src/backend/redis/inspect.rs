//! For operators: one lock's state, read by one script (inspect.lua), and the held keys, walked
//! with `SCAN` (never `KEYS`, which blocks the server for as long as it takes to walk them all).

use redis::Value;

use super::describe::parse_holder;
use super::keys::check_key;
use super::scripts::{invoke, unexpected, INSPECT};
use super::RedisBackend;
use crate::{KeyState, LockError, Owner};

/// How many names one `SCAN` call looks at: the server answers each call after that many,
/// whatever the keyspace's size, so other clients are never held up for long.
const SCAN_COUNT: usize = 1000;

impl RedisBackend {
    /// `key`'s holder and live waiters, read in one script.
    pub(super) async fn inspect_key(&self, key: &str) -> Result<KeyState, LockError> {
        if check_key(key).is_err() {
            // Never acquired: an acquire refuses such a key before sending anything.
            return Ok(KeyState::new(key, Vec::new(), 0));
        }
        // The owner names no key the script reads; any will do.
        let keys = self.inner.layout.lock_keys(key, Owner::from_u128(0));
        let call = keys.call(&INSPECT);
        let reply = self
            .inner
            .conn
            .run("inspect", |conn| invoke(conn, &INSPECT, &call))
            .await?;
        let error = |reply: &Value| self.inner.conn.error("inspect", unexpected(reply));
        let Value::Array(items) = &reply else {
            return Err(error(&reply));
        };
        let [Value::BulkString(value), Value::Int(pttl), Value::BulkString(counter), Value::Int(waiters)] =
            items.as_slice()
        else {
            return Err(error(&reply));
        };
        let counter = std::str::from_utf8(counter)
            .ok()
            .and_then(|counter| counter.parse().ok());
        let waiters = usize::try_from(*waiters).map_err(|_| error(&reply))?;
        if value.is_empty() {
            return Ok(KeyState::new(key, Vec::new(), waiters));
        }
        let holder = std::str::from_utf8(value)
            .ok()
            .and_then(|value| parse_holder(value, *pttl, counter))
            .ok_or_else(|| {
                LockError::backend(format!(
                    "the lock `{}` holds a value no dlock wrote: {:?}",
                    self.lock_key(key),
                    String::from_utf8_lossy(&value[..value.len().min(100)])
                ))
            })?;
        Ok(KeyState::new(key, vec![holder], waiters))
    }

    /// The held keys that start with `prefix`, walked with `SCAN … MATCH … COUNT … TYPE string`
    /// on the server, or on each primary of a cluster (whose keys are spread over them).
    pub(super) async fn list_keys(&self, prefix: &str) -> Result<Vec<String>, LockError> {
        let mut held = Vec::new();
        for node in self.nodes_to_walk().await? {
            self.walk(node, prefix, &mut held).await?;
        }
        Ok(held)
    }

    /// Adds the held keys of `node` (the server itself where `None`) that start with `prefix`
    /// to `held`, a `SCAN` batch at a time.
    async fn walk(
        &self,
        node: Option<Node>,
        prefix: &str,
        held: &mut Vec<String>,
    ) -> Result<(), LockError> {
        let layout = &self.inner.layout;
        let pattern = layout.lock_pattern(prefix);
        let mut cursor = 0u64;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT)
                .arg("TYPE")
                .arg("string");
            let (next, names): (u64, Vec<String>) = self
                .inner
                .conn
                .run("list", |mut conn| {
                    let (scan, node) = (scan.clone(), node.clone());
                    async move { conn.query_node(scan, node).await }
                })
                .await?;
            held.extend(
                names
                    .iter()
                    .filter_map(|name| layout.key_of(name))
                    .filter(|key| key.starts_with(prefix))
                    .map(str::to_owned),
            );
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }

    /// The servers a listing walks: the one server (`None`), or each primary of a cluster, as
    /// `CLUSTER SLOTS` names them now. A slot that moves during the walk may have its keys
    /// listed twice (the locker keeps each once) or not at all, as any key taken or released
    /// meanwhile may or may not be.
    async fn nodes_to_walk(&self) -> Result<Vec<Option<Node>>, LockError> {
        if !self.inner.cluster {
            return Ok(vec![None]);
        }
        let slots: Value = self
            .inner
            .conn
            .run("list", |mut conn| async move {
                conn.query_node(redis::cmd("CLUSTER").arg("SLOTS").clone(), None)
                    .await
            })
            .await?;
        let mut primaries = primaries_of(&slots).ok_or_else(|| {
            LockError::backend(format!(
                "Redis Cluster: CLUSTER SLOTS names a primary without an address to walk its keys \
                 at (cluster-announce-ip, or a cluster-preferred-endpoint-type other than \
                 unknown-endpoint, gives every node one): {slots:?}"
            ))
        })?;
        primaries.sort_unstable();
        primaries.dedup();
        Ok(primaries.into_iter().map(Some).collect())
    }
}

/// A server of a cluster, by the host and port `CLUSTER SLOTS` gives it.
pub(super) type Node = (String, u16);

/// The primary of each slot range of a `CLUSTER SLOTS` reply: `[[start, end, [host, port, id,
/// …], replica…], …]`; `None` where the reply is not such, or a primary has no address.
fn primaries_of(slots: &Value) -> Option<Vec<Node>> {
    let Value::Array(ranges) = slots else {
        return None;
    };
    ranges
        .iter()
        .map(|range| {
            let Value::Array(range) = range else {
                return None;
            };
            let Value::Array(primary) = range.get(2)? else {
                return None;
            };
            let host = match primary.first()? {
                Value::BulkString(host) => String::from_utf8(host.clone()).ok()?,
                Value::SimpleString(host) | Value::VerbatimString { text: host, .. } => {
                    host.clone()
                }
                _ => return None,
            };
            let Value::Int(port) = primary.get(1)? else {
                return None;
            };
            // A primary that announces no address of its own (empty, unknown, or a wildcard,
            // which mean "the node that answered"): no walk can be routed to it by address.
            if host.is_empty() || host == "?" || host == "0.0.0.0" || host == "::" {
                return None;
            }
            Some((host, u16::try_from(*port).ok()?))
        })
        .collect()
}
