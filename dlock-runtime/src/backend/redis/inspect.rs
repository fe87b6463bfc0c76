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

    /// The held keys that start with `prefix`, walked with `SCAN … MATCH … COUNT … TYPE string`.
    pub(super) async fn list_keys(&self, prefix: &str) -> Result<Vec<String>, LockError> {
        if self.inner.cluster {
            // Each primary would need a walk of its own, with a cursor of its own.
            return Err(LockError::Unsupported {
                what: "list its held keys on a Redis Cluster (inspect a key instead, or run \
                       `redis-cli --scan --pattern` against each primary)"
                    .into(),
            });
        }
        let layout = &self.inner.layout;
        let pattern = layout.lock_pattern(prefix);
        let mut held = Vec::new();
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
                    let scan = scan.clone();
                    async move { scan.query_async(&mut conn).await }
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
                return Ok(held);
            }
            cursor = next;
        }
    }
}
