//! The safety rules of the runtime itself, on the in-process store: a body never runs on a lease
//! the client knows is invalid, siblings inside a body never run at once, and each lease is
//! judged against its own deadline. Each test reproduces a way two bodies once ran at once, or a
//! key was once held by nobody.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backend::{AcquireRequest, Acquired, Backend, MemoryBackend, Renewal};
use dlock::{current_lease, distributed_lock, LockError, LockOptions, Locker, Owner};

use support::{unique_key, Gauge};

/// The in-process store, with a reply that reaches its caller late: `acquire_delay` after the
/// store granted, `renew_delay` after it renewed. A late reply is what a stalled caller, a slow
/// network or a garbage-collection pause all look like to the lease.
#[derive(Clone, Default)]
struct Late {
    store: MemoryBackend,
    acquire_delay: Duration,
    /// Blocks the caller's thread instead of yielding: the caller's runtime is stalled.
    acquire_blocks: bool,
    renew_delay: Duration,
}

impl Backend for Late {
    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Option<Acquired>, LockError> {
        let granted = self.store.acquire(request).await;
        if self.acquire_blocks {
            std::thread::sleep(self.acquire_delay);
        } else {
            tokio::time::sleep(self.acquire_delay).await;
        }
        granted
    }

    async fn release(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
        self.store.release(key, owner).await
    }

    async fn renew(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
        let renewed = self.store.renew(leases).await;
        tokio::time::sleep(self.renew_delay).await;
        renewed
    }

