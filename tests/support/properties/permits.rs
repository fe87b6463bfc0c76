//! The properties of a semaphore (`permits = N`): at most N bodies at once and N reached, waiters
//! served in arrival order, a permit whose holder vanished free again at its ttl, each permit a
//! lease of its own under the semaphore's key, and zero permits refused.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock::{current_lease, distributed_lock, LockError, LockOptions, Locker};

use super::super::{unique_key, Gauge, Store};
use super::locker;

#[distributed_lock(key = "<key>", ttl = "5s", wait = "60s", permits = 3, locker = locker)]
async fn count_inside_three(locker: &Locker, key: &str, gauge: &Gauge) -> Result<(), LockError> {
    gauge.enter();
    tokio::time::sleep(Duration::from_millis(100)).await;
    gauge.leave();
    Ok(())
}

/// Twenty-four callers over three lockers (as three processes would be) on a key with three
/// permits: all run, never more than three at once, and three at once at some point.
pub async fn three_permits_admit_three_bodies_at_once_and_no_more<S: Store>(store: &S) {
    let key = unique_key("permits");
    let gauge = Arc::new(Gauge::default());
    let mut lockers = Vec::new();
    for _ in 0..3 {
        lockers.push(locker(store).await);
    }
    let mut tasks = Vec::new();
    for i in 0..24 {
        let (locker, key, gauge) = (lockers[i % 3].clone(), key.clone(), gauge.clone());
        tasks.push(tokio::spawn(async move {
            count_inside_three(&locker, &key, &gauge).await
        }));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(gauge.entered(), 24, "every caller ran once");
    assert_eq!(gauge.max(), 3, "not exactly three callers inside at most");
}

#[distributed_lock(key = "<key>", ttl = "60s", wait = "60s", permits = 2, locker = &locker)]
async fn enter_two_and_record(
    locker: Locker,
    key: String,
    log: Arc<Mutex<Vec<(usize, Instant)>>>,
    id: usize,
) -> Result<(), LockError> {
    log.lock().unwrap().push((id, Instant::now()));
    Ok(())
}

/// Two permits held, six waiters queued one after another: none enters before a holder lets a
/// permit go, and once one does they go through it in the order they came, where the store
/// serves in arrival order ([`Store::SERVES_IN_ARRIVAL_ORDER`]), else each once.
pub async fn permit_waiters_are_served_in_arrival_order<S: Store>(store: &S) {
    let key = unique_key("permit-fifo");
    let locker = locker(store).await;
    let two = LockOptions::new().ttl(Duration::from_secs(60)).permits(2);
    let first = locker.lock(&*key, two).await.unwrap();
    let second = locker.lock(&*key, two).await.unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for id in 0..6 {
        waiters.push(tokio::spawn(enter_two_and_record(
            locker.clone(),
            key.clone(),
            log.clone(),
            id,
        )));
        // Far longer than an enqueue takes, so the arrival order is the spawn order.
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    assert!(
        log.lock().unwrap().is_empty(),
        "a waiter entered while both permits were held"
    );
    let released_at = Instant::now();
    first.release().await.unwrap();
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(30), waiter)
            .await
            .expect("the waiters did not all get the permit let go")
            .unwrap()
            .unwrap();
    }
    assert!(second.is_held());
    second.release().await.unwrap();
    let log = log.lock().unwrap().clone();
    assert!(
        log.iter().all(|(_, entered_at)| *entered_at >= released_at),
        "a waiter entered while both permits were held"
    );
    let order: Vec<usize> = log.iter().map(|(id, _)| *id).collect();
    if S::SERVES_IN_ARRIVAL_ORDER {
        assert_eq!(order, (0..6).collect::<Vec<_>>());
    } else {
        let mut entered = order.clone();
        entered.sort_unstable();
        assert_eq!(
            entered,
            (0..6).collect::<Vec<_>>(),
            "not every waiter got in once: {order:?}"
        );
    }
}

/// A permit whose holder vanished (its `Lease` forgotten: no release, no renewal) is free again
/// for a waiter once its ttl ran out, and not long before.
pub async fn a_vanished_holders_permit_is_free_again_after_its_ttl<S: Store>(store: &S) {
    let key = unique_key("permit-vanished");
    let locker = locker(store).await;
    let two = LockOptions::new().permits(2);
    let ttl = Duration::from_millis(1500);
    let kept = locker.lock(&*key, two).await.unwrap();
    let vanished = locker.lock(&*key, two.ttl(ttl).renew(false)).await.unwrap();
    let taken_at = Instant::now();
    std::mem::forget(vanished);
    let busy = locker.lock(&*key, two).await;
    assert!(
        matches!(busy, Err(LockError::Busy { .. })),
        "a third permit was granted: {busy:?}"
    );
    let next = locker
        .lock(&*key, two.wait(Duration::from_secs(20)))
        .await
        .expect("the vanished holder's permit never came free");
    let waited = taken_at.elapsed();
    assert!(
        waited >= Duration::from_millis(1000),
        "the permit came free after {waited:?}, before its ttl"
    );
    assert!(kept.is_held() && next.is_held());
    next.release().await.unwrap();
    kept.release().await.unwrap();
}

#[distributed_lock(key = "<key>", permits = 3, locker = locker)]
async fn permit_outer(locker: &Locker, key: &str) -> Result<(String, u64, u64), LockError> {
    let lease = current_lease().unwrap();
    let inner_fence = permit_inner(locker, key).await?;
    Ok((lease.key().to_owned(), lease.fence(), inner_fence))
}

#[distributed_lock(key = "<key>", permits = 3, locker = locker)]
async fn permit_inner(locker: &Locker, key: &str) -> Result<u64, LockError> {
    Ok(current_lease().unwrap().fence())
}

