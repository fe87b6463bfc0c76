//! Acquisition: the first try, each run of the acquire script, and the record of calls sent
//! twice that a release must answer for (waiting in the queue is waiting.rs).

use std::time::Instant;

use super::describe::holder_meta;
use super::keys::{check_key, LockKeys};
use super::replicas::invoke_then_wait;
use super::scripts::{invoke, parse_attempt, Attempt, Mode, ACQUIRE};
use super::{lease_millis, millis, RedisBackend};
use crate::backend::{AcquireRequest, Acquired};
use crate::{LockError, Owner};

impl RedisBackend {
    /// An acquisition: one try, then waiting in the queue where the caller may wait.
    pub(super) async fn acquire_or_wait(
        &self,
        request: &AcquireRequest<'_>,
    ) -> Result<Option<Acquired>, LockError> {
        check_key(request.key)?;
        let keys = self.inner.layout.lock_keys(request.key, request.owner);
        let deadline = crate::backend::wait_deadline(request.wait);
        if !request.wait.is_zero() && self.inner.subscriber.has_waiters(&keys.channel()) {
            // Other waiters of this backend wait for the key: it is most likely busy, so queue
            // up in the first call, which spares a round trip. The channel is subscribed
            // already, so the hand-off's message cannot come before it.
            return self.wait_in_queue(&keys, request, deadline).await;
        }
        let sent_at = Instant::now();
        // First without queueing: an uncontended acquire is one round trip, and `wait = 0`
        // never leaves anything behind.
        match self.try_acquire(&keys, request, Mode::FirstTry, 0).await? {
            Attempt::Granted(fence) => Ok(Some(Acquired {
                fence,
                valid_from: sent_at,
            })),
            Attempt::Busy { .. } if request.wait.is_zero() => Ok(None),
            Attempt::Busy { .. } => self.wait_in_queue(&keys, request, deadline).await,
            Attempt::Unreplicated { acknowledged } if request.wait.is_zero() => {
                Err(self.undo_unreplicated(request, acknowledged).await)
            }
            // Asked again while the caller may wait: the first call of the queue finds the lock
            // this owner's and extends it, which the replicas may acknowledge this time.
            Attempt::Unreplicated { .. } => self.wait_in_queue(&keys, request, deadline).await,
        }
    }

    /// Whether an acquire call of `owner`'s acquisition of `key` was sent twice (see
    /// [`Resent`](super::resent::Resent)).
    pub(super) fn was_resent(&self, key: &str, owner: Owner) -> bool {
        self.inner
            .resent
            .contains(|| self.inner.layout.lock_keys(key, owner))
    }

    /// Runs the acquire script once for `request`, as `mode` says; a waiter's calls are
    /// numbered by `call`.
    pub(super) async fn try_acquire(
        &self,
        keys: &LockKeys,
        request: &AcquireRequest<'_>,
        mode: Mode,
        call: u64,
    ) -> Result<Attempt, LockError> {
        let ttl = request.ttl;
        let mut invocation = keys.call(&ACQUIRE);
        invocation
            .arg(lease_millis(ttl))
            .arg(self.inner.layout.prefix())
            .arg(holder_meta(request.label));
        // A first try passes no more than the ttl, the prefix (for a hand-off's message, where
        // it finds the lock lapsed with waiters queued) and the holder's description, which the
        // grant stores with the lock.
        match mode {
            Mode::FirstTry => {}
            Mode::Queue => {
                invocation
                    .arg(millis(self.inner.liveness))
                    .arg(&self.inner.instance)
                    .arg(call);
            }
            // A liveness window of 0 says to leave the queue.
            Mode::Leave => {
                invocation.arg(0).arg(&self.inner.instance).arg(call);
            }
        }
        if self.inner.min_replicas == 0 {
            let (reply, resent) = self
                .inner
                .conn
                .run_acquire(|conn| invoke(conn, &ACQUIRE, &invocation))
                .await?;
            self.note_resent(keys, resent);
            return parse_attempt(reply).map_err(|reason| self.inner.conn.error("acquire", reason));
        }
        let replicas = self.replicas_for(ttl);
        let ((reply, acknowledged), resent) = self
            .inner
            .conn
            .run_acquire(|conn| invoke_then_wait(conn, &ACQUIRE, &invocation, replicas))
            .await?;
        self.note_resent(keys, resent);
        match parse_attempt(reply).map_err(|reason| self.inner.conn.error("acquire", reason))? {
            Attempt::Granted(_) if acknowledged < replicas.count => {
                Ok(Attempt::Unreplicated { acknowledged })
            }
            attempt => Ok(attempt),
        }
    }

    /// Remembers, where an acquire call was `resent`, that a copy of it may still be on its way.
    fn note_resent(&self, keys: &LockKeys, resent: bool) {
        if resent {
            self.inner.resent.note(keys);
        }
    }
}
