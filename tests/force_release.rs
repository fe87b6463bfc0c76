//! `Locker::force_release`, what `dlock release --force` does: the holder named by its owner is
//! evicted, its lease is reported lost at its next renewal, the key goes to the first waiter as
//! on a release, and the next grant's fence is above the evicted one. Any other holder is left
//! alone: one that took the key after the named one left, and the waiter a first copy of the
//! call handed the key to, where the call is sent again. On the memory store and on the
//! Redis at 127.0.0.1:6379 (`DLOCK_REDIS_URL` to use another), under a key prefix of each
//! test's own; the scenarios are `support::force`'s, which the SQL stores' tests run too.

mod support;

use dlock::backend::{AcquireRequest, Acquired, Backend, MemoryBackend, RedisBackend, Renewal};
use dlock::{LockError, LockOptions, Locker, Owner};
use redis::AsyncCommands;

use support::force::{self, holder_of};

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

#[tokio::test(flavor = "multi_thread")]
async fn memory_keeps_a_holder_that_took_the_key_since() {
    force::keeps_a_holder_that_took_the_key_since(Locker::memory()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_keeps_a_holder_that_took_the_key_since() {
    force::keeps_a_holder_that_took_the_key_since(Locker::with_backend(
        redis_backend(&unique("changed")).await,
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_a_copy_sent_again_leaves_the_next_holder_alone() {
    force::a_copy_sent_again_leaves_the_next_holder_alone(Locker::memory()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_a_copy_sent_again_leaves_the_next_holder_alone() {
    force::a_copy_sent_again_leaves_the_next_holder_alone(Locker::with_backend(
        redis_backend(&unique("twice")).await,
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_evicts_the_holder_and_hands_the_key_on() {
    force::evicts_and_hands_on(Locker::memory()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_evicts_the_holder_and_hands_the_key_on() {
    force::evicts_and_hands_on(Locker::with_backend(
        redis_backend(&unique("hand-on")).await,
    ))
    .await;
}

/// A waiter in another process (another backend, so the hand-off goes by pub/sub) is handed
/// the key too.
#[tokio::test(flavor = "multi_thread")]
async fn redis_hands_the_key_to_a_waiter_of_another_process() {
    let prefix = unique("remote");
    force::hands_the_key_to_a_waiter_of_another_process(
        Locker::with_backend(redis_backend(&prefix).await),
        Locker::with_backend(redis_backend(&prefix).await),
    )
    .await;
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
