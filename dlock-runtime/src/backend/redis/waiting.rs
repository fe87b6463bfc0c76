//! Waiting in a key's queue: the loop that waits for a hand-off, the back-off of its fallback
//! polls, and the guard that leaves the queue when the waiter goes away.

use std::time::{Duration, Instant};

use super::keys::LockKeys;
use super::scripts::{Attempt, Mode};
use super::subscriber::Subscription;
use super::RedisBackend;
use crate::backend::{AcquireRequest, Acquired};
use crate::{LockError, Owner};

/// The first fallback poll of a waiter; it doubles (with jitter) up to a third of the liveness
/// window.
const FIRST_POLL: Duration = Duration::from_millis(250);

/// How long a waiter lets an attempt to subscribe run before it polls all the same: longer
/// than a SUBSCRIBE takes on a working connection, or a new connection to a server that
/// answers, so that it then polls once only; far shorter than a waiter key lives.
const SUBSCRIBE_GRACE: Duration = Duration::from_millis(100);

impl RedisBackend {
    /// Waits for a busy key in its queue, until it is handed over or `deadline` passes.
    pub(super) async fn wait_in_queue(
        &self,
        keys: &LockKeys,
        request: &AcquireRequest<'_>,
        deadline: Instant,
    ) -> Result<Option<Acquired>, LockError> {
        let mut subscription: Subscription = self
            .inner
            .subscriber
            .register(keys.channel(), keys.owner().to_owned());
        // Leaves the queue (or releases a key handed over meanwhile) if this future is dropped
        // or fails.
        let mut guard = LeaveGuard {
            backend: self.clone(),
            key: request.key.to_owned(),
            owner: request.owner,
            armed: true,
        };
        // A hand-off grants the key for the waiter's claim window (the liveness window, or the
        // ttl where shorter): a waiter whose message is lost (not subscribed yet, pub/sub down)
        // finds the grant by its fallback poll, which therefore comes within a third of that
        // window, not of the liveness window alone.
        let claim_window = self.inner.liveness.min(request.ttl);
        let mut backoff = Backoff::new(FIRST_POLL, claim_window / 3, request.owner);
        // Subscribing waits no longer than this before the poll: the polls keep the waiter key
        // alive, and a claim is one of them.
        let grace = SUBSCRIBE_GRACE.min(claim_window / 10);
        loop {
            // Subscribed before the script queues this waiter, so the hand-off's message cannot
            // come first; or, where that takes longer, polled again once subscribed. Without
            // pub/sub (it failed), the timer below still finds the hand-off.
            if let Err(error) = subscription.ensure(grace).await {
                tracing::debug!(%error, key = request.key, "distributed_lock: redis subscribe failed; polling meanwhile");
            }
            let sent_at = Instant::now();
            let last = sent_at >= deadline;
            let mode = if last { Mode::Leave } else { Mode::Queue };
            let attempt = self.try_acquire(keys, request.ttl, mode).await?;
            match attempt {
                Attempt::Granted(fence) => {
                    guard.armed = false;
                    return Ok(Some(Acquired {
                        fence,
                        valid_from: sent_at,
                    }));
                }
                // The last attempt left the queue in the same script.
                Attempt::Busy { .. } if last => {
                    guard.armed = false;
                    return Ok(None);
                }
                Attempt::Unreplicated { acknowledged } if last => {
                    guard.armed = false;
                    return Err(self.undo_unreplicated(request, acknowledged).await);
                }
                Attempt::Unreplicated { acknowledged } => {
                    // The lock is this owner's on the primary, unconfirmed: asked again (the
                    // next call extends it, a fresh write to acknowledge) after the back-off.
                    tracing::debug!(
                        key = request.key,
                        acknowledged,
                        "distributed_lock: a grant too few replicas acknowledged; asking again"
                    );
                    let until = (Instant::now() + backoff.next()).min(deadline);
                    tokio::time::sleep_until(until.into()).await;
                }
                Attempt::Busy { pttl, first } => {
                    let now = Instant::now();
                    let mut until = (now + backoff.next()).min(deadline);
                    if let (true, Some(pttl)) = (first, pttl) {
                        // The head also watches the holder's expiry, which hands nothing on, and
                        // the lapse of a grant to a waiter before it that never claimed it.
                        until = until.min(now + pttl);
                    }
                    subscription.wait(until).await;
                    // Woken by a hand-off (or to look again): the next acquire call claims a lock
                    // handed to this owner — it finds it its own, extends it to the full ttl and
                    // answers the fence — within the claim window the hand-off granted.
                }
            }
        }
    }
}

/// Leaves the queue when a waiter's future is dropped or fails: from the background runtime,
/// since `Drop` cannot await.
struct LeaveGuard {
    backend: RedisBackend,
    key: String,
    owner: Owner,
    armed: bool,
}

impl Drop for LeaveGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (backend, key, owner) = (
            self.backend.clone(),
            std::mem::take(&mut self.key),
            self.owner,
        );
        self.backend.inner.cleanups.spawn(async move {
            if let Err(error) = backend.release_or_leave(&key, owner).await {
                tracing::debug!(%key, %error, "distributed_lock: leaving the redis queue failed; the waiter key will expire");
            }
        });
    }
}

/// Jittered exponential back-off for the fallback polls of a waiter.
struct Backoff {
    next: Duration,
    cap: Duration,
    state: u64,
}

impl Backoff {
    fn new(first: Duration, cap: Duration, owner: Owner) -> Self {
        // The owner token is random: a fine start for the jitter's generator.
        Backoff {
            next: first.min(cap),
            cap,
            state: owner.as_u128() as u64 | 1,
        }
    }

    fn next(&mut self) -> Duration {
        // xorshift64
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        // 75 % to 125 % of the nominal delay.
        let permille = 750 + self.state % 501;
        let delay = self.next.mul_f64(permille as f64 / 1000.0).min(self.cap);
        self.next = self.next.saturating_mul(2).min(self.cap);
        delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_jitter_up_to_the_cap() {
        let mut backoff = Backoff::new(
            Duration::from_millis(100),
            Duration::from_secs(1),
            Owner::random(),
        );
        let delays: Vec<Duration> = (0..8).map(|_| backoff.next()).collect();
        assert!(
            delays[0] >= Duration::from_millis(75) && delays[0] <= Duration::from_millis(125),
            "{delays:?}"
        );
        assert!(
            delays.iter().all(|d| *d <= Duration::from_secs(1)),
            "{delays:?}"
        );
        assert!(delays[7] >= Duration::from_millis(750), "{delays:?}");
    }
}
