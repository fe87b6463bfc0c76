//! A body never runs on a lease the client knows is invalid: not on a grant that arrived after
//! its expiry, not after a lease ran out or was taken away while its runtime was busy, and not
//! in a re-entered call whose own `on_lost` says cancel.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dlock::backend::MemoryBackend;
use dlock::{current_lease, distributed_lock, LockError, Locker};

use crate::support::unique_key;
use crate::Late;

#[distributed_lock(key = "<key>", ttl = "100ms", locker = locker)]
async fn mark_cancel(locker: &Locker, key: &str, ran: &AtomicBool) -> Result<(), LockError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(key = "<key>", ttl = "100ms", on_lost = "continue", locker = locker)]
async fn mark_continue(locker: &Locker, key: &str, ran: &AtomicBool) -> Result<(), LockError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn a_grant_that_reaches_a_stalled_caller_after_its_expiry_never_runs_the_body() {
    let late = Late {
        acquire_delay: Duration::from_millis(400),
        acquire_blocks: true,
        ..Late::default()
    };
    let locker = Locker::with_backend(late.clone());
    for on_lost in ["cancel", "continue"] {
        let key = unique_key("stalled-grant");
        let ran = AtomicBool::new(false);
        let result = match on_lost {
            "cancel" => mark_cancel(&locker, &key, &ran).await,
            _ => mark_continue(&locker, &key, &ran).await,
        };
        assert!(
            !ran.load(Ordering::SeqCst),
            "on_lost = {on_lost}: the body ran on a lease that had expired 300 ms before"
        );
        assert!(
            matches!(result, Err(LockError::Lost { .. })),
            "on_lost = {on_lost}: {result:?}"
        );
    }
}

/// Awaits ten short replies, noting after each whether the lease was still valid when the body
/// went on.
#[distributed_lock(key = "<key>", ttl = "300ms", renew = false, locker = locker)]
async fn ten_replies(
    locker: &Locker,
    key: &str,
    steps: &AtomicUsize,
    ran_invalid: &AtomicBool,
) -> Result<(), LockError> {
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if !current_lease().unwrap().is_held() {
            ran_invalid.store(true, Ordering::SeqCst);
        }
        steps.fetch_add(1, Ordering::SeqCst);
    }
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn a_lease_that_runs_out_while_the_runtime_is_busy_never_lets_the_body_resume() {
    let locker = Locker::memory();
    let key = unique_key("busy-runtime");
    let (steps, ran_invalid) = (AtomicUsize::new(0), AtomicBool::new(false));
    let body = ten_replies(&locker, &key, &steps, &ran_invalid);
    // A task on the same runtime that keeps its thread for 1 s once the body is waiting on its
    // first reply: the lease (300 ms) runs out before the body is polled again.
    let hog = async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        std::thread::sleep(Duration::from_secs(1));
    };
    let (result, ()) = tokio::join!(body, hog);
    assert!(
        !ran_invalid.load(Ordering::SeqCst),
        "the body went on after its lease ran out ({} steps)",
        steps.load(Ordering::SeqCst)
    );
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_lease_taken_away_while_the_runtime_is_busy_never_lets_the_body_resume() {
    let store = MemoryBackend::new();
    let locker = Locker::with_backend(store.clone());
    let key = unique_key("taken-while-busy");
    let (steps, ran_after_theft) = (AtomicUsize::new(0), AtomicBool::new(false));
    let stolen = AtomicBool::new(false);
    let body = steal_checked(&locker, &key, &steps, &stolen, &ran_after_theft);
    let thief = async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        // Taken away, and the watchdog (on its own thread) told, while this runtime is busy.
        assert!(store.steal(&key));
        stolen.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(1500));
    };
    let (result, ()) = tokio::join!(body, thief);
    assert!(
        !ran_after_theft.load(Ordering::SeqCst),
        "the body went on after its lease was taken ({} steps)",
        steps.load(Ordering::SeqCst)
    );
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
}

#[distributed_lock(key = "<key>", ttl = "900ms", locker = locker)]
async fn steal_checked(
    locker: &Locker,
    key: &str,
    steps: &AtomicUsize,
    stolen: &AtomicBool,
    ran_after_theft: &AtomicBool,
) -> Result<(), LockError> {
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if stolen.load(Ordering::SeqCst) {
            ran_after_theft.store(true, Ordering::SeqCst);
        }
        steps.fetch_add(1, Ordering::SeqCst);
    }
    Ok(())
}

#[distributed_lock(key = "<key>", ttl = "600ms", on_lost = "continue", locker = locker)]
async fn outer_continue(
    locker: &Locker,
    key: &str,
    steps: &AtomicUsize,
) -> Result<Result<(), LockError>, LockError> {
    Ok(inner_cancel(locker, key, steps).await)
}

#[distributed_lock(key = "<key>", ttl = "600ms", locker = locker)]
async fn inner_cancel(locker: &Locker, key: &str, steps: &AtomicUsize) -> Result<(), LockError> {
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        steps.fetch_add(1, Ordering::SeqCst);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentered_call_keeps_its_own_on_lost_cancel() {
    let store = MemoryBackend::new();
    let locker = Locker::with_backend(store.clone());
    let key = unique_key("reentered-cancel");
    let steps = Arc::new(AtomicUsize::new(0));
    let call = {
        let (locker, key, steps) = (locker.clone(), key.clone(), steps.clone());
        tokio::spawn(async move { outer_continue(&locker, &key, &steps).await })
    };
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(store.steal(&key));
    let inner = call.await.unwrap().expect("the outer body goes on");
    assert!(
        matches!(inner, Err(LockError::Lost { .. })),
        "the re-entered body ran to the end ({} of 20 steps) on a lost lease: {inner:?}",
        steps.load(Ordering::SeqCst)
    );
}
