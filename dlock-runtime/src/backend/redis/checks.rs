//! The checks `connect` makes of the server before it hands the backend out: that it answers,
//! that it will not evict locks, and that the user may publish hand-offs.

use redis::aio::ConnectionLike;
use redis::Value;

use super::conn;
use super::RedisBackend;
use crate::LockError;

impl RedisBackend {
    /// Refuses a server that may evict keys when its memory runs short (a `maxmemory` set, and
    /// a `maxmemory-policy` other than `noeviction`, as managed Redis services set by default):
    /// every key dlock writes has an expiry, so a `volatile-*` policy may drop a held lock, and
    /// the next caller gets the key while its holder is still at work. A server that does not
    /// let the client read its policy (`INFO` refused, as to an ACL user with `-@dangerous`, or
    /// a reply without the policy) passes, with a warning: dlock cannot tell that risk apart.
    pub(super) async fn refuse_eviction(&self) -> Result<(), LockError> {
        let info = self
            .inner
            .conn
            .run("INFO memory", |mut conn| async move {
                conn.req_packed_command(redis::cmd("INFO").arg("memory"))
                    .await
                    .and_then(Value::extract_error)
            })
            .await;
        let info = match info {
            Ok(info) => info,
            Err(error) => {
                warn_policy_unread(&error.to_string());
                return Ok(());
            }
        };
        let mut texts = Vec::new();
        conn::collect_text(&info, &mut texts);
        if !texts.iter().any(|text| conn::states_policy(text)) {
            warn_policy_unread("INFO memory names no maxmemory_policy");
            return Ok(());
        }
        match texts.iter().find_map(|text| conn::evicting_policy(text)) {
            None => Ok(()),
            Some(policy) => Err(LockError::InvalidOptions {
                reason: format!(
                    "the Redis server may evict keys when its memory is full (maxmemory-policy {policy}), and an evicted lock lets a second holder in: \
                     set `maxmemory-policy noeviction` (a Redis of its own for dlock, say), or accept the risk with `allow_eviction=true` in the URL \
                     or `RedisBuilder::allow_eviction(true)`"
                ),
            }),
        }
    }

    /// Refuses a user who may not `PUBLISH` on the lock channels, as Redis 7 makes a new ACL
    /// user (`acl-pubsub-default resetchannels`): the release script would hand a lock to a
    /// waiter of another process, then fail on its `PUBLISH` (a script's writes stay), so the
    /// release errs though it handed the lock on; and waiters could not subscribe. Probed with a
    /// `PUBLISH` to this backend's own channel, the one its waiters subscribe to and releases
    /// publish on, with an empty message (which names no waiter, so wakes nobody even where one
    /// listens); a failure other than `NOPERM` (a proxy without pub/sub, say) passes, as with
    /// the eviction check.
    pub(super) async fn refuse_unpublishable(&self) -> Result<(), LockError> {
        let channel = self.inner.subscriber.channel();
        let probed = self
            .inner
            .conn
            .run("PUBLISH", move |mut conn| async move {
                let published = conn
                    .req_packed_command(redis::cmd("PUBLISH").arg(channel).arg(""))
                    .await
                    .and_then(Value::extract_error);
                match published {
                    Ok(_) => Ok(None),
                    Err(error) if error.code() == Some("NOPERM") => Ok(Some(error.to_string())),
                    Err(error) => Err(error),
                }
            })
            .await;
        let Ok(Some(refusal)) = probed else {
            return Ok(());
        };
        let prefix = self.inner.layout.prefix();
        Err(LockError::InvalidOptions {
            reason: format!(
                "the Redis user may not publish on dlock's lock channels ({refusal}): a release that hands a lock to a waiter \
                 of another process would fail after the hand-off, and waiters could not be woken. Grant the user the channels \
                 of the key prefix (`ACL SETUSER <user> &{prefix}*`) or every channel (`allchannels`)"
            ),
        })
    }

    /// Checks that the server answers (and accepted the credentials).
    pub(super) async fn ping(&self) -> Result<(), LockError> {
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
}

/// Warns that `connect` could not read the server's eviction policy (`why`), and what that
/// leaves: a server that evicts keys under memory pressure may drop a held lock.
fn warn_policy_unread(why: &str) {
    tracing::warn!(
        reason = why,
        "distributed_lock: could not read the Redis server's maxmemory-policy, so cannot tell whether it evicts keys when its memory is full: \
         an evicted lock lets a second holder in while the first is still at work. Make sure the policy is `noeviction` (or let the user read \
         `INFO`, e.g. `ACL SETUSER <user> +info`); `allow_eviction=true` in the URL or `RedisBuilder::allow_eviction(true)` accepts the risk \
         and silences this warning"
    );
}
