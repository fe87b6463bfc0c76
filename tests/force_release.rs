//! `Locker::force_release`, what `dlock release --force` does: the holder named by its owner is
//! evicted, its lease is reported lost at its next renewal, the key goes to the first waiter as
//! on a release, and the next grant's fence is above the evicted one. Any other holder is left
//! alone: one that took the key after the named one left, and the waiter a first copy of the
//! call handed the key to, where the call is sent again. On the memory store and on the
//! Redis at 127.0.0.1:6379 (`DLOCK_REDIS_URL` to use another), under a key prefix of each
//! test's own.

use std::time::Duration;

use dlock::backend::{AcquireRequest, Acquired, Backend, MemoryBackend, RedisBackend, Renewal};
use dlock::{LockError, LockOptions, Locker, Owner};
use redis::AsyncCommands;

const TTL: Duration = Duration::from_secs(3);

/// How long a test waits for what must happen (a renewal comes every ttl/3): patience, not a
/// speed requirement.
const PATIENCE: Duration = Duration::from_secs(10);

fn redis_url() -> String {
    std::env::var("DLOCK_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

fn unique(name: &str) -> String {
    format!("dlock-test:force:{name}:{}:", Owner::random())
}

async fn redis_backend(prefix: &str) -> RedisBackend {
    RedisBackend::builder(&redis_url())
        .unwrap()
        .key_prefix(prefix)
        .connect()
        .await
        .unwrap()
}

/// The owner of `key`'s holder, as an operator reads it before evicting it.
async fn holder_of(locker: &Locker, key: &str) -> Owner {
    locker.inspect(key).await.unwrap().holders()[0].owner()
}

/// Asserts that `lease` holds `key`: the store names its owner, and a rival finds it busy.
async fn still_holds(locker: &Locker, key: &str, lease: &dlock::Lease) {
    let state = locker.inspect(key).await.unwrap();
    assert_eq!(state.holders().len(), 1, "{state:?}");
    assert_eq!(state.holders()[0].owner(), lease.owner(), "{state:?}");
    assert!(lease.is_held());
    let rival = locker.lock(key, LockOptions::new().ttl(TTL)).await;
    assert!(
        matches!(rival, Err(LockError::Busy { .. })),
        "a rival got the key: {rival:?}"
    );
}

/// The holder an operator read (A) released the key and B took it before the eviction: the
/// eviction of A changes nothing, and B keeps the key.
async fn keeps_a_holder_that_took_the_key_since(locker: Locker) {
    let a = locker
        .lock("shown", LockOptions::new().ttl(TTL))
        .await
        .unwrap();
    let shown = holder_of(&locker, "shown").await;
    assert_eq!(shown, a.owner());
    a.release().await.unwrap();
    let b = locker
        .lock("shown", LockOptions::new().ttl(TTL))
        .await
        .unwrap();
    assert_eq!(locker.force_release("shown", shown).await.unwrap(), None);
    still_holds(&locker, "shown", &b).await;
    b.release().await.unwrap();
    locker.shutdown().await.unwrap();
}

/// The eviction sent twice (a client sends a call again after a timeout or a dropped
/// connection): the first copy hands the key to the waiter W1, the second finds it no longer
/// A's and leaves W1 holding it.
async fn a_copy_sent_again_leaves_the_next_holder_alone(locker: Locker) {
    let a = locker
        .lock("twice", LockOptions::new().ttl(TTL))
        .await
        .unwrap();
    let w1 = tokio::spawn({
        let locker = locker.clone();
        async move {
            let options = LockOptions::new().ttl(TTL).wait(Duration::from_secs(30));
            locker.lock("twice", options).await
        }
    });
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while locker.inspect("twice").await.unwrap().waiters() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let evicted = a.owner();
    assert_eq!(
        locker.force_release("twice", evicted).await.unwrap(),
        Some(a.fence())
    );
    assert_eq!(locker.force_release("twice", evicted).await.unwrap(), None);
    let w1 = tokio::time::timeout(PATIENCE, w1)
        .await
        .expect("the waiter is handed the key")
        .unwrap()
        .unwrap();
    still_holds(&locker, "twice", &w1).await;
    drop(a);
    w1.release().await.unwrap();
    locker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_keeps_a_holder_that_took_the_key_since() {
    keeps_a_holder_that_took_the_key_since(Locker::memory()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_keeps_a_holder_that_took_the_key_since() {
    keeps_a_holder_that_took_the_key_since(Locker::with_backend(
        redis_backend(&unique("changed")).await,
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_a_copy_sent_again_leaves_the_next_holder_alone() {
    a_copy_sent_again_leaves_the_next_holder_alone(Locker::memory()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_a_copy_sent_again_leaves_the_next_holder_alone() {
    a_copy_sent_again_leaves_the_next_holder_alone(Locker::with_backend(
        redis_backend(&unique("twice")).await,
    ))
    .await;
}

/// Evicts a holder while another task waits: the holder's lease is lost, the waiter gets the
/// key with a greater fence, and the evicted holder's release leaves the new holder alone.
async fn evicts_and_hands_on(locker: Locker) {
    let stuck = locker
        .lock("report", LockOptions::new().ttl(TTL))
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let locker = locker.clone();
        async move {
            let options = LockOptions::new().ttl(TTL).wait(Duration::from_secs(30));
            locker.lock("report", options).await
        }
    });
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while locker.inspect("report").await.unwrap().waiters() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    assert_eq!(
        locker
            .force_release("report", holder_of(&locker, "report").await)
            .await
            .unwrap(),
        Some(stuck.fence())
    );
    tokio::time::timeout(PATIENCE, stuck.lost())
        .await
        .expect("the evicted lease is reported lost");
    let next = tokio::time::timeout(PATIENCE, waiter)
        .await
        .expect("the waiter is handed the key")
        .unwrap()
        .unwrap();
    assert!(
        next.fence() > stuck.fence(),
        "{} after {}",
        next.fence(),
        stuck.fence()
    );
    stuck.release().await.unwrap();
    let state = locker.inspect("report").await.unwrap();
    assert_eq!(state.holders().len(), 1);
    assert_eq!(state.holders()[0].fence(), next.fence());
    assert!(next.is_held());

    // Nobody waits now: the key is freed, and the next grant's fence is greater still.
    assert_eq!(
        locker.force_release("report", next.owner()).await.unwrap(),
        Some(next.fence())
    );
    let after = locker
        .lock("report", LockOptions::new().ttl(TTL))
        .await
        .unwrap();
    assert!(after.fence() > next.fence());
    after.release().await.unwrap();
    let gone = next.owner();
    drop(next);

    assert_eq!(locker.force_release("report", gone).await.unwrap(), None);
    assert_eq!(
        locker
            .force_release("never-held", Owner::random())
            .await
            .unwrap(),
        None
    );
    locker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_evicts_the_holder_and_hands_the_key_on() {
    evicts_and_hands_on(Locker::memory()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_evicts_the_holder_and_hands_the_key_on() {
    evicts_and_hands_on(Locker::with_backend(
        redis_backend(&unique("hand-on")).await,
    ))
    .await;
}

/// A waiter in another process (another backend, so the hand-off goes by pub/sub) is handed
/// the key too.
#[tokio::test(flavor = "multi_thread")]
async fn redis_hands_the_key_to_a_waiter_of_another_process() {
    let prefix = unique("remote");
    let holder = Locker::with_backend(redis_backend(&prefix).await);
    let operator = Locker::with_backend(redis_backend(&prefix).await);
    let stuck = holder
        .lock("job", LockOptions::new().ttl(TTL))
        .await
        .unwrap();
    let waiting = holder.clone();
    let waiter = tokio::spawn(async move {
        let options = LockOptions::new().ttl(TTL).wait(Duration::from_secs(30));
        waiting.lock("job", options).await
    });
    while operator.inspect("job").await.unwrap().waiters() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        operator.force_release("job", stuck.owner()).await.unwrap(),
        Some(stuck.fence())
    );
    let next = tokio::time::timeout(PATIENCE, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(next.fence() > stuck.fence());
    next.release().await.unwrap();
    holder.shutdown().await.unwrap();
    operator.shutdown().await.unwrap();
}

/// A lock an older dlock wrote holds its owner alone: the evicted fence is then the counter's.
#[tokio::test(flavor = "multi_thread")]
async fn redis_evicts_an_older_dlocks_holder_by_its_counter() {
    let prefix = unique("older");
    let backend = redis_backend(&prefix).await;
    let mut raw = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let owner = Owner::random();
    let _: () = raw
        .set_ex(backend.lock_key("old"), owner.to_string(), 30)
        .await
        .unwrap();
    let _: () = raw
        .set_ex(backend.fence_key("old"), 4242, 30)
        .await
        .unwrap();
    let locker = Locker::with_backend(backend.clone());
    assert_eq!(holder_of(&locker, "old").await, owner);
    assert_eq!(
        locker.force_release("old", owner).await.unwrap(),
        Some(4242)
    );
    let exists: bool = raw.exists(backend.lock_key("old")).await.unwrap();
    assert!(!exists, "the lock is deleted where nobody waits");
    let next = locker.lock("old", LockOptions::new()).await.unwrap();
    assert!(next.fence() > 4242);
    next.release().await.unwrap();
    // A free key: nothing is written.
    assert_eq!(
        locker.force_release("free", Owner::random()).await.unwrap(),
        None
    );
    let exists: bool = raw.exists(backend.lock_key("free")).await.unwrap();
    assert!(!exists);
    locker.shutdown().await.unwrap();
}

/// A store of one's own that implements only the required methods.
struct Minimal(MemoryBackend);

impl Backend for Minimal {
    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Option<Acquired>, LockError> {
        self.0.acquire(request).await
    }

    async fn release(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
        self.0.release(key, owner).await
    }

    async fn renew(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
        self.0.renew(leases).await
    }
}

#[tokio::test]
async fn a_store_that_cannot_says_so() {
    let locker = Locker::with_backend(Minimal(MemoryBackend::new()));
    let lease = locker.lock("k", LockOptions::new()).await.unwrap();
    let error = locker.force_release("k", lease.owner()).await.unwrap_err();
    assert!(matches!(error, LockError::Unsupported { .. }), "{error:?}");
    assert_eq!(
        error.to_string(),
        "this store cannot release a key whoever holds it"
    );
    assert!(lease.is_held());
    lease.release().await.unwrap();
    locker.shutdown().await.unwrap();
    assert!(matches!(
        locker.force_release("k", Owner::random()).await,
        Err(LockError::ShutDown)
    ));
}
