//! The properties the lock promises, written once against any [`Store`]. Each test would fail if the
//! property did not hold: none only checks that a call returns.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock::{current_lease, distributed_lock, LockError, LockOptions, Locker};

use super::{lock_and_release, unique_key, Counting, Gauge, Store};

mod leadership;
mod permits;
mod read_write;
// Used by the `lock_properties!` of each store, not by every test crate that shares this module.
#[allow(unused_imports)]
pub use leadership::*;
#[allow(unused_imports)]
pub use permits::*;
#[allow(unused_imports)]
pub use read_write::*;

async fn locker<S: Store>(store: &S) -> Locker {
    Locker::with_backend(store.backend().await)
}

fn ttl(ms: u64) -> LockOptions {
    LockOptions::new().ttl(Duration::from_millis(ms))
}

#[distributed_lock(key = "<key>", ttl = "5s", wait = "60s", locker = locker)]
async fn count_inside(locker: &Locker, key: &str, gauge: &Gauge) -> Result<(), LockError> {
    gauge.enter();
    tokio::time::sleep(Duration::from_millis(2)).await;
    gauge.leave();
    Ok(())
}

pub async fn sixty_four_callers_never_overlap<S: Store>(store: &S) {
    let key = unique_key("overlap");
    let gauge = Arc::new(Gauge::default());
    let mut lockers = Vec::new();
    for _ in 0..4 {
        lockers.push(locker(store).await);
    }
    let mut tasks = Vec::new();
    for i in 0..64 {
        let (locker, key, gauge) = (lockers[i % 4].clone(), key.clone(), gauge.clone());
        tasks.push(tokio::spawn(async move {
            count_inside(&locker, &key, &gauge).await
        }));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(gauge.entered(), 64, "every caller ran once");
    assert_eq!(gauge.max(), 1, "two callers were inside at once");
}

#[distributed_lock(key = "<key>", locker = locker)]
async fn try_result(locker: &Locker, key: &str, ran: &AtomicBool) -> Result<u8, LockError> {
    ran.store(true, Ordering::SeqCst);
    Ok(1)
}

#[distributed_lock(key = "<key>", locker = locker)]
async fn try_option(locker: &Locker, key: &str, ran: &AtomicBool) -> Option<u8> {
    ran.store(true, Ordering::SeqCst);
    Some(1)
}

#[distributed_lock(key = "<key>", locker = locker)]
async fn try_unit(locker: &Locker, key: &str, ran: &AtomicBool) {
    ran.store(true, Ordering::SeqCst);
}

pub async fn losers_with_no_wait_skip_the_body<S: Store>(store: &S) {
    let key = unique_key("busy");
    let locker = locker(store).await;
    let holder = locker.lock(&*key, LockOptions::new()).await.unwrap();
    let ran = AtomicBool::new(false);
    match try_result(&locker, &key, &ran).await {
        Err(LockError::Busy { key: busy }) => assert_eq!(busy, key),
        other => panic!("expected Busy, got {other:?}"),
    }
    assert_eq!(try_option(&locker, &key, &ran).await, None);
    try_unit(&locker, &key, &ran).await;
    assert!(!ran.load(Ordering::SeqCst), "a loser ran its body");
    holder.release().await.unwrap();
    assert_eq!(try_result(&locker, &key, &ran).await.unwrap(), 1);
    assert!(ran.load(Ordering::SeqCst));
}

#[distributed_lock(key = "<key>", ttl = "60s", wait = "60s", locker = &locker)]
async fn enter_and_record(
    locker: Locker,
    key: String,
    log: Arc<Mutex<Vec<(usize, Instant)>>>,
    id: usize,
) -> Result<(), LockError> {
    log.lock().unwrap().push((id, Instant::now()));
    Ok(())
}

/// A waiter gets the key once the holder releases it, not before, and soon after: within a
/// second where the store wakes its waiters ([`Store::WAKES_WAITERS_ON_RELEASE`]) — its wait and
/// the holder's ttl are a minute, so only the release can have let it in — and within a few
/// seconds where waiters poll: it went on polling until the key came free.
pub async fn waiters_are_woken_by_the_release<S: Store>(store: &S) {
    let key = unique_key("wake");
    let locker = locker(store).await;
    let holder = locker.lock(&*key, ttl(60_000)).await.unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let waiter = tokio::spawn(enter_and_record(
        locker.clone(),
        key.clone(),
        log.clone(),
        0,
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        log.lock().unwrap().is_empty(),
        "the waiter entered while the key was held"
    );
    let released_at = Instant::now();
    holder.release().await.unwrap();
    waiter.await.unwrap().unwrap();
    let entered_at = log.lock().unwrap()[0].1;
    assert!(
        entered_at >= released_at,
        "the waiter entered before the release"
    );
    let latency = entered_at.duration_since(released_at);
    let limit = if S::WAKES_WAITERS_ON_RELEASE {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(3)
    };
    assert!(
        latency < limit,
        "the waiter entered {latency:?} after the release"
    );
}

/// Eight waiters queued one after another all get the key after the holder's release, none
/// before it: in the order they came where the store serves in arrival order
/// ([`Store::SERVES_IN_ARRIVAL_ORDER`]), else in any order but each once.
pub async fn waiters_are_served_in_arrival_order<S: Store>(store: &S) {
    let key = unique_key("fifo");
    let locker = locker(store).await;
    let holder = locker.lock(&*key, ttl(60_000)).await.unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for id in 0..8 {
        waiters.push(tokio::spawn(enter_and_record(
            locker.clone(),
            key.clone(),
            log.clone(),
            id,
        )));
        // Far longer than an enqueue takes, so the arrival order is the spawn order.
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    let released_at = Instant::now();
    holder.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap().unwrap();
    }
    let log = log.lock().unwrap().clone();
    assert!(
        log.iter().all(|(_, entered_at)| *entered_at >= released_at),
        "a waiter entered while the key was held"
    );
    let order: Vec<usize> = log.iter().map(|(id, _)| *id).collect();
    if S::SERVES_IN_ARRIVAL_ORDER {
        assert_eq!(order, (0..8).collect::<Vec<_>>());
    } else {
        let mut entered = order.clone();
        entered.sort_unstable();
        assert_eq!(
            entered,
            (0..8).collect::<Vec<_>>(),
            "not every waiter got in once: {order:?}"
        );
    }
}

#[distributed_lock(key = "<key>", locker = locker)]
async fn outer(locker: &Locker, key: &str, other: &str) -> Result<(u64, u64, String), LockError> {
    let fence = current_lease().unwrap().fence();
    let (inner_fence, _) = inner(locker, key).await?;
    let (_, other_key) = inner(locker, other).await?;
    Ok((fence, inner_fence, other_key))
}

#[distributed_lock(key = "<key>", locker = locker)]
async fn inner(locker: &Locker, key: &str) -> Result<(u64, String), LockError> {
    let lease = current_lease().unwrap();
    Ok((lease.fence(), lease.key().to_owned()))
}

pub async fn nested_call_on_the_same_key_reenters_without_acquiring<S: Store>(store: &S) {
    let backend = Counting::new(store.backend().await);
    let locker = Locker::with_backend(backend.clone());
    let (key, other) = (unique_key("nested"), unique_key("nested-other"));
    let (fence, inner_fence, other_key) = outer(&locker, &key, &other).await.unwrap();
    assert_eq!(
        inner_fence, fence,
        "the nested call runs under the outer lease"
    );
    // Fences are per key (a store may count each key from 1), so the lease itself says which
    // key it holds.
    assert_eq!(other_key, other, "another key is another lease");
    assert_eq!(
        backend.acquires(),
        2,
        "one acquire for the key and one for the other key"
    );
    // Only the outermost exit released: the key is free now.
    assert!(locker.lock(&*key, LockOptions::new()).await.is_ok());
}

#[distributed_lock(key = "<key>", locker = &locker)]
async fn hold_briefly(locker: Locker, key: String) -> Result<u64, LockError> {
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(current_lease().unwrap().fence())
}

#[distributed_lock(key = "<key>", locker = locker)]
async fn spawn_same_key(locker: &Locker, key: &str) -> Result<Result<u64, LockError>, LockError> {
    Ok(tokio::spawn(hold_briefly(locker.clone(), key.to_owned()))
        .await
        .unwrap())
}

pub async fn spawned_and_joined_calls_are_other_owners<S: Store>(store: &S) {
    let key = unique_key("owners");
    let locker = locker(store).await;
    let spawned = spawn_same_key(&locker, &key).await.unwrap();
    assert!(
        matches!(spawned, Err(LockError::Busy { .. })),
        "a spawned task re-entered: {spawned:?}"
    );

    let (a, b) = tokio::join!(
        hold_briefly(locker.clone(), key.clone()),
        hold_briefly(locker.clone(), key.clone())
    );
    let busy = [&a, &b]
        .iter()
        .filter(|r| matches!(r, Err(LockError::Busy { .. })))
        .count();
    assert_eq!(busy, 1, "two joined calls must be two owners: {a:?} {b:?}");
}

#[distributed_lock(key = "<key>", ttl = "60s", locker = &locker)]
async fn panics_inside(locker: Locker, key: String) -> Result<(), LockError> {
    panic!("boom");
}

#[distributed_lock(key = "<key>", ttl = "60s", locker = &locker)]
async fn sleeps_for_a_minute(locker: Locker, key: String) -> Result<(), LockError> {
    tokio::time::sleep(Duration::from_secs(60)).await;
    Ok(())
}

/// Acquires `key` within a few seconds, which — with a 60 s ttl on the previous holder — proves
/// the previous holder released it rather than let it expire.
async fn acquires_soon(locker: &Locker, key: &str) {
    let options = LockOptions::new().wait(Duration::from_secs(5));
    let lease = locker.lock(key, options).await;
    assert!(lease.is_ok(), "the key was not released: {lease:?}");
}

pub async fn panic_releases_at_once<S: Store>(store: &S) {
    let key = unique_key("panic");
    let locker = locker(store).await;
    let outcome = tokio::spawn(panics_inside(locker.clone(), key.clone())).await;
    assert!(outcome.unwrap_err().is_panic());
    acquires_soon(&locker, &key).await;
}

pub async fn dropped_caller_future_releases_at_once<S: Store>(store: &S) {
    let key = unique_key("drop");
    let locker = locker(store).await;
    let call = sleeps_for_a_minute(locker.clone(), key.clone());
    assert!(tokio::time::timeout(Duration::from_millis(300), call)
        .await
        .is_err());
    acquires_soon(&locker, &key).await;
}

#[distributed_lock(key = "<key>", ttl = "300ms", locker = locker)]
async fn outlive_ttl(locker: &Locker, key: &str) -> Result<bool, LockError> {
    tokio::time::sleep(Duration::from_millis(1200)).await;
    Ok(current_lease().unwrap().is_held())
}

pub async fn body_longer_than_ttl_keeps_the_key<S: Store>(store: &S) {
    let key = unique_key("long");
    let (holder, rival) = (locker(store).await, locker(store).await);
    let body = tokio::spawn({
        let (holder, key) = (holder.clone(), key.clone());
        async move { outlive_ttl(&holder, &key).await }
    });
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let attempt = rival.lock(&*key, LockOptions::new()).await;
        assert!(
            matches!(attempt, Err(LockError::Busy { .. })),
            "a rival got the key: {attempt:?}"
        );
    }
    assert!(
        body.await.unwrap().unwrap(),
        "the lease was not held to the end"
    );
}

#[distributed_lock(key = "<key>", ttl = "600ms", locker = locker)]
async fn work_until_cancelled(
    locker: &Locker,
    key: &str,
    started: &AtomicBool,
    finished: &AtomicBool,
) -> Result<(), LockError> {
    started.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(30)).await;
    finished.store(true, Ordering::SeqCst);
    Ok(())
}

