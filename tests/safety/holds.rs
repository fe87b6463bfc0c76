//! A lease held at least some time after its grant (`hold_at_least`) keeps the key to the end of
//! its hold whatever comes after its release, and no longer: a renewal of the watchdog's that was
//! on its way and lands after the hold's expiry was set, or a first try at setting it that fails.
//! A hold is its body's: a lease no body ran under keeps none.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dlock::backend::{AcquireRequest, Acquired, Backend, MemoryBackend, Renewal};
use dlock::{distributed_lock, LockError, LockOptions, Locker, Owner};

use crate::support::unique_key;
use crate::Late;

/// The in-process store, whose renewals wait `renew_delay` before they reach it (a request held
/// up on its way), and whose first `failing_expiries` expiries set at a time fail. Counts the
/// renewals sent and those that reached the store. With `renewal_answers_lost`, a renewal takes
/// effect but its caller is told it failed; once closed, it answers nothing but errors.
#[derive(Clone, Default)]
struct Slow {
    store: MemoryBackend,
    renew_delay: Duration,
    failing_expiries: Arc<AtomicUsize>,
    renewals_sent: Arc<AtomicUsize>,
    renewals_landed: Arc<AtomicUsize>,
    renewal_answers_lost: bool,
    closed: Arc<AtomicBool>,
}

impl Slow {
    fn check_open(&self) -> Result<(), LockError> {
        match self.closed.load(Ordering::SeqCst) {
            true => Err(LockError::backend("the store was closed")),
            false => Ok(()),
        }
    }
}

impl Backend for Slow {
    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Option<Acquired>, LockError> {
        self.store.acquire(request).await
    }

    async fn release(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
        self.check_open()?;
        self.store.release(key, owner).await
    }

    async fn renew(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
        self.renewals_sent.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.renew_delay).await;
        // On its way since before the close: it lands all the same.
        let renewed = self.store.renew(leases).await;
        self.renewals_landed.fetch_add(1, Ordering::SeqCst);
        if self.renewal_answers_lost {
            return Err(LockError::backend("the answer was lost"));
        }
        renewed
    }

    async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    fn expires_at_a_set_time(&self) -> bool {
        true
    }

    async fn expire_after(
        &self,
        key: &str,
        owner: Owner,
        after: Duration,
    ) -> Result<bool, LockError> {
        self.check_open()?;
        let failing = &self.failing_expiries;
        if failing
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(LockError::backend("the store did not answer"));
        }
        self.store.expire_after(key, owner, after).await
    }
}

/// A renewal sent just before the release lands after the hold's expiry was set: it must not
/// cut the hold down to a ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_that_lands_after_the_release_does_not_cut_the_hold_short() {
    let store = Slow {
        renew_delay: Duration::from_millis(150),
        ..Slow::default()
    };
    let (holder, rival) = (
        Locker::with_backend(store.clone()),
        Locker::with_backend(store.clone()),
    );
    let key = unique_key("renewed-late");
    let job = LockOptions::new()
        .ttl(Duration::from_millis(300))
        .hold_at_least(Duration::from_secs(3));
    let lease = holder.lock(&*key, job).await.unwrap();
    // The first renewal leaves at 100 ms and reaches the store at 250 ms.
    tokio::time::sleep(Duration::from_millis(150)).await;
    lease.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let in_the_window = rival.lock(&*key, job).await;
    assert!(
        matches!(in_the_window, Err(LockError::Busy { .. })),
        "a late renewal cut the hold short: another replica ran in the window ({:?})",
        in_the_window.map(|lease| lease.fence())
    );
}

/// A renewal sent just before the release lands after the hold's expiry was set: it must not
/// stretch the hold either, to a ttl after it landed, past the hold's end. Nobody holds the key
/// then, and every replica would be turned away until then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_that_lands_after_the_release_does_not_stretch_the_hold() {
    a_renewal_on_its_way_at_the_end(HolderEnds::Release, false).await;
}

/// The same renewal on its way when the holder's locker is shut down rather than the lease
/// released: shutdown waits for it before it closes the store, so that the hold's expiry can be
/// sent again after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_on_its_way_at_shutdown_does_not_stretch_the_hold() {
    a_renewal_on_its_way_at_the_end(HolderEnds::Shutdown, false).await;
}

/// A renewal on its way at the release that takes effect, but whose answer is lost: the hold's
/// expiry is sent again all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_that_lands_unanswered_after_the_release_does_not_stretch_the_hold() {
    a_renewal_on_its_way_at_the_end(HolderEnds::Release, true).await;
}

/// How the holder of a lease with a hold ends it.
enum HolderEnds {
    Release,
    Shutdown,
}

