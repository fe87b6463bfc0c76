//! Siblings joined inside a body re-enter its lease one at a time: directly, through locks on
//! other keys, and when a call outlives the call it was started in.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dlock::{distributed_lock, LockError, Locker};

use crate::support::{unique_key, Gauge};

#[distributed_lock(key = "acct:<id>", locker = locker)]
async fn withdraw(
    locker: &Locker,
    id: &str,
    amount: u64,
    balance: &AtomicUsize,
    gauge: &Gauge,
) -> Result<bool, LockError> {
    gauge.enter();
    let seen = balance.load(Ordering::SeqCst) as u64;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let ok = seen >= amount;
    if ok {
        balance.store((seen - amount) as usize, Ordering::SeqCst);
    }
    gauge.leave();
    Ok(ok)
}

#[distributed_lock(key = "acct:<id>", locker = locker)]
async fn batch_of_two(
    locker: &Locker,
    id: &str,
    balance: &AtomicUsize,
    gauge: &Gauge,
) -> Result<(), LockError> {
    let (a, b) = tokio::join!(
        withdraw(locker, id, 80, balance, gauge),
        withdraw(locker, id, 80, balance, gauge)
    );
    assert!(
        a? ^ b?,
        "exactly one of two withdrawals of 80 from 100 succeeds"
    );
    Ok(())
}

#[distributed_lock(key = "acct:<id>", locker = locker)]
async fn batch_of_three(
    locker: &Locker,
    id: &str,
    balance: &AtomicUsize,
    gauge: &Gauge,
) -> Result<(), LockError> {
    let calls = (0..3).map(|_| withdraw(locker, id, 40, balance, gauge));
    let done: Vec<_> = futures_join_all(calls).await;
    assert_eq!(done.into_iter().filter(|r| *r.as_ref().unwrap()).count(), 2);
    Ok(())
}

/// `join_all` without a dependency: polls every future of `futures` until all are done.
async fn futures_join_all<F: std::future::Future>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(done) => *output = Some(done),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().map(Option::unwrap).collect()
}

#[tokio::test]
async fn siblings_joined_inside_a_body_reenter_one_at_a_time() {
    let locker = Locker::memory();
    let id = unique_key("siblings");

    let (balance, gauge) = (AtomicUsize::new(100), Gauge::default());
    batch_of_two(&locker, &id, &balance, &gauge).await.unwrap();
    assert_eq!(gauge.max(), 1, "two withdrawals were inside at once");
    assert_eq!(balance.load(Ordering::SeqCst), 20);

    let (balance, gauge) = (AtomicUsize::new(100), Gauge::default());
    batch_of_three(&locker, &id, &balance, &gauge)
        .await
        .unwrap();
    assert_eq!(gauge.max(), 1, "withdrawals were inside at once");
    assert_eq!(balance.load(Ordering::SeqCst), 20);
}

#[distributed_lock(key = "audit:<id>", locker = locker)]
async fn audited_withdraw(
    locker: &Locker,
    id: &str,
    balance: &AtomicUsize,
    gauge: &Gauge,
) -> Result<bool, LockError> {
    withdraw(locker, id, 80, balance, gauge).await
}

#[distributed_lock(key = "acct:<id>", locker = locker)]
async fn nested_siblings(
    locker: &Locker,
    id: &str,
    balance: &AtomicUsize,
    gauge: &Gauge,
) -> Result<(), LockError> {
    // One sibling reaches the account through a lock on another key, the other directly; both
    // re-enter the account's lease, and must still take turns.
    let (a, b) = tokio::join!(
        audited_withdraw(locker, id, balance, gauge),
        withdraw(locker, id, 80, balance, gauge)
    );
    assert!(a? ^ b?);
    // A call nested inside a re-entered call re-enters again, without waiting on itself.
    let again = withdraw_twice_nested(locker, id, balance, gauge).await?;
    assert!(!again, "nothing left to withdraw");
    Ok(())
}

#[distributed_lock(key = "acct:<id>", locker = locker)]
async fn withdraw_twice_nested(
    locker: &Locker,
    id: &str,
    balance: &AtomicUsize,
    gauge: &Gauge,
) -> Result<bool, LockError> {
    withdraw(locker, id, 80, balance, gauge).await
}

#[tokio::test]
async fn siblings_reaching_one_lease_through_other_locks_still_take_turns() {
    let locker = Locker::memory();
    let id = unique_key("nested-siblings");
    let (balance, gauge) = (AtomicUsize::new(100), Gauge::default());
    tokio::time::timeout(
        Duration::from_secs(5),
        nested_siblings(&locker, &id, &balance, &gauge),
    )
    .await
    .expect("a nested re-entry waited on itself")
    .unwrap();
    assert_eq!(gauge.max(), 1, "two withdrawals were inside at once");
    assert_eq!(balance.load(Ordering::SeqCst), 20);
}

/// Enters, stays 100 ms, leaves.
#[distributed_lock(key = "acct:<id>", locker = locker)]
async fn stay(locker: &Locker, id: &str, gauge: &Gauge) -> Result<(), LockError> {
    gauge.enter();
    tokio::time::sleep(Duration::from_millis(100)).await;
    gauge.leave();
    Ok(())
}

type Started<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), LockError>> + Send + 'a>>;