pub async fn lease_taken_away_cancels_the_body<S: Store>(store: &S) {
    let key = unique_key("taken");
    let locker = locker(store).await;
    let (started, finished) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let call = tokio::spawn({
        let (locker, key, started, finished) = (
            locker.clone(),
            key.clone(),
            started.clone(),
            finished.clone(),
        );
        async move { work_until_cancelled(&locker, &key, &started, &finished).await }
    });
    while !started.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    store.take_away(&key).await;
    let result = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the body was not cancelled");
    assert!(matches!(result.unwrap(), Err(LockError::Lost { .. })));
    assert!(!finished.load(Ordering::SeqCst));
}

#[distributed_lock(key = "<key>", ttl = "300ms", renew = false, on_lost = "continue", locker = locker)]
async fn run_on_after_loss(locker: &Locker, key: &str) -> Result<(bool, bool), LockError> {
    let before = current_lease().unwrap().is_held();
    tokio::time::sleep(Duration::from_millis(600)).await;
    Ok((before, current_lease().unwrap().is_held()))
}

pub async fn on_lost_continue_lets_the_body_finish<S: Store>(store: &S) {
    let locker = locker(store).await;
    let (before, after) = run_on_after_loss(&locker, &unique_key("continue"))
        .await
        .unwrap();
    assert!(before && !after, "held before: {before}, after: {after}");
}