/// A lease of 3 s held at least 1.5 s, whose first renewal leaves a third of the ttl in, at 1 s,
/// and reaches the store at 1.4 s (`answer_lost`: then reported failed), after the holder ended
/// the lease at 1.1 s, `ends` so, which set the key to expire at the hold's end, 1.5 s. At 2 s
/// another replica must get the key.
async fn a_renewal_on_its_way_at_the_end(ends: HolderEnds, answer_lost: bool) {
    let store = Slow {
        renew_delay: Duration::from_millis(400),
        renewal_answers_lost: answer_lost,
        ..Slow::default()
    };
    // The rival straight on the memory store, which a shutdown does not close for it.
    let (holder, rival) = (
        Locker::with_backend(store.clone()),
        Locker::with_backend(store.store.clone()),
    );
    let key = unique_key("renewed-after-the-hold");
    let job = LockOptions::new()
        .ttl(Duration::from_secs(3))
        .hold_at_least(Duration::from_millis(1500));
    let lease = holder.lock(&*key, job).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let in_flight = (
        store.renewals_sent.load(Ordering::SeqCst),
        store.renewals_landed.load(Ordering::SeqCst),
    );
    match ends {
        HolderEnds::Release => lease.release().await.unwrap(),
        HolderEnds::Shutdown => holder.shutdown().await.unwrap(),
    }
    assert_eq!(
        in_flight,
        (1, 0),
        "a renewal was to be on its way at the end (renewals sent, landed)"
    );
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(
        store.renewals_landed.load(Ordering::SeqCst),
        1,
        "the renewal was to land after the end"
    );
    let after_the_hold = rival.lock(&*key, job).await;
    assert!(
        after_the_hold.is_ok(),
        "the key stayed held by nobody past the hold's end: {after_the_hold:?}"
    );
}

/// The hold's expiry fails to reach the store at the release: it is tried again, and the key
/// stays held to the end of the hold rather than to the end of the lease's last renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_whose_expiry_fails_once_is_set_all_the_same() {
    let store = Slow {
        failing_expiries: Arc::new(AtomicUsize::new(1)),
        ..Slow::default()
    };
    let (holder, rival) = (
        Locker::with_backend(store.clone()),
        Locker::with_backend(store.clone()),
    );
    let key = unique_key("expiry-failed");
    let job = LockOptions::new()
        .ttl(Duration::from_millis(300))
        .hold_at_least(Duration::from_secs(3));
    let lease = holder.lock(&*key, job).await.unwrap();
    let released = lease.release().await;
    assert!(released.is_err(), "the first expiry was to fail");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let in_the_window = rival.lock(&*key, job).await;
    assert!(
        matches!(in_the_window, Err(LockError::Busy { .. })),
        "the hold ended with the failure of its expiry: another replica ran in the window ({:?})",
        in_the_window.map(|lease| lease.fence())
    );
}

#[distributed_lock(key = "<key>", ttl = "1s", hold_at_least = "30s", locker = locker)]
async fn nightly_job(locker: &Locker, key: &str, ran: &AtomicBool) -> Result<(), LockError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

/// A grant that reaches a stalled caller after the client's validity ran out, but while the
/// store still holds the key, runs no body: and keeps no hold either, which would leave the key
/// to nobody for the hold's 30 s.
#[tokio::test(flavor = "current_thread")]
async fn a_grant_too_late_to_run_its_body_keeps_no_hold() {
    let late = Late {
        // Past the client's validity (0.9 of the 1 s ttl), short of the store's expiry.
        acquire_delay: Duration::from_millis(950),
        acquire_blocks: true,
        ..Late::default()
    };
    let locker = Locker::with_backend(late.clone());
    let key = unique_key("late-hold");
    let ran = AtomicBool::new(false);
    let answer = nightly_job(&locker, &key, &ran).await;
    assert!(matches!(answer, Err(LockError::Lost { .. })), "{answer:?}");
    assert!(
        !ran.load(Ordering::SeqCst),
        "the body ran on an expired grant"
    );
    // Past the store's own expiry of the grant (1 s after it).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !late.store.is_held(&key),
        "a lease no body ran under kept the key for its hold"
    );
}

/// The same late grant through [`Locker::lock`]: the lease comes back not held, its caller
/// skips the job and drops it, and the key is free at once, not kept for the hold's 30 s.
#[tokio::test(flavor = "current_thread")]
async fn a_lease_granted_too_late_to_use_keeps_no_hold() {
    let late = Late {
        // Past the client's validity (0.9 of the 1 s ttl), short of the store's expiry.
        acquire_delay: Duration::from_millis(950),
        acquire_blocks: true,
        ..Late::default()
    };
    let locker = Locker::with_backend(late.clone());
    let key = unique_key("late-lease-hold");
    let job = LockOptions::new()
        .ttl(Duration::from_secs(1))
        .hold_at_least(Duration::from_secs(30));
    let lease = locker.lock(&*key, job).await.unwrap();
    assert!(
        !lease.is_held(),
        "a grant past its validity was handed over as held"
    );
    drop(lease);
    // Past the store's own expiry of the grant (1 s after it).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !late.store.is_held(&key),
        "a lease nobody could use kept the key for its hold"
    );
}

/// A campaign whose grant reaches its stalled caller after the lease's validity does not hand
/// back a leadership that is already lost: it gives that term up and campaigns again, and
/// comes back leading.
#[tokio::test(flavor = "current_thread")]
async fn a_campaign_elected_too_late_to_lead_campaigns_again() {
    let late = Late {
        // Past the client's validity (0.9 of the 1 s ttl), short of the store's expiry.
        acquire_delay: Duration::from_millis(950),
        acquire_blocks: true,
        ..Late::default()
    };
    let locker = Locker::with_backend(late.clone());
    let key = unique_key("late-leader");
    let options = LockOptions::new()
        .ttl(Duration::from_secs(1))
        .wait(Duration::from_secs(3));
    let leadership = tokio::time::timeout(Duration::from_secs(10), locker.campaign(&*key, options))
        .await
        .expect("the campaign never ended");
    // Every grant of this store comes late: the campaign ends without leading, never with a
    // leadership that is lost from the start.
    match leadership {
        Ok(leadership) => assert!(leadership.is_leader(), "elected, but already lost"),
        Err(error) => assert!(matches!(error, LockError::Busy { .. }), "{error:?}"),
    }
}
