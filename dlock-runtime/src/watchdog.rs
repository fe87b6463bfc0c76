//! The watchdog: one renewal driver per `Locker`, renewing every lease it holds in batches.
//!
//! Leases come due at different times; a tick renews every lease whose renewal falls within the
//! next half period, so leases taken at about the same time share a round trip and a `Locker`
//! with ten thousand leases makes a handful of round trips per period, not ten thousand. The
//! driver runs on dlock's own background runtime and exits when it has nothing to renew.
//!
//! Each batch's round trip runs as a task of its own, so a slow store never holds up the ticks of
//! other leases, and each lease's confirmation is judged against its own deadline: a batch waits
//! as long as its longest-lived lease can, and a short lease in it is lost by its own timer
//! without cutting the others' patience short.
//!
//! A lease released while its renewal is on its way is renewed all the same where the store
//! still holds it for its owner: one released before the end of its hold
//! ([`LockOptions::hold_at_least`](crate::LockOptions::hold_at_least)), which the store keeps
//! to the hold's end. A renewal landing after the hold's expiry was set would stretch it to a
//! ttl after the renewal (renewals never shorten an expiry), and the key would be held by
//! nobody until then: such a lease's ending is sent again once the renewal is answered, so that
//! the ending is the last word on the store. (A copy of the renewal landing later still, one the
//! watchdog no longer waits for, is the store's to refuse: Redis marks a lock whose hold was
//! set, and its renew script leaves such a lock as it is; see renew.lua.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::backend::{DynBackend, Renewal};
use crate::background;
use crate::clock;
use crate::lease::{LeaseState, LossCause};

/// The shortest time before a renewal is tried again after the store failed to answer.
const RETRY_AFTER_FAILURE: Duration = Duration::from_millis(100);

/// What the watchdog needs of its locker for the leases with a hold (`hold_at_least`), whose
/// release sets an exact expiry that a renewal landing after it would stretch to a ttl (see
/// `Shared::renew`).
pub(crate) trait HoldEndings: Send + Sync {
    /// A guard that keeps the locker's shutdown waiting, as for a queued release, while a
    /// renewal of a lease with a hold is on its way: the ending that may have to follow it must
    /// be sent before the store is closed.
    fn renewal_on_its_way(&self) -> Box<dyn Send>;

    /// Sends again the ending of a lease released while its renewal was on its way: the hold's
    /// expiry, or a release once the hold is over, retried as the release's own ending is.
    fn end_again(&self, state: &LeaseState);
}

pub(crate) struct Watchdog {
    shared: Arc<Shared>,
}

struct Shared {
    backend: Arc<dyn DynBackend>,
    registry: Mutex<Registry>,
    wake: Notify,
    holds: Box<dyn HoldEndings>,
}

#[derive(Default)]
struct Registry {
    leases: HashMap<u64, Entry>,
    /// When the driver next wakes by itself, or `None` when no driver runs.
    driver_wakes_at: Option<Instant>,
}

struct Entry {
    state: Arc<LeaseState>,
    renew_at: Instant,
}

impl Watchdog {
    pub(crate) fn new(backend: Arc<dyn DynBackend>, holds: Box<dyn HoldEndings>) -> Self {
        Watchdog {
            shared: Arc::new(Shared {
                backend,
                registry: Mutex::default(),
                wake: Notify::new(),
                holds,
            }),
        }
    }

    /// Starts renewing `state` every ttl/3, counting from `confirmed_at`, the instant its
    /// validity counts from: a grant that took long to arrive is renewed soon, not a full period
    /// after it arrived — once a third of the validity it has left has passed, which leaves two
    /// thirds for the renewal to be confirmed. (A grant for less than the ttl, which a store
    /// reports as a `confirmed_at` far back, so gets its first renewal a third of the way into
    /// what it was granted: a body that ends sooner needs none.)
    pub(crate) fn watch(&self, state: &Arc<LeaseState>, confirmed_at: Instant) {
        let now = Instant::now();
        let renew_at = (confirmed_at + clock::renew_interval(state.ttl))
            .max(now + state.valid_until().saturating_duration_since(now) / 3);
        let mut registry = self.shared.registry();
        registry.leases.insert(
            state.id,
            Entry {
                state: state.clone(),
                renew_at,
            },
        );
        match registry.driver_wakes_at {
            None => {
                registry.driver_wakes_at = Some(renew_at);
                background::spawn(drive(self.shared.clone()));
            }
            Some(wakes_at) if renew_at < wakes_at => self.shared.wake.notify_one(),
            Some(_) => {}
        }
    }