#[distributed_lock(key = "<key>", ttl = "300ms", renew = false, locker = locker)]
async fn unrenewed(locker: &Locker, key: &str, finished: &AtomicBool) -> Result<(), LockError> {
    tokio::time::sleep(Duration::from_secs(30)).await;
    finished.store(true, Ordering::SeqCst);
    Ok(())
}

pub async fn unrenewed_lease_is_lost_when_its_ttl_runs_out<S: Store>(store: &S) {
    let locker = locker(store).await;
    let finished = AtomicBool::new(false);
    let started = Instant::now();
    let result = unrenewed(&locker, &unique_key("unrenewed"), &finished).await;
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
    assert!(!finished.load(Ordering::SeqCst));
    assert!(started.elapsed() < Duration::from_secs(30));
}

pub async fn fences_strictly_increase<S: Store>(store: &S) {
    let (key, other) = (unique_key("fence"), unique_key("fence-other"));
    let (a, b) = (locker(store).await, locker(store).await);
    let mut last = 0;
    let mut check = |fence: u64, how: &str| {
        assert!(fence > last, "{how}: fence {fence} after {last}");
        last = fence;
    };
    for round in 0..5 {
        let locker = if round % 2 == 0 { &a } else { &b };
        let lease = locker.lock(&*key, ttl(5_000)).await.unwrap();
        check(lease.fence(), "after a release");
        // Acquisitions of another key in between must not disturb this key's order.
        lock_and_release(&b, &other, ttl(5_000)).await;
        lease.release().await.unwrap();
    }
    // After an expiry, and after a drop without release.
    let lease = a.lock(&*key, ttl(5_000)).await.unwrap();
    check(lease.fence(), "before an expiry");
    store.expire(&key).await;
    let taken_over = b
        .lock(&*key, ttl(5_000).wait(Duration::from_secs(5)))
        .await
        .unwrap();
    check(taken_over.fence(), "after an expiry");
    // The expired holder's late release must not free the new holder's key.
    lease.release().await.unwrap();
    assert!(matches!(
        a.lock(&*key, LockOptions::new()).await,
        Err(LockError::Busy { .. })
    ));
    let lease = taken_over;
    drop(lease);
    let lease = a
        .lock(&*key, ttl(5_000).wait(Duration::from_secs(5)))
        .await
        .unwrap();
    check(lease.fence(), "after a drop");
}

