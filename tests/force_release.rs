//! `Locker::force_release`, what `dlock release --force` does: the holder is evicted whoever it
//! is, its lease is reported lost at its next renewal, the key goes to the first waiter as on a
//! release, and the next grant's fence is above the evicted one. On the memory store and on the
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
        locker.force_release("report").await.unwrap(),
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
        locker.force_release("report").await.unwrap(),
        Some(next.fence())
    );
    let after = locker
        .lock("report", LockOptions::new().ttl(TTL))
        .await
        .unwrap();
    assert!(after.fence() > next.fence());
    after.release().await.unwrap();
    drop(next);

    assert_eq!(locker.force_release("report").await.unwrap(), None);
    assert_eq!(locker.force_release("never-held").await.unwrap(), None);
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
        operator.force_release("job").await.unwrap(),
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
    let owner = Owner::random().to_string();
    let _: () = raw
        .set_ex(backend.lock_key("old"), &owner, 30)
        .await
        .unwrap();
    let _: () = raw
        .set_ex(backend.fence_key("old"), 4242, 30)
        .await
        .unwrap();
    let locker = Locker::with_backend(backend.clone());
    assert_eq!(locker.force_release("old").await.unwrap(), Some(4242));
    let exists: bool = raw.exists(backend.lock_key("old")).await.unwrap();
    assert!(!exists, "the lock is deleted where nobody waits");
    let next = locker.lock("old", LockOptions::new()).await.unwrap();
    assert!(next.fence() > 4242);
    next.release().await.unwrap();
    // A free key: nothing is written.
    assert_eq!(locker.force_release("free").await.unwrap(), None);
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
    let error = locker.force_release("k").await.unwrap_err();
    assert!(matches!(error, LockError::Unsupported { .. }), "{error:?}");
    assert_eq!(
        error.to_string(),
        "this store cannot release a key whoever holds it"
    );
    assert!(lease.is_held());
    lease.release().await.unwrap();
    locker.shutdown().await.unwrap();
    assert!(matches!(
        locker.force_release("k").await,
        Err(LockError::ShutDown)
    ));
}