/// Each permit is a lease of its own (its own owner, and a fence that increases each time that
/// permit is granted again), and shows the semaphore's key: to its holder, to `current_lease`
/// in a body, and to a nested call on the key, which re-enters the permit its body holds.
pub async fn each_permit_is_a_lease_of_its_own_under_the_semaphores_key<S: Store>(store: &S) {
    let key = unique_key("permit-lease");
    let locker = locker(store).await;
    let three = LockOptions::new().permits(3);
    let mut leases = Vec::new();
    for _ in 0..3 {
        leases.push(locker.lock(&*key, three).await.unwrap());
    }
    for lease in &leases {
        assert_eq!(lease.key(), key);
        assert!(
            format!("{lease:?}").contains(&format!("{key:?}")),
            "{lease:?}"
        );
    }
    let mut owners: Vec<_> = leases.iter().map(|l| l.owner()).collect();
    owners.sort_unstable_by_key(|o| o.as_u128());
    owners.dedup();
    assert_eq!(owners.len(), 3, "two permits share an owner");
    match locker.lock(&*key, three).await {
        Err(LockError::Busy { key: busy }) => assert_eq!(busy, key),
        other => panic!("expected Busy on the semaphore's key, got {other:?}"),
    }
    // With the other two held, the next grant is the permit let go: its fence is greater.
    let let_go = leases.remove(1);
    let fence = let_go.fence();
    let_go.release().await.unwrap();
    let again = locker.lock(&*key, three).await.unwrap();
    assert!(
        again.fence() > fence,
        "a permit granted again got fence {} after {fence}",
        again.fence()
    );
    again.release().await.unwrap();

    // One permit free: the nested call, which does not wait, gets in only by re-entering the
    // permit its body holds.
    let (shown, fence, inner_fence) = permit_outer(&locker, &key)
        .await
        .expect("the nested call did not re-enter the permit");
    assert_eq!(shown, key);
    assert_eq!(inner_fence, fence);
    drop(leases);
}

/// Zero permits would let no caller in, ever, and a campaign with several would elect several
/// leaders: both refused before any I/O.
pub async fn zero_permits_and_a_campaign_with_permits_are_refused<S: Store>(store: &S) {
    let locker = locker(store).await;
    let refused = locker
        .lock(unique_key("no-permits"), LockOptions::new().permits(0))
        .await;
    assert!(
        matches!(&refused, Err(LockError::InvalidOptions { reason }) if reason.contains("permits")),
        "{refused:?}"
    );
    let refused = locker
        .campaign(unique_key("leaders"), LockOptions::new().permits(2))
        .await;
    assert!(
        matches!(&refused, Err(LockError::InvalidOptions { reason }) if reason.contains("one leader")),
        "{:?}",
        refused.map(|leadership| leadership.fence())
    );
}

/// A waiter whose future is no longer polled (kept in a `select!` that took another branch)
/// holds up the waiters behind it for a few seconds at most, not for as long as its future
/// lives: the line it heads is not kept for it.
pub async fn a_parked_permit_waiter_holds_up_the_line_only_briefly<S: Store>(store: &S) {
    let key = unique_key("permit-parked");
    let locker = locker(store).await;
    let options = LockOptions::new().ttl(Duration::from_secs(30)).permits(2);
    let first = locker.lock(&*key, options).await.unwrap();
    let second = locker.lock(&*key, options).await.unwrap();
    let mut parked = Box::pin(locker.lock(&*key, options.wait(Duration::from_secs(60))));
    // Polled for a while: it heads the line, and waits for the two permits.
    let polled = tokio::time::timeout(Duration::from_millis(300), parked.as_mut()).await;
    assert!(polled.is_err(), "a third permit was granted: {polled:?}");
    first.release().await.unwrap();
    let asked = Instant::now();
    let next = locker
        .lock(&*key, options.wait(Duration::from_secs(15)))
        .await;
    assert!(
        next.is_ok(),
        "a waiter behind a parked one never got the free permit: {next:?}"
    );
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "a waiter behind a parked one got the free permit only after {:?}",
        asked.elapsed()
    );
    drop(parked);
    next.unwrap().release().await.unwrap();
    second.release().await.unwrap();
}

#[distributed_lock(key = "<key>", locker = locker)]
async fn as_the_mutex(locker: &Locker, key: &str) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "<key>", permits = 2, locker = locker)]
async fn as_a_permit(locker: &Locker, key: &str) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "<key>", permits = 2, locker = locker)]
async fn a_permit_calling_the_mutex(locker: &Locker, key: &str) -> Result<(), LockError> {
    as_the_mutex(locker, key).await
}

#[distributed_lock(key = "<key>", locker = locker)]
async fn the_mutex_calling_a_permit(locker: &Locker, key: &str) -> Result<(), LockError> {
    as_a_permit(locker, key).await
}

/// A body holding a permit of a key whose nested call asks for the key's mutex (or the other
/// way round) is refused rather than re-entered: it would run beside the other permits' holders
/// believing it held the key alone (or beside two permit holders on a key of two permits).
pub async fn a_nested_call_of_the_other_kind_on_the_key_is_refused<S: Store>(store: &S) {
    let locker = locker(store).await;
    for answer in [
        a_permit_calling_the_mutex(&locker, &unique_key("permit-then-mutex")).await,
        the_mutex_calling_a_permit(&locker, &unique_key("mutex-then-permit")).await,
    ] {
        assert!(
            matches!(answer, Err(LockError::InvalidOptions { .. })),
            "a nested call of the other kind re-entered: {answer:?}"
        );
    }
}
