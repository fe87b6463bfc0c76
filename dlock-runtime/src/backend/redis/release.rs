//! Release: the release script, which hands the lock to the first live waiter, leaves the
//! queue, or undoes an acquisition.

use super::keys::check_key;
use super::scripts::{invoke, parse_release, RELEASE};
use super::RedisBackend;
use crate::{LockError, Owner};

impl RedisBackend {
    /// Runs the release script: releases with hand-off where `owner` holds `key`, else leaves its
    /// queue. `undo` where this undoes an acquisition its caller gave up: the owner's cancel
    /// marker is then left even where the lock was handed to it (see release.lua).
    pub(super) async fn release_or_leave(
        &self,
        key: &str,
        owner: Owner,
        undo: bool,
    ) -> Result<bool, LockError> {
        if check_key(key).is_err() {
            // Never acquired: an acquire refuses such a key before sending anything.
            return Ok(false);
        }
        let keys = self.inner.layout.lock_keys(key, owner);
        let mut call = keys.call(&RELEASE);
        call.arg(&self.inner.instance)
            .arg(self.inner.layout.prefix());
        // A lease granted to a call sent twice is released as an undo: the other copy of that
        // call, still on its way, would otherwise find the key free after this release and
        // grant it to nobody for a full ttl (or queue a waiter nobody is). On a cluster, every
        // lease is: redis-rs's cluster client sends a command again by itself (after a dropped
        // connection, a redirection) without saying so, so dlock cannot tell which calls went
        // out twice. The marker is one more write per release; the lease is released (and
        // handed on) all the same.
        let resent = self.was_resent(key, owner);
        if undo || resent || self.inner.cluster {
            call.arg(1);
        }
        let reply = self
            .inner
            .conn
            .run("release", |conn| invoke(conn, &RELEASE, &call))
            .await;
        // Forgotten whatever the answer: nothing sends this release again (a failed one is
        // left to the ttl), and an entry kept would only grow the set.
        if resent {
            self.inner.resent.forget(&keys);
        }
        let reply = reply?;
        let released =
            parse_release(reply).map_err(|reason| self.inner.conn.error("release", reason))?;
        if let Some(handed) = &released.handed_to {
            // A waiter of this process need not wait for the published message: it is woken
            // with the grant. Let it run before this caller goes on (to queue for the key again,
            // say), so that it starts (or sends its claim) ahead of the caller's request.
            if self.inner.subscriber.wake_local(handed) {
                tokio::task::yield_now().await;
            }
        }
        Ok(released.held)
    }
}
