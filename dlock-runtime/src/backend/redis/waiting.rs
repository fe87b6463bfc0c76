//! Waiting in a key's queue: the loop that waits for a hand-off, the back-off of its fallback
//! polls, and the guard that leaves the queue when the waiter goes away.

use std::time::{Duration, Instant};

use super::keys::LockKeys;
use super::scripts::{Attempt, Grant, Mode};
use super::subscriber::Subscription;
use super::{lease_millis, millis, RedisBackend};
use crate::backend::{AcquireRequest, Acquired};
use crate::clock::safety_margin;
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
        let mut calls = SentCalls::default();
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
            let call = calls.record(sent_at);
            let attempt = self.try_acquire(keys, request, mode, call).await?;
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
                    if let Some(grant) = subscription.take_grant() {
                        if let Some(acquired) = self.start_on_hand_off(request, grant, &calls) {
                            guard.armed = false;
                            return Ok(Some(acquired));
                        }
                    }
                    // Woken by a hand-off that cannot be started on (or to look again): the next
                    // acquire call claims a lock handed to this owner — it finds it its own,
                    // extends it to the full ttl and answers the fence — within the claim window
                    // the hand-off granted.
                }
            }
        }
    }
}

impl RedisBackend {
    /// The lease a hand-off's `grant` gives this waiter without a claim call, if it gives one.
    ///
    /// The grant was made after the server ran the waiter's call `grant.call` (it read the
    /// number that call wrote into the waiter key), which the waiter sent at `sent_at`; it holds
    /// the lock for the waiter's claim window from then on. So the server keeps the lock for
    /// the waiter at least until `sent_at` + the claim window, and the waiter may count on it,
    /// less the client's margin on that window, as on any lease counted from a send time. It
    /// starts on that where at least half of it is left, and leaves the extension to the full
    /// ttl to its first renewal, which the watchdog makes a third of the way into that validity
    /// (see [`Acquired::valid_from`]): a body that ends sooner costs no claim at all. With less
    /// left (a waiter whose runtime stalled, a message that took long), a claim call costs less
    /// than a lease about to run out. Not for a lease nobody renews (it would end with the claim
    /// window), nor where `min_replicas` wants the replicas' word on each grant, which only the
    /// claim call's `WAIT` gets.
    fn start_on_hand_off(
        &self,
        request: &AcquireRequest<'_>,
        grant: Grant,
        calls: &SentCalls,
    ) -> Option<Acquired> {
        if !request.renewed || self.inner.min_replicas > 0 {
            return None;
        }
        let sent_at = calls.sent_at(grant.call)?;
        // As the acquire script computes it, in the waiter key the grant read.
        let claim =
            Duration::from_millis(lease_millis(request.ttl).min(millis(self.inner.liveness)));
        let span = claim.saturating_sub(safety_margin(claim));
        let valid_until = sent_at + span;
        if valid_until.saturating_duration_since(Instant::now()) < span / 2 {
            return None;
        }
        let ttl = request.ttl;
        let valid_from = valid_until.checked_sub(ttl.saturating_sub(safety_margin(ttl)))?;
        Some(Acquired {
            fence: grant.fence,
            valid_from,
        })
    }
}

/// The send times of a waiter's latest calls, by number (from 1). Calls go one at a time, and a
/// grant comes after the call it names, before the next one reaches the server (which would
/// claim it): the latest few are all a grant can name.
#[derive(Default)]
struct SentCalls {
    next: u64,
    latest: [(u64, Option<Instant>); 4],
}

impl SentCalls {
    /// Numbers a call sent at `sent_at`.
    fn record(&mut self, sent_at: Instant) -> u64 {
        self.next += 1;
        self.latest[(self.next % 4) as usize] = (self.next, Some(sent_at));
        self.next
    }

    fn sent_at(&self, call: u64) -> Option<Instant> {
        match self.latest[(call % 4) as usize] {
            (number, sent_at) if number == call => sent_at,
            _ => None,
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
            if let Err(error) = backend.release_or_leave(&key, owner, true).await {
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
    fn only_the_latest_calls_are_known() {
        let mut calls = SentCalls::default();
        let start = Instant::now();
        for i in 0..6 {
            assert_eq!(calls.record(start + Duration::from_millis(i)), i + 1);
        }
        assert_eq!(calls.sent_at(6), Some(start + Duration::from_millis(5)));
        assert_eq!(calls.sent_at(3), Some(start + Duration::from_millis(2)));
        assert_eq!(calls.sent_at(2), None);
        assert_eq!(calls.sent_at(7), None);
        assert_eq!(calls.sent_at(0), None);
    }

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