#[distributed_lock(key = "acct:<open_id>:<run>", locker = locker)]
async fn rendered_key(locker: &Locker, open_id: &str, run: &str) -> Option<String> {
    Some(current_lease()?.key().to_owned())
}

pub async fn keys_are_escaped<S: Store>(store: &S) {
    let locker = locker(store).await;
    let run = unique_key("escape");
    assert_eq!(
        rendered_key(&locker, "a:b", &run).await.unwrap(),
        format!("acct:a%3Ab:{run}")
    );
    assert_eq!(
        rendered_key(&locker, "a%3Ab", &run).await.unwrap(),
        format!("acct:a%253Ab:{run}")
    );
}

pub async fn manual_lease_excludes_and_releases<S: Store>(store: &S) {
    let key = unique_key("manual");
    let (a, b) = (locker(store).await, locker(store).await);
    let lease = a.lock(&*key, ttl(60_000)).await.unwrap();
    assert!(lease.is_held());
    assert_eq!(lease.key(), key);
    assert!(matches!(
        b.lock(&*key, LockOptions::new()).await,
        Err(LockError::Busy { .. })
    ));
    lease.release().await.unwrap();
    let lease = b.lock(&*key, ttl(60_000)).await.unwrap();
    drop(lease);
    acquires_soon(&a, &key).await;
}

/// A store driven directly may be asked to wait without end (`Duration::MAX`): a deadline that
/// far is no deadline, not an overflow.
pub async fn a_wait_without_end_grants_a_free_key<S: Store>(store: &S) {
    use dlock::backend::{AcquireRequest, Backend};
    let key = unique_key("wait-without-end");
    let backend = store.backend().await;
    let owner = dlock::Owner::random();
    let request = AcquireRequest::new(&key, owner, Duration::from_secs(30), Duration::MAX);
    let acquired = backend.acquire(&request).await.unwrap();
    assert!(acquired.is_some(), "a free key was not granted");
    assert!(backend.release(&key, owner).await.unwrap());
}