    fn release_now(&self, key: &str, owner: Owner) -> bool {
        self.store.release_now(key, owner)
    }
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_lease_never_shortens_the_patience_given_to_long_ones() {
    // Every renewal is answered 500 ms after the store renewed: slower than a 300 ms lease can
    // wait, well within what a 3 s lease can.
    let late = Late {
        renew_delay: Duration::from_millis(500),
        ..Late::default()
    };
    let locker = Locker::with_backend(late);
    let long = locker
        .lock(
            unique_key("long"),
            LockOptions::new().ttl(Duration::from_secs(3)),
        )
        .await
        .unwrap();
    // A stream of 300 ms leases, each held across a renewal or two, so that renewal batches
    // mix them with the long lease.
    let started = Instant::now();
    let mut shorts = Vec::new();
    while started.elapsed() < Duration::from_secs(4) {
        let locker = locker.clone();
        shorts.push(tokio::spawn(async move {
            let short = locker
                .lock(
                    unique_key("short"),
                    LockOptions::new().ttl(Duration::from_millis(300)),
                )
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(250)).await;
            drop(short);
        }));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for short in shorts {
        short.await.unwrap();
    }
    assert!(
        long.is_held(),
        "the 3 s lease was lost though its renewals were confirmed in 500 ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_renewal_counts_from_the_grant_not_from_a_slow_reply() {
    // The grant reaches the caller 2 s after the store gave it: 0.7 s of the 3 s lease is left.
    let late = Late {
        acquire_delay: Duration::from_secs(2),
        ..Late::default()
    };
    let locker = Locker::with_backend(late);
    let lease = locker
        .lock(
            unique_key("slow-grant"),
            LockOptions::new().ttl(Duration::from_secs(3)),
        )
        .await
        .unwrap();
    assert!(lease.is_held());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        lease.is_held(),
        "the lease was lost: its first renewal was due 1 s after the grant arrived"
    );
}

#[tokio::test]
async fn waiting_for_duration_max_waits_without_overflowing() {
    let locker = Locker::memory();
    let key = unique_key("wait-max");
    let holder = locker.lock(&*key, LockOptions::new()).await.unwrap();
    let waiter = {
        let (locker, key) = (locker.clone(), key.clone());
        tokio::spawn(async move {
            locker
                .lock(key, LockOptions::new().wait(Duration::MAX))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    holder.release().await.unwrap();
    let lease = waiter.await.expect("the waiter panicked").unwrap();
    assert!(lease.is_held());
    let mut options = LockOptions::new();
    options.wait = Duration::MAX;
    options.ttl = Duration::from_secs(1);
    drop(lease);
    assert!(locker.lock(&*key, options).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_as_the_key_is_handed_over_leaves_it_free() {
    // The holder's release and the waiter's deadline fall at the same instant, over and over:
    // a hand-off that reaches a waiter which has just given up must not leave the key held.
    let store = MemoryBackend::new();
    let locker = Locker::with_backend(store.clone());
    let mut stuck = 0;
    for round in 0..2_000u32 {
        let key = format!("handoff-race-{round}");
        let holder = locker.lock(&*key, LockOptions::new()).await.unwrap();
        let waiter = {
            let (locker, key) = (locker.clone(), key.clone());
            tokio::spawn(async move {
                locker
                    .lock(key, LockOptions::new().wait(Duration::from_micros(200)))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_micros(u64::from(round % 7) * 40)).await;
        holder.release().await.unwrap();
        match waiter.await.unwrap() {
            Ok(lease) => lease.release().await.unwrap(),
            Err(LockError::Busy { .. }) => {}
            Err(other) => panic!("{other:?}"),
        }
        if store.is_held(&key) {
            stuck += 1;
        }
    }
    assert_eq!(
        stuck, 0,
        "keys held by nobody after a hand-off met a give-up"
    );
}

#[test]
fn a_forked_child_draws_owner_tokens_of_its_own() {
    // Draw once so that whatever per-process state the generator keeps exists before the fork.
    let _ = Owner::random();
    let mut fds = [0; 2];
    // SAFETY: plain POSIX calls; the child only draws a token, writes it and exits.
    unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        let pid = libc::fork();
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let token = Owner::random().as_u128().to_le_bytes();
            libc::write(fds[1], token.as_ptr().cast(), token.len());
            libc::_exit(0);
        }
        let parent = Owner::random().as_u128();
        let mut child = [0u8; 16];
        assert_eq!(libc::read(fds[0], child.as_mut_ptr().cast(), 16), 16);
        let mut status = 0;
        libc::waitpid(pid, &mut status, 0);
        assert_ne!(
            u128::from_le_bytes(child),
            parent,
            "parent and child drew the same owner token after fork"
        );
    }
}

#[tokio::test]
async fn a_key_longer_than_the_limit_is_refused_before_it_reaches_the_store() {
    let store = MemoryBackend::new();
    let locker = Locker::with_backend(store.clone());
    let at_limit = "k".repeat(Locker::MAX_KEY_BYTES);
    drop(locker.lock(&*at_limit, LockOptions::new()).await.unwrap());
    for len in [Locker::MAX_KEY_BYTES + 1, 100 << 20] {
        match locker.lock("k".repeat(len), LockOptions::new()).await {
            Err(LockError::InvalidKey { key, reason }) => {
                assert!(key.len() < 200, "the error repeats the whole key");
                assert!(reason.contains("1048576"), "{reason}");
            }
            other => panic!("a {len}-byte key: {other:?}"),
        }
    }
    assert_eq!(
        store.acquire_calls(),
        1,
        "an oversized key reached the store"
    );
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

#[distributed_lock(key = "acct:<id>", locker = locker)]
async fn outlived_turn(locker: &Locker, id: &str, gauge: &Gauge) -> Result<(), LockError> {
    let started = start_and_hand_out(locker, id, gauge).await?;
    let (a, b) = tokio::join!(started, stay(locker, id, gauge));
    a?;
    b?;
    // Turns are handed back whatever order the calls ended in.
    tokio::time::timeout(Duration::from_secs(2), stay(locker, id, gauge))
        .await
        .expect("a later sibling waited forever for a turn nobody holds")
}

#[tokio::test]
async fn a_call_that_outlives_the_call_it_was_started_in_keeps_its_turn() {
    let locker = Locker::memory();
    let id = unique_key("outlived-turn");
    let gauge = Gauge::default();
    outlived_turn(&locker, &id, &gauge).await.unwrap();
    assert_eq!(gauge.max(), 1, "two bodies were inside at once");
    assert_eq!(gauge.entered(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_head_waiter_leaves_the_next_one_watches_the_expiry() {
    let store = MemoryBackend::new();
    let locker = Locker::with_backend(store.clone());
    let key = unique_key("head-leaves");
    // A holder that neither renews nor releases: only its expiry frees the key.
    let holder = locker
        .lock(
            &*key,
            LockOptions::new()
                .ttl(Duration::from_millis(300))
                .renew(false),
        )
        .await
        .unwrap();
    let wait = |locker: Locker, key: String| async move {
        locker
            .lock(key, LockOptions::new().wait(Duration::from_secs(30)))
            .await
    };
    let first = tokio::spawn(wait(locker.clone(), key.clone()));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = tokio::spawn(wait(locker.clone(), key.clone()));
    tokio::time::sleep(Duration::from_millis(20)).await;
    first.abort();
    let lease = tokio::time::timeout(Duration::from_secs(2), second)
        .await
        .expect("the key expired 300 ms in, but the waiter left at the head slept on")
        .unwrap()
        .unwrap();
    assert!(lease.is_held());
    std::mem::forget(holder);
}