/// Starts a call on the held key, polls it once (it takes its turn and enters), and hands the
/// started call out to its caller, ending before it.
#[distributed_lock(key = "acct:<id>", locker = locker)]
async fn start_and_hand_out<'a>(
    locker: &'a Locker,
    id: &'a str,
    gauge: &'a Gauge,
) -> Result<Started<'a>, LockError> {
    let mut started: Started<'a> = Box::pin(stay(locker, id, gauge));
    std::future::poll_fn(|cx| {
        assert!(started.as_mut().poll(cx).is_pending());
        std::task::Poll::Ready(())
    })
    .await;
    Ok(started)
}

/// Starts two calls on the held key and polls each once: the first takes its turn and enters,
/// the second waits for it. Awaits the first, then hands the second, still waiting, out to its
/// caller, ending before it.
#[distributed_lock(key = "acct:<id>", locker = locker)]
async fn hand_out_a_waiting_call<'a>(
    locker: &'a Locker,
    id: &'a str,
    gauge: &'a Gauge,
) -> Result<Started<'a>, LockError> {
    let before = gauge.entered();
    let mut entered: Started<'a> = Box::pin(stay(locker, id, gauge));
    let mut waiting: Started<'a> = Box::pin(stay(locker, id, gauge));
    std::future::poll_fn(|cx| {
        assert!(entered.as_mut().poll(cx).is_pending());
        assert!(waiting.as_mut().poll(cx).is_pending());
        std::task::Poll::Ready(())
    })
    .await;
    assert_eq!(
        gauge.entered(),
        before + 1,
        "the second call entered beside the first"
    );
    entered.await?;
    Ok(waiting)
}

#[distributed_lock(key = "acct:<id>", locker = locker)]
async fn outlived_turn(locker: &Locker, id: &str, gauge: &Gauge) -> Result<(), LockError> {
    let started = start_and_hand_out(locker, id, gauge).await?;
    let (a, b) = tokio::join!(started, stay(locker, id, gauge));
    a?;
    b?;
    // Turns are handed back whatever order the calls ended in.
    tokio::time::timeout(Duration::from_secs(2), stay(locker, id, gauge))
        .await
        .expect("a later sibling waited forever for a turn nobody holds")?;
    // A call still waiting when the call it was started in ended gets the turn from the body
    // it was handed out to.
    let waiting = hand_out_a_waiting_call(locker, id, gauge).await?;
    tokio::time::timeout(Duration::from_secs(2), waiting)
        .await
        .expect("a call handed out while waiting waited forever for a turn nobody holds")
}

#[tokio::test]
async fn a_call_that_outlives_the_call_it_was_started_in_keeps_its_turn() {
    let locker = Locker::memory();
    let id = unique_key("outlived-turn");
    let gauge = Gauge::default();
    outlived_turn(&locker, &id, &gauge).await.unwrap();
    assert_eq!(gauge.max(), 1, "two bodies were inside at once");
    assert_eq!(gauge.entered(), 5);
}

/// Waits for a change that is never sent: it takes its turn and keeps it while pending.
#[distributed_lock(key = "acct:<id>", locker = locker)]
async fn refresh_balance(
    locker: &Locker,
    id: &str,
    never: tokio::sync::oneshot::Receiver<()>,
) -> Result<(), LockError> {
    let _ = never.await;
    Ok(())
}

#[distributed_lock(key = "acct:<id>", ttl = "500ms", locker = locker)]
async fn apply(
    locker: &Locker,
    id: &str,
    change: u64,
    balance: &AtomicUsize,
) -> Result<(), LockError> {
    balance.fetch_add(change as usize, Ordering::SeqCst);
    Ok(())
}

/// Races a refresh against incoming changes, applying each change while the refresh, which
/// holds the turn, is not polled: the change waits for a turn that is never handed back.
#[distributed_lock(key = "acct:<id>", locker = locker)]
async fn follow_changes(
    locker: &Locker,
    id: &str,
    mut changes: tokio::sync::mpsc::Receiver<u64>,
    balance: &AtomicUsize,
) -> Result<Result<(), LockError>, LockError> {
    let (_never_sent, never) = tokio::sync::oneshot::channel();
    let mut refresh = std::pin::pin!(refresh_balance(locker, id, never));
    loop {
        tokio::select! {
            // The refresh is polled first, so that it holds the turn when a change arrives.
            biased;
            done = &mut refresh => return Ok(done),
            Some(change) = changes.recv() => {
                if let Err(error) = apply(locker, id, change, balance).await {
                    return Ok(Err(error));
                }
            }
        }
    }
}

#[tokio::test]
async fn a_call_waiting_for_a_turn_its_holder_cannot_hand_back_gives_up_after_its_ttl() {
    let locker = Locker::memory();
    let id = unique_key("futurelock");
    let balance = AtomicUsize::new(0);
    let (send, changes) = tokio::sync::mpsc::channel(1);
    send.send(5).await.unwrap();
    let outcome = tokio::time::timeout(
        Duration::from_secs(5),
        follow_changes(&locker, &id, changes, &balance),
    )
    .await
    .expect("a call waited for ever for a turn held by a call nobody polls")
    .unwrap();
    assert!(
        matches!(outcome, Err(LockError::Busy { .. })),
        "{outcome:?}"
    );
    assert_eq!(
        balance.load(Ordering::SeqCst),
        0,
        "the change ran beside the refresh"
    );
    // The outer call ended and released its key.
    let key = format!("acct:{id}");
    assert!(locker.lock(&*key, dlock::LockOptions::new()).await.is_ok());
}