pub async fn renewals_are_batched<S: Store>(store: &S) {
    let backend = Counting::new(store.backend().await);
    let locker = Locker::with_backend(backend.clone());
    let mut leases = Vec::new();
    for i in 0..200 {
        leases.push(
            locker
                .lock(unique_key(&format!("batch{i}")), ttl(1_500))
                .await
                .unwrap(),
        );
    }
    let counted = || {
        (
            backend.renew_calls.load(Ordering::SeqCst),
            backend.renewed.load(Ordering::SeqCst),
        )
    };
    let (calls_before, renewed_before) = counted();
    // Three renewal periods (ttl/3 = 500 ms each).
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (calls, renewed) = (counted().0 - calls_before, counted().1 - renewed_before);
    assert!(
        leases.iter().all(|lease| lease.is_held()),
        "a lease was lost"
    );
    assert!(
        renewed >= 400,
        "only {renewed} renewals of 200 leases over three periods"
    );
    // One call per lease would carry one lease each; batching carries dozens per call.
    assert!(
        renewed / calls.max(1) >= 25,
        "{calls} renewal calls for {renewed} renewals"
    );
}

/// `hold_at_least`: a scheduled job done in a moment keeps the key until the end of its hold,
/// when the store lets it go by itself. Another replica that does not wait finds it busy in the
/// window; one that waits gets it at the end of the hold, not before and not much later (a
/// store whose waiters poll, MySQL, within its poll). A lease released after its hold is over
/// frees the key at once. A store that cannot expire a key at a set time says so before
/// acquiring anything.
pub async fn a_hold_keeps_the_key_to_its_end_and_no_longer<S: Store>(store: &S) {
    use dlock::backend::Backend;

    let key = unique_key("hold");
    let (first, second) = (locker(store).await, locker(store).await);
    let hold = Duration::from_secs(2);
    let job = ttl(30_000).hold_at_least(hold);
    if !store.backend().await.expires_at_a_set_time() {
        let refused = first.lock(&*key, job).await;
        assert!(
            matches!(refused, Err(LockError::Unsupported { .. })),
            "{refused:?}"
        );
        return;
    }
    let asked = Instant::now();
    let done_at_once = first.lock(&*key, job).await.unwrap();
    let granted = Instant::now();
    let first_fence = done_at_once.fence();
    done_at_once.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let in_the_window = second.lock(&*key, job).await;
    assert!(
        matches!(in_the_window, Err(LockError::Busy { .. })),
        "another replica ran in the window: {:?}",
        in_the_window.map(|lease| lease.fence())
    );
    let next = second
        .lock(&*key, ttl(30_000).wait(Duration::from_secs(10)))
        .await
        .unwrap();
    let got = Instant::now();
    // The store's clock and this one tick apart by a few milliseconds at most.
    assert!(
        got + Duration::from_millis(20) >= asked + hold,
        "the key came free {:?} into a hold of {hold:?}",
        got - asked
    );
    assert!(
        got <= granted + hold + Duration::from_millis(1500),
        "the key was held {:?} past the end of its hold",
        got - (granted + hold)
    );
    assert!(next.fence() > first_fence);
    next.release().await.unwrap();

    // A holder handed the key by a release (it waited) keeps it for its whole hold too, counted
    // from when it got it, however long it waited.
    let before = first.lock(&*key, ttl(30_000)).await.unwrap();
    let waiting = tokio::spawn({
        let (second, key) = (second.clone(), key.clone());
        async move { second.lock(&*key, job.wait(Duration::from_secs(10))).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    before.release().await.unwrap();
    let handed = waiting.await.unwrap().unwrap();
    handed.release().await.unwrap();
    let in_its_window = first.lock(&*key, job).await;
    assert!(
        matches!(in_its_window, Err(LockError::Busy { .. })),
        "another replica ran in the window of a holder that waited for the key: {:?}",
        in_its_window.map(|lease| lease.fence())
    );
    first
        .lock(&*key, ttl(30_000).wait(Duration::from_secs(10)))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    // A release its caller stopped waiting for still keeps the hold.
    let abandoned = first.lock(&*key, job).await.unwrap();
    let _ = tokio::time::timeout(Duration::ZERO, abandoned.release()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after_abandoned = second.lock(&*key, job).await;
    assert!(
        matches!(after_abandoned, Err(LockError::Busy { .. })),
        "another replica ran in the window of a holder whose release was dropped: {:?}",
        after_abandoned.map(|lease| lease.fence())
    );
    second
        .lock(&*key, ttl(30_000).wait(Duration::from_secs(10)))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    // A hold that is over by the release: the key is free at once.
    let long_job = first
        .lock(&*key, ttl(30_000).hold_at_least(Duration::from_millis(100)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    long_job.release().await.unwrap();
    second
        .lock(&*key, ttl(30_000))
        .await
        .expect("a lease released after its hold frees the key")
        .release()
        .await
        .unwrap();
}
