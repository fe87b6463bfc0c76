//! Claiming a grant, for the stores whose acquisitions run on dlock's background runtime rather
//! than in the caller's future (ZooKeeper, MySQL, PostgreSQL). A grant such an acquisition wins
//! is the caller's only once the caller's future claims it; a grant nobody claims within the
//! claim window is withdrawn and undone by the background side, and the key goes to the next
//! caller.
//!
//! Without it, a caller whose future is alive but no longer polled (parked in a `select!` that
//! polls it no more, its runtime stalled by blocking code) while its acquisition is in flight
//! would get a grant nobody reads: the key held by nobody for the whole ttl (or, for a lock node
//! that does not expire, as long as the caller stays away).
//!
//! The caller and the background side share one [`Claim`]: pending, then claimed by the caller
//! or withdrawn by the background side (the window passed after the grant) or by the caller's
//! [`Caller`] guard as its future is dropped. Whoever moves it off pending decides, once: a
//! claimed grant is the caller's lease, which its release undoes; a withdrawn one is undone by
//! the background side alone. A caller that comes back to a withdrawn grant treats it as not
//! granted, and keeps waiting for what is left of its wait.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

/// How long a grant waits for its caller to claim it, or the ttl where shorter: the SQL stores'
/// window, and ZooKeeper's unless its builder's `claim_window` says otherwise.
pub const DEFAULT_CLAIM_WINDOW: Duration = Duration::from_secs(3);

const PENDING: u8 = 0;
const CLAIMED: u8 = 1;
const WITHDRAWN: u8 = 2;

/// What became of one acquisition's grant: pending, then claimed or withdrawn, once.
pub(super) struct Claim {
    state: AtomicU8,
    /// Notified as the state leaves pending.
    settled: Notify,
}

impl Claim {
    fn new() -> Self {
        Claim {
            state: AtomicU8::new(PENDING),
            settled: Notify::new(),
        }
    }

    /// Moves a pending claim to `to`; false when it was settled already.
    fn settle(&self, to: u8) -> bool {
        let moved = self
            .state
            .compare_exchange(PENDING, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if moved {
            self.settled.notify_one();
        }
        moved
    }

    /// Withdraws the grant unless the caller claimed it; true when it is withdrawn.
    pub(super) fn withdraw(&self) -> bool {
        self.settle(WITHDRAWN);
        self.state.load(Ordering::Acquire) == WITHDRAWN
    }

    /// Whether the grant was withdrawn: by the caller's guard, its future dropped (or its try
    /// given up), or by the background side.
    pub(super) fn is_withdrawn(&self) -> bool {
        self.state.load(Ordering::Acquire) == WITHDRAWN
    }

    /// Returns once the claim is settled.
    pub(super) async fn until_settled(&self) {
        // `notify_one` keeps a permit when nobody waits yet, so a settlement between the load
        // and the wait is not missed.
        while self.state.load(Ordering::Acquire) == PENDING {
            self.settled.notified().await;
        }
    }

    /// Waits up to `window` for the caller, then withdraws the grant unless it was claimed;
    /// true when it is withdrawn (and so the background side's to undo).
    pub(super) async fn withdrawn_after(&self, window: Duration) -> bool {
        let _ = tokio::time::timeout(window, self.until_settled()).await;
        self.withdraw()
    }
}

/// The caller's hold on a [`Claim`]: dropped unclaimed (the caller's future was dropped), it
/// withdraws the grant, and the background side undoes whatever the acquisition made.
pub(super) struct Caller(Arc<Claim>);

impl Caller {
    /// A pending claim: the caller's guard, and the background side's share.
    pub(super) fn new() -> (Caller, Arc<Claim>) {
        let claim = Arc::new(Claim::new());
        (Caller(Arc::clone(&claim)), claim)
    }

    /// Claims the grant; false when it was withdrawn first.
    pub(super) fn claim(&self) -> bool {
        self.0.settle(CLAIMED)
    }

    /// Whether the caller claimed the grant.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(super) fn claimed(&self) -> bool {
        self.0.state.load(Ordering::Acquire) == CLAIMED
    }
}

impl Drop for Caller {
    fn drop(&mut self) {
        self.0.settle(WITHDRAWN);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Caller, WITHDRAWN};

    #[test]
    fn the_first_to_settle_a_claim_decides() {
        let (caller, claim) = Caller::new();
        assert!(caller.claim());
        assert!(!claim.withdraw(), "a claimed grant was withdrawn");
        let (caller, claim) = Caller::new();
        assert!(claim.withdraw());
        assert!(!caller.claim(), "a withdrawn grant was claimed");
    }

    #[tokio::test]
    async fn a_dropped_caller_withdraws_and_wakes_the_background_side() {
        let (caller, claim) = Caller::new();
        let waiting = tokio::spawn({
            let claim = claim.clone();
            async move { claim.until_settled().await }
        });
        drop(caller);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the background side was not woken")
            .unwrap();
        assert_eq!(
            claim.state.load(std::sync::atomic::Ordering::Acquire),
            WITHDRAWN
        );
    }

    #[tokio::test]
    async fn a_grant_nobody_claims_is_withdrawn_after_the_window() {
        let (caller, claim) = Caller::new();
        assert!(claim.withdrawn_after(Duration::from_millis(20)).await);
        assert!(!caller.claim());
    }
}