    /// Stops renewing `state`.
    pub(crate) fn forget(&self, state: &LeaseState) {
        self.shared.registry().leases.remove(&state.id);
    }
}

impl Shared {
    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// When some lease is due by `now`, takes it together with every lease due within the next
    /// half period (to batch), and says when the next of the others falls due. Drops leases that
    /// were released or lost.
    ///
    /// Nothing is taken until some lease is actually due: right after a batch, the leases that
    /// fell due during its round trip wait for their own tick instead of trickling out in slivers
    /// of one round trip's worth, which keeps a period at about two calls however many leases.
    fn due(&self, now: Instant) -> (Vec<Arc<LeaseState>>, Option<Instant>) {
        let mut registry = self.registry();
        let mut earliest: Option<Instant> = None;
        registry.leases.retain(|_, entry| {
            let state = &entry.state;
            if state.is_released() || state.is_lost() {
                return false;
            }
            if now >= state.valid_until() {
                state.mark_lost(LossCause::Unconfirmed);
                return false;
            }
            earliest = Some(earliest.map_or(entry.renew_at, |e| e.min(entry.renew_at)));
            true
        });
        if earliest.is_none_or(|earliest| earliest > now) {
            registry.driver_wakes_at = earliest;
            return (Vec::new(), earliest);
        }
        let mut batch = Vec::new();
        let mut next: Option<Instant> = None;
        for entry in registry.leases.values_mut() {
            let state = &entry.state;
            let early = clock::renew_interval(state.ttl) / 2;
            if entry.renew_at <= now + early {
                batch.push(state.clone());
                // Until an answer comes, try again after a retry delay: a reply may be lost. A
                // lease with little validity left (a grant for less than its ttl, or renewals
                // that failed) tries again within a third of what is left, so that a lost reply
                // leaves room for another attempt before its deadline.
                let left = state.valid_until().saturating_duration_since(now);
                entry.renew_at =
                    now + retry_delay(state.ttl).min((left / 3).max(RETRY_AFTER_FAILURE));
            }
            next = Some(next.map_or(entry.renew_at, |n| n.min(entry.renew_at)));
        }
        registry.driver_wakes_at = next;
        (batch, next)
    }

    fn reschedule(&self, state: &LeaseState, renew_at: Instant) {
        if let Some(entry) = self.registry().leases.get_mut(&state.id) {
            entry.renew_at = renew_at;
        }
    }

    async fn renew(self: Arc<Self>, mut batch: Vec<Arc<LeaseState>>) {
        // A lease released since `due` took it needs no renewal, and one with a hold must not
        // get one: it would stretch the expiry its release set.
        batch.retain(|state| !state.is_released());
        if batch.is_empty() {
            return;
        }
        let _on_its_way = batch
            .iter()
            .any(|state| state.hold_until().is_some())
            .then(|| self.holds.renewal_on_its_way());
        let sent_at = Instant::now();
        let renewals: Vec<Renewal<'_>> = batch
            .iter()
            .map(|s| Renewal::new(&s.key, s.owner, s.ttl))
            .collect();
        // An answer is worth waiting for as long as some lease of the batch is still valid;
        // `confirm` judges each lease against its own validity.
        let patience = batch
            .iter()
            .map(|s| s.valid_until().saturating_duration_since(sent_at))
            .max()
            .unwrap_or_default()
            .max(Duration::from_millis(1));
        match tokio::time::timeout(patience, self.backend.renew_each(&renewals)).await {
            Ok(Ok(held)) => {
                for (state, held) in batch.iter().zip(held) {
                    match held {
                        Some(true) => {
                            // A lease confirmed up to the end of its ttl already (see
                            // `LeaseState::ending_after`) is checked on all the same, until
                            // that end: a check is how its holder learns that its key was
                            // taken away (an operator's release), so as to stop trusting it.
                            state.confirm(sent_at);
                            self.reschedule(state, sent_at + clock::renew_interval(state.ttl));
                            // Released since it was sent, and maybe before its hold's end:
                            // the renewal may have landed after the hold's expiry and
                            // stretched it to a ttl from now.
                            self.end_again_if_held_over(state);
                        }
                        Some(false) => state.mark_lost(LossCause::Refused),
                        // Not confirmed this round (its part of the store failed): retried
                        // after the failure delay `due` set, judged by its own deadline.
                        None => state.held.renewal_failed(),
                    }
                }
            }
            // A renewal reported failed or unanswered may have taken effect all the same (a
            // batch split in parts, an answer lost after the commit): a lease released with a
            // hold meanwhile is ended again as well.
            Ok(Err(error)) => {
                tracing::warn!(%error, leases = batch.len(), "distributed_lock: renewal failed; retrying");
                for state in &batch {
                    state.held.renewal_failed();
                    self.end_again_if_held_over(state);
                }
            }
            Err(_) => {
                tracing::warn!(
                    leases = batch.len(),
                    ?patience,
                    "distributed_lock: renewal timed out; retrying"
                );
                for state in &batch {
                    state.held.renewal_failed();
                    self.end_again_if_held_over(state);
                }
            }
        }
    }

