//! The properties of leader election ([`Locker::campaign`]): one leader at a time, the next
//! elected when the leader resigns, and a leader's work stopped when its term is taken away.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dlock::{LockError, LockOptions, Locker};

use super::super::{unique_key, Store};
use super::locker;

/// Two instances (each its own `Locker`) campaign; the second is elected only once the first
/// resigns, with a greater fence, and `leader` names whoever leads at each point.
pub async fn one_leader_at_a_time_and_the_next_on_resign<S: Store>(store: &S) {
    let key = unique_key("leader");
    let (first, second) = (locker(store).await, locker(store).await);
    let options = LockOptions::new().ttl(Duration::from_secs(5));
    assert!(
        first.leader(&key).await.unwrap().is_none(),
        "nobody leads yet"
    );
    let leading = first
        .campaign(&*key, options.label("instance-a"))
        .await
        .unwrap();
    let candidate = tokio::spawn({
        let (second, key) = (second.clone(), key.clone());
        async move { second.campaign(key, options.label("instance-b")).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!candidate.is_finished(), "a second leader was elected");
    let leader = second.leader(&key).await.unwrap().expect("a leader");
    assert_eq!(
        (leader.label(), leader.fence()),
        ("instance-a", leading.fence())
    );

    let first_term = leading.fence();
    leading.resign().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), candidate)
        .await
        .expect("the candidate was not elected after the leader resigned")
        .unwrap()
        .unwrap();
    assert!(next.is_leader());
    assert!(next.fence() > first_term, "the next term's fence went back");
    let leader = first.leader(&key).await.unwrap().expect("a leader");
    assert_eq!(
        (leader.label(), leader.fence()),
        ("instance-b", next.fence())
    );
    next.resign().await.unwrap();
    assert!(first.leader(&key).await.unwrap().is_none());
}

/// A leader evicted by an operator (`force_release`) has its work dropped: `run` returns
/// `Lost` and the work makes no step after it, while a candidate waiting on another instance is
/// elected.
pub async fn a_leader_whose_term_is_taken_away_stops_its_work<S: Store>(store: &S) {
    let key = unique_key("deposed");
    let (first, second) = (locker(store).await, locker(store).await);
    let options = LockOptions::new().ttl(Duration::from_secs(3));
    let leading = first.campaign(&*key, options).await.unwrap();
    let steps = Arc::new(AtomicU64::new(0));
    let work = {
        let steps = steps.clone();
        async move {
            loop {
                steps.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    let candidate = tokio::spawn({
        let (second, key) = (second.clone(), key.clone());
        async move { second.campaign(key, options).await }
    });
    let (outcome, ()) = tokio::join!(
        tokio::time::timeout(Duration::from_secs(15), leading.run(work)),
        async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let leader = second.leader(&key).await.unwrap().expect("a leader");
            let evicted = second.force_release(&key, leader.owner()).await.unwrap();
            assert_eq!(evicted, Some(leader.fence()), "the leader was not evicted");
        }
    );
    match outcome.expect("the deposed leader's work was never stopped") {
        Err(LockError::Lost { key: lost }) => assert_eq!(lost, key),
        other => panic!("expected Lost, got {other:?}"),
    }
    assert!(!leading.is_leader());
    let at_loss = steps.load(Ordering::SeqCst);
    assert!(at_loss > 0, "the work never ran");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(steps.load(Ordering::SeqCst), at_loss, "the work ran on");
    // Lost before it started: the work is not polled at all.
    let never = leading.run(async { steps.fetch_add(1, Ordering::SeqCst) });
    assert!(matches!(never.await, Err(LockError::Lost { .. })));
    assert_eq!(steps.load(Ordering::SeqCst), at_loss);
    let deposed_term = leading.fence();
    drop(leading);

    let next = tokio::time::timeout(Duration::from_secs(15), candidate)
        .await
        .expect("the waiting candidate was not elected")
        .unwrap()
        .unwrap();
    assert!(next.is_leader());
    assert!(
        next.fence() > deposed_term,
        "the next term's fence went back"
    );
    next.resign().await.unwrap();
}

/// A campaign cannot be made without renewal or with a hold (which would keep the key after a
/// resignation, leaderless), and a bounded one ends `Busy`.
pub async fn a_campaign_needs_renewal_and_respects_its_wait<S: Store>(store: &S) {
    let key = unique_key("campaign-options");
    let locker: Locker = locker(store).await;
    let unrenewed = locker
        .campaign(&*key, LockOptions::new().renew(false))
        .await;
    assert!(
        matches!(unrenewed, Err(LockError::InvalidOptions { .. })),
        "{unrenewed:?}"
    );
    let held_over = LockOptions::new().hold_at_least(Duration::from_secs(5));
    let held_over = locker.campaign(&*key, held_over).await;
    assert!(
        matches!(held_over, Err(LockError::InvalidOptions { .. })),
        "a campaign with a hold was accepted: {}",
        held_over
            .map(|l| l.fence())
            .map_or("an error".into(), |f| format!("fence {f}"))
    );
    let leading = locker.campaign(&*key, LockOptions::new()).await.unwrap();
    let bounded = LockOptions::new().wait(Duration::from_millis(100));
    let other = locker.campaign(&*key, bounded).await;
    assert!(matches!(other, Err(LockError::Busy { .. })), "{other:?}");
    leading.resign().await.unwrap();
}
