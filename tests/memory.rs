//! The lock's properties (tests/support/properties.rs) on the in-memory backend.

mod support;

use dlock::backend::MemoryBackend;

/// The in-process store; `take_away` hands the key to a stranger.
#[derive(Clone, Default)]
struct Memory(MemoryBackend);

impl support::Store for Memory {
    type Backend = MemoryBackend;

    async fn backend(&self) -> MemoryBackend {
        self.0.clone()
    }

    async fn take_away(&self, key: &str) {
        assert!(self.0.steal(key), "`{key}` was not held");
    }

    async fn expire(&self, key: &str) {
        assert!(self.0.expire(key), "`{key}` was not held");
    }
}

lock_properties!(Memory::default());
read_write_properties!(Memory::default());

/// Key rendering through the attribute itself: the generated code, field and tuple paths
/// included, on any Unicode values.
mod rendered_keys {
    use dlock::{current_lease, distributed_lock, LockError, Locker};
    use proptest::prelude::*;

    struct User {
        name: String,
    }

    #[distributed_lock(key = "acct:<id>/<user.name>:<pair.1>", locker = locker)]
    async fn key_of(
        locker: &Locker,
        id: &str,
        user: &User,
        pair: (u8, &str),
    ) -> Result<String, LockError> {
        Ok(current_lease().unwrap().key().to_owned())
    }

    fn render(values: [&str; 3]) -> String {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let user = User {
            name: values[1].to_owned(),
        };
        runtime
            .block_on(key_of(&Locker::memory(), values[0], &user, (0, values[2])))
            .unwrap()
    }

    proptest! {
        #[test]
        fn different_arguments_never_share_a_key(
            a in proptest::array::uniform3(any::<String>()),
            b in proptest::array::uniform3("[a/:%3A é]{0,3}"),
        ) {
            let a = [a[0].as_str(), a[1].as_str(), a[2].as_str()];
            let b = [b[0].as_str(), b[1].as_str(), b[2].as_str()];
            let key = render(a);
            prop_assert!(key.bytes().all(|byte| byte.is_ascii_graphic()), "{}", key);
            prop_assert_eq!(key == render(b), a == b);
        }

        /// The separators moved from one value into the next: ("x/y", "z") against ("x", "y/z").
        #[test]
        fn a_separator_inside_a_value_is_not_a_separator(
            x in "[a-z%]{0,3}",
            y in "[a-z%]{0,3}",
            z in "[a-z%]{0,3}",
        ) {
            prop_assert_ne!(
                render([&format!("{x}/{y}"), &z, "t"]),
                render([&x, &format!("{y}/{z}"), "t"])
            );
            prop_assert_ne!(
                render(["i", &format!("{x}:{y}"), &z]),
                render(["i", &x, &format!("{y}:{z}")])
            );
        }
    }
}

/// What stacked attributes and nested calls with arguments of their own do.
mod composition {
    use std::time::Duration;

    use dlock::backend::MemoryBackend;
    use dlock::{current_lease, distributed_lock, LockError, LockOptions, Locker};

    #[distributed_lock(key = "top:<id>", locker = locker)]
    #[distributed_lock(key = "bottom:<id>", locker = locker)]
    async fn stacked(locker: &Locker, id: u32) -> Result<String, LockError> {
        Ok(current_lease().unwrap().key().to_owned())
    }

    #[tokio::test]
    async fn stacked_attributes_take_the_lower_lock_first_and_report_the_upper() {
        let store = MemoryBackend::new();
        let locker = Locker::with_backend(store.clone());
        assert_eq!(stacked(&locker, 1).await.unwrap(), "top:1");
        assert!(!store.is_held("top:1") && !store.is_held("bottom:1"));

        // With the upper key busy, the lower one was asked for first: two acquisitions.
        let busy = locker.lock("top:2", LockOptions::new()).await.unwrap();
        let before = store.acquire_calls();
        assert!(
            matches!(stacked(&locker, 2).await, Err(LockError::Busy { key }) if key == "top:2")
        );
        assert_eq!(store.acquire_calls() - before, 2);
        assert!(!store.is_held("bottom:2"), "the lower lock was released");
        drop(busy);

        // With the lower key busy, the upper one is never asked for.
        let busy = locker.lock("bottom:3", LockOptions::new()).await.unwrap();
        let before = store.acquire_calls();
        assert!(
            matches!(stacked(&locker, 3).await, Err(LockError::Busy { key }) if key == "bottom:3")
        );
        assert_eq!(store.acquire_calls() - before, 1);
        drop(busy);
    }