    /// For a lease released with a hold since its renewal was sent: sends its ending again,
    /// after the renewal took effect, if it did (an exact expiry, so the same again; a release
    /// once the hold is over), so that the ending is the store's last word. A copy of the
    /// renewal that a connection sends again after a time-out and that lands later still is not
    /// covered here: the store refuses it (Redis: the hold's mark, see renew.lua).
    fn end_again_if_held_over(&self, state: &LeaseState) {
        if state.is_released() && state.hold_until().is_some() {
            self.holds.end_again(state);
        }
    }
}

/// How long after a renewal is sent the lease is renewed again if no answer came: a quarter
/// period (at least 100 ms), so a lost reply costs a fraction of the lease while a slow store is
/// not flooded with requests that overlap.
fn retry_delay(ttl: Duration) -> Duration {
    (clock::renew_interval(ttl) / 4)
        .max(RETRY_AFTER_FAILURE)
        .min(clock::renew_interval(ttl))
}

async fn drive(shared: Arc<Shared>) {
    loop {
        let (batch, next) = shared.due(Instant::now());
        if !batch.is_empty() {
            background::spawn(shared.clone().renew(batch));
            continue;
        }
        let Some(next) = next else {
            // Nothing left to renew; `watch` starts a new driver for the next lease.
            return;
        };
        tokio::select! {
            () = shared.wake.notified() => {}
            () = tokio::time::sleep_until(next.into()) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MemoryBackend;
    use crate::Owner;

    /// Leases without holds only.
    struct NoHolds;

    impl HoldEndings for NoHolds {
        fn renewal_on_its_way(&self) -> Box<dyn Send> {
            Box::new(())
        }

        fn end_again(&self, _: &LeaseState) {}
    }

    /// A lease granted for less than its ttl (a Redis hand-off the waiter started on: about
    /// 2.7 s of validity for a 30 s ttl) whose renewals go unanswered is tried again before its
    /// deadline, not once only: each retry comes within a third of the validity left, not after
    /// the quarter period (2.5 s) a full lease waits.
    #[test]
    fn a_short_grant_gets_more_than_one_renewal_try() {
        let shared = Shared {
            backend: Arc::new(MemoryBackend::new()),
            registry: Mutex::default(),
            wake: Notify::new(),
            holds: Box::new(NoHolds),
        };
        let ttl = Duration::from_secs(30);
        let start = Instant::now();
        let valid_from = (start + Duration::from_millis(2_700))
            .checked_sub(ttl - clock::safety_margin(ttl))
            .expect("an instant that far back");
        let state = Arc::new(LeaseState::new(
            "k".to_owned(),
            Owner::random(),
            1,
            ttl,
            valid_from,
            0,
        ));
        let valid_until = state.valid_until();
        shared.registry().leases.insert(
            state.id,
            Entry {
                state: state.clone(),
                // As `watch` schedules it: a third of the way into its validity.
                renew_at: start + Duration::from_millis(900),
            },
        );
        let mut tries = 0;
        let mut now = start;
        while now < valid_until {
            let (batch, next) = shared.due(now);
            tries += batch.len();
            // No answer ever comes: the next look is when the lease falls due again.
            let Some(next) = next else { break };
            now = next;
        }
        assert!(
            tries >= 2,
            "a lease with {:?} of validity got {tries} renewal tries before its deadline",
            valid_until - start
        );
    }
}
