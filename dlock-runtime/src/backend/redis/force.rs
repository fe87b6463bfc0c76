//! Force release, for operators: the force script (force.lua), which releases a lock where the
//! owner the operator named holds it, and hands it on like a release.

use redis::Value;

use super::describe::parse_holder;
use super::keys::check_key;
use super::scripts::{invoke, unexpected, HandOff, FORCE};
use super::RedisBackend;
use crate::{LockError, Owner};

impl RedisBackend {
    /// Runs the force script on `key`: the evicted holder's fence, or `None` where `owner` did
    /// not hold the lock.
    pub(super) async fn force_release_key(
        &self,
        key: &str,
        owner: Owner,
    ) -> Result<Option<u64>, LockError> {
        if check_key(key).is_err() {
            // Never acquired: an acquire refuses such a key before sending anything.
            return Ok(None);
        }
        // The owner to evict, compared on the server: the script changes nothing where another
        // holds the lock. That is what makes `run` safe here, though it sends the call again
        // after a timeout or a dropped connection (and a cluster's client does so by itself): a
        // second copy finds the lock handed on (or free), not `owner`'s, and evicts nobody.
        let keys = self.inner.layout.lock_keys(key, owner);
        let mut call = keys.call(&FORCE);
        call.arg(&self.inner.instance)
            .arg(self.inner.layout.prefix());
        let reply = self
            .inner
            .conn
            .run("force release", |conn| invoke(conn, &FORCE, &call))
            .await?;
        let error = |reply: &Value| self.inner.conn.error("force release", unexpected(reply));
        let items = match &reply {
            Value::Nil | Value::Boolean(false) => return Ok(None),
            Value::Array(items) => items,
            _ => return Err(error(&reply)),
        };
        let text = |value: &Value| match value {
            Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
            _ => None,
        };
        let (holder, counter) = match items.as_slice() {
            [holder, counter, ..] => (text(holder), text(counter)),
            _ => return Err(error(&reply)),
        };
        let (Some(holder), Some(counter)) = (holder, counter) else {
            return Err(error(&reply));
        };
        let counter: Option<u64> = counter.parse().ok();
        // The evicted fence as the holder's description says, else as the counter does (an older
        // dlock's grant, or a value set from outside dlock); 0 where neither says (see
        // `Locker::force_release`: evicted, fence unknown — `None` would say nothing was).
        let evicted = parse_holder(&holder, -1, counter)
            .map(|holder| holder.fence())
            .or(counter)
            .unwrap_or(0);
        if let [_, _, Value::BulkString(head), Value::Int(fence), call] = items.as_slice() {
            let handed = HandOff {
                owner: String::from_utf8_lossy(head).into_owned(),
                fence: u64::try_from(*fence).map_err(|_| error(&reply))?,
                call: text(call).and_then(|call| call.parse().ok()),
            };
            // A waiter of this process is woken with its grant, as by a release (the script
            // published nothing to it).
            if self.inner.subscriber.wake_local(&handed) {
                tokio::task::yield_now().await;
            }
        }
        Ok(Some(evicted))
    }
}