    #[distributed_lock(key = "job:<id>", ttl = "2s", locker = locker)]
    async fn long_outer(locker: &Locker, id: u32) -> Result<bool, LockError> {
        short_inner(locker, id).await
    }

    #[distributed_lock(key = "job:<id>", ttl = "50ms", renew = false, locker = locker)]
    async fn short_inner(locker: &Locker, id: u32) -> Result<bool, LockError> {
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok(current_lease().unwrap().is_held())
    }

    #[tokio::test]
    async fn a_nested_call_runs_under_the_outer_ttl_and_renewal() {
        let locker = Locker::memory();
        assert!(
            long_outer(&locker, 1).await.unwrap(),
            "the nested call's own 50 ms ttl without renewal applied"
        );
    }
}

/// A waiter whose future is kept but no longer polled costs the others a claim window at most,
/// also when the holder ahead of it expires instead of releasing (nobody hands the key on then).
mod unpolled_waiters {
    use std::time::{Duration, Instant};

    use dlock::backend::{AcquireRequest, Backend, MemoryBackend};
    use dlock::Owner;

    /// Holds `key` for 200 ms without renewing, queues a waiter that is polled once and then
    /// parked, and returns that waiter's future (to keep it alive).
    async fn expired_holder_then_a_parked_waiter(
        store: &MemoryBackend,
        key: &'static str,
    ) -> impl std::future::Future {
        let holder = AcquireRequest::new(
            key,
            Owner::random(),
            Duration::from_millis(200),
            Duration::ZERO,
        );
        assert!(store.acquire(&holder).await.unwrap().is_some());
        let store = store.clone();
        let mut parked = Box::pin(async move {
            let request = AcquireRequest::new(
                key,
                Owner::random(),
                Duration::from_secs(30),
                Duration::from_secs(60),
            );
            store
                .acquire(&request)
                .await
                .map(|granted| granted.is_some())
        });
        // Polled until it is queued, then never again.
        assert!(tokio::time::timeout(Duration::from_millis(20), &mut parked)
            .await
            .is_err());
        parked
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiter_behind_them_gets_the_key_within_a_claim_window() {
        let store = MemoryBackend::new();
        let _parked = expired_holder_then_a_parked_waiter(&store, "unpolled-wait").await;
        let started = Instant::now();
        let request = AcquireRequest::new(
            "unpolled-wait",
            Owner::random(),
            Duration::from_secs(30),
            Duration::from_secs(10),
        );
        let granted = store.acquire(&request).await.unwrap();
        assert!(
            granted.is_some() && started.elapsed() < Duration::from_secs(3),
            "a live waiter got {granted:?} after {:?} behind an expired holder and a parked waiter",
            started.elapsed()
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_caller_that_does_not_wait_gets_the_key_after_a_claim_window() {
        let store = MemoryBackend::new();
        let _parked = expired_holder_then_a_parked_waiter(&store, "unpolled-try").await;
        let request = AcquireRequest::new(
            "unpolled-try",
            Owner::random(),
            Duration::from_secs(30),
            Duration::ZERO,
        );
        let deadline = Instant::now() + Duration::from_secs(3);
        while store.acquire(&request).await.unwrap().is_none() {
            assert!(
                Instant::now() < deadline,
                "the key stayed busy for 3 s behind an expired holder and a parked waiter"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Locks taken while tokio's clock is paused (`start_paused`, which skips ahead to the next timer
/// whenever the runtime is idle): a lease's validity and the in-process store's expiries are real
/// time, so the timers that watch them must not fire at once again and again.
mod paused_clock {
    use std::time::Duration;

    use dlock::{distributed_lock, LockError, LockOptions, Locker};
    use tokio::sync::oneshot;

    #[distributed_lock(key = "paused", ttl = "1s", locker = locker)]
    async fn waits_for_another_thread(
        locker: &Locker,
        ready: oneshot::Receiver<()>,
    ) -> Result<(), LockError> {
        ready.await.unwrap();
        Ok(())
    }

    /// The CPU time the calling thread has used.
    fn cpu_time_of_this_thread() -> Duration {
        // SAFETY: a zeroed rusage is a valid value, which getrusage overwrites.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `usage` is a valid, writable rusage.
        assert_eq!(
            unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) },
            0
        );
        let time = |t: libc::timeval| {
            Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
        };
        time(usage.ru_utime) + time(usage.ru_stime)
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_and_a_waiter_under_a_paused_clock_leave_their_thread_idle() {
        let locker = Locker::memory();
        let (ready, wait) = oneshot::channel();
        let other = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(1));
            ready.send(()).unwrap();
        });
        let before = cpu_time_of_this_thread();
        let body = tokio::spawn({
            let locker = locker.clone();
            async move { waits_for_another_thread(&locker, wait).await }
        });
        tokio::task::yield_now().await;
        // Waits for the key the body holds until the body is done.
        let waiter = locker
            .lock("paused", LockOptions::new().wait(Duration::from_secs(5)))
            .await
            .unwrap();
        let used = cpu_time_of_this_thread() - before;
        body.await.unwrap().unwrap();
        waiter.release().await.unwrap();
        other.join().unwrap();
        assert!(
            used < Duration::from_millis(100),
            "the runtime's thread used {used:?} of CPU while a body waited 1 s for another \
             thread and a caller waited for its key: a timer on the paused clock spun"
        );
    }
}

/// A store that can vouch for a lease for a limited time (as ZooKeeper can, for its session's
/// sake), over the in-process store: the `Locker` shortens a longer ttl to the limit, and a
/// lease without renewal is still the holder's for its whole ttl, and no longer.
mod store_ttl_limit {
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    use dlock::backend::{AcquireRequest, Acquired, Backend, MemoryBackend, Renewal};
    use dlock::{LockError, LockOptions, Locker, Owner};

    use crate::support::Counting;

    /// The longest ttl the wrapped store takes.
    const LIMIT: Duration = Duration::from_millis(600);

    struct Limited(Counting<MemoryBackend>);

    impl Backend for Limited {
        async fn acquire(
            &self,
            request: &AcquireRequest<'_>,
        ) -> Result<Option<Acquired>, LockError> {
            assert!(request.ttl <= LIMIT, "asked for {:?}", request.ttl);
            self.0.acquire(request).await
        }

        async fn release(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
            self.0.release(key, owner).await
        }

        async fn renew(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
            self.0.renew(leases).await
        }

        fn ttl_limit(&self) -> Option<Duration> {
            Some(LIMIT)
        }

        fn release_now(&self, key: &str, owner: Owner) -> bool {
            self.0.release_now(key, owner)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unrenewed_lease_beyond_the_limit_is_confirmed_for_its_ttl_and_no_longer() {
        let store = Counting::new(MemoryBackend::new());
        let renewed = store.renewed.clone();
        let locker = Locker::with_backend(Limited(store));
        let sent_at = Instant::now();
        let options = LockOptions::new().ttl(Duration::from_secs(2)).renew(false);
        let lease = locker.lock("beyond", options).await.unwrap();
        tokio::time::sleep_until((sent_at + Duration::from_millis(1500)).into()).await;
        assert!(lease.is_held(), "given up before its ttl");
        tokio::time::timeout(Duration::from_secs(1), lease.lost())
            .await
            .expect("trusted past its ttl");
        assert!(
            sent_at.elapsed() >= Duration::from_millis(1800),
            "given up after {:?}, before its ttl less the margin",
            sent_at.elapsed()
        );
        let confirmations = renewed.load(Ordering::SeqCst);
        assert!(confirmations >= 3, "{confirmations} confirmations");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            renewed.load(Ordering::SeqCst),
            confirmations,
            "confirmed after its ttl ran out"
        );
        lease.release().await.unwrap();

        // Within the limit, a lease without renewal is never renewed.
        let options = LockOptions::new()
            .ttl(Duration::from_millis(400))
            .renew(false);
        let lease = locker.lock("within", options).await.unwrap();
        lease.lost().await;
        assert_eq!(renewed.load(Ordering::SeqCst), confirmations);
    }
}

/// A lease once lost stays lost: a renewal sent before the lease's deadline whose answer comes
/// after it does not make the lease held again, though the store did renew it.
mod late_confirmation {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use dlock::backend::{AcquireRequest, Acquired, Backend, MemoryBackend, Renewal};
    use dlock::{LockError, LockOptions, Locker, Owner};

    /// The lease's ttl: renewed a second in, given up 2.7 s in when no renewal is confirmed.
    const TTL: Duration = Duration::from_secs(3);

    /// How long the first renewal's answer takes: it comes about 3.2 s in, past the lease's
    /// deadline (2.7 s) but before the deadline it would set (3.7 s).
    const LATE_BY: Duration = Duration::from_millis(2200);

    /// The in-process store, whose first renewal is answered late: renewed on the store at
    /// once, the answer held up for [`LATE_BY`].
    struct LateAnswer {
        inner: MemoryBackend,
        answered_one: AtomicBool,
    }

    impl Backend for LateAnswer {
        async fn acquire(
            &self,
            request: &AcquireRequest<'_>,
        ) -> Result<Option<Acquired>, LockError> {
            self.inner.acquire(request).await
        }

        async fn release(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
            self.inner.release(key, owner).await
        }

        async fn renew(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
            let held = self.inner.renew(leases).await;
            if !self.answered_one.swap(true, Ordering::SeqCst) {
                // Blocks the thread the renewal runs on, dlock's background runtime: nothing
                // else of the locker runs until the answer is in (its watchdog's own look at
                // the deadline included), as on a runtime kept busy by other work.
                std::thread::sleep(LATE_BY);
            }
            held
        }

        fn release_now(&self, key: &str, owner: Owner) -> bool {
            self.inner.release_now(key, owner)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_read_as_lost_is_not_held_again_after_a_late_confirmation() {
        let locker = Locker::with_backend(LateAnswer {
            inner: MemoryBackend::new(),
            answered_one: AtomicBool::new(false),
        });
        let taken_at = Instant::now();
        let lease = locker
            .lock("late", LockOptions::new().ttl(TTL))
            .await
            .unwrap();
        let mut lost_after = None;
        while taken_at.elapsed() < Duration::from_secs(5) {
            let held = lease.is_held();
            match (held, lost_after) {
                (false, None) => lost_after = Some(taken_at.elapsed()),
                (true, Some(lost_after)) => panic!(
                    "held again {:?} in, after it read as lost {lost_after:?} in",
                    taken_at.elapsed()
                ),
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            lost_after.is_some(),
            "held though its first renewal was answered after its deadline"
        );
        lease.release().await.unwrap();
    }
}

/// A call nested in a semaphore's body re-enters the permit its body holds only where that
/// permit is one of those the nested call counts: a call of `permits = 2` run inside a body
/// holding the fifth permit of a `permits = 5` call would be a third body of the two.
mod nested_permits {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::LazyLock;
    use std::time::Duration;

    use dlock::{distributed_lock, LockError, Locker};

    static LOCKS: LazyLock<Locker> = LazyLock::new(Locker::memory);
    static INSIDE: AtomicUsize = AtomicUsize::new(0);
    static MOST: AtomicUsize = AtomicUsize::new(0);

    #[distributed_lock(key = "nested-permits", permits = 2, wait = "5s", locker = &LOCKS)]
    async fn narrow() -> Result<(), LockError> {
        let now = INSIDE.fetch_add(1, SeqCst) + 1;
        MOST.fetch_max(now, SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        INSIDE.fetch_sub(1, SeqCst);
        Ok(())
    }

    #[distributed_lock(key = "nested-permits", permits = 5, wait = "5s", locker = &LOCKS)]
    async fn wide() -> Result<(), LockError> {
        narrow().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_nested_call_never_runs_beyond_its_own_permits() {
        let first = tokio::spawn(narrow());
        let second = tokio::spawn(narrow());
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Both of narrow's permits are taken: wide's body holds another, and its nested call
        // must not run under it.
        let nested = wide().await;
        first.await.unwrap().unwrap();
        second.await.unwrap().unwrap();
        assert!(
            matches!(&nested, Err(LockError::InvalidOptions { reason }) if reason.contains("permit")),
            "{nested:?}"
        );
        assert!(
            MOST.load(SeqCst) <= 2,
            "{} bodies of a two-permit semaphore ran at once (the nested call: {nested:?})",
            MOST.load(SeqCst)
        );
    }
}
