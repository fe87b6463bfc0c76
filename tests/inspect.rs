//! What operators see: `Locker::inspect` (who holds a key, since when, for how long yet, and how
//! many wait) and `Locker::list` (the held keys under a prefix), on the memory store and on the
//! Redis at 127.0.0.1:6379 (`DLOCK_REDIS_URL` to use another), under a key prefix of each test's
//! own. On Redis, the holder's description rides in the lock's value: every owner check reads
//! the owner part alone and exactly, and a lease an older dlock wrote (the owner alone) is still
//! renewed and released.

use std::time::{Duration, Instant, SystemTime};

use dlock::backend::{AcquireRequest, Acquired, Backend, MemoryBackend, RedisBackend, Renewal};
use dlock::{KeyState, LockError, LockOptions, Locker, Owner};
use redis::AsyncCommands;

fn redis_url() -> String {
    std::env::var("DLOCK_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A prefix no other test (nor an earlier run) uses.
fn unique(name: &str) -> String {
    format!("dlock-test:inspect:{name}:{}:", Owner::random())
}

async fn redis_backend(name: &str) -> RedisBackend {
    RedisBackend::builder(&redis_url())
        .unwrap()
        .key_prefix(unique(name))
        .connect()
        .await
        .unwrap()
}

async fn raw() -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// This host's name as the kernel says it.
fn this_host() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|host| host.trim().to_owned())
        .filter(|host| !host.is_empty())
}

/// Inspects `key` until `done` says yes, for up to 5 s.
async fn inspect_until(locker: &Locker, key: &str, done: impl Fn(&KeyState) -> bool) -> KeyState {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let state = locker.inspect(key).await.unwrap();
        if done(&state) || Instant::now() > deadline {
            return state;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// While a caller holds `key` under a label and another waits, `inspect` names the holder (its
/// label, this host, this process, its owner and fence, when the store granted it, how long it
/// has left) and counts one waiter; the waiter handed the key is described in turn, with the
/// fence its lease reports; once released, nobody holds it.
async fn a_holder_and_its_waiter_are_described<B: Backend + Clone>(store: B) {
    let locker = Locker::with_backend(store.clone());
    let key = "acct:42";
    let ttl = Duration::from_secs(10);
    let holder = Owner::random();
    let before = SystemTime::now();
    let Acquired { fence, .. } = store
        .acquire(&AcquireRequest::new(key, holder, ttl, Duration::ZERO).label("billing::charge"))
        .await
        .unwrap()
        .expect("the key was free");
    let waiter = tokio::spawn({
        let locker = locker.clone();
        async move {
            let options = LockOptions::new().wait(Duration::from_secs(10));
            locker.lock(key, options).await
        }
    });
    let state = inspect_until(&locker, key, |state| state.waiters() == 1).await;
    assert_eq!(state.key(), key);
    assert_eq!(state.waiters(), 1, "{state:?}");
    let [described] = state.holders() else {
        panic!("not one holder: {state:?}");
    };
    assert_eq!(described.label(), "billing::charge");
    assert_eq!(described.host(), this_host().as_deref());
    assert_eq!(described.pid(), Some(std::process::id()));
    assert_eq!(described.owner(), holder);
    assert_eq!(described.fence(), fence);
    let acquired_at = described.acquired_at();
    let now = SystemTime::now();
    assert!(
        acquired_at + Duration::from_secs(1) >= before
            && acquired_at <= now + Duration::from_secs(1),
        "granted at {acquired_at:?}, asked at {before:?}, now {now:?}"
    );
    let left = described.time_left().expect("the lease has a ttl");
    assert!(left <= ttl && left > Duration::ZERO, "{left:?} left");

    assert!(store.release(key, holder).await.unwrap());
    let lease = waiter.await.unwrap().unwrap();
    let state = locker.inspect(key).await.unwrap();
    let [described] = state.holders() else {
        panic!("not one holder: {state:?}");
    };
    assert_eq!(described.owner(), lease.owner());
    assert_eq!(described.fence(), lease.fence());
    assert_eq!(described.pid(), Some(std::process::id()));
    assert_eq!(described.label(), dlock::LockOptions::UNLABELLED);
    assert_eq!(state.waiters(), 0);

    lease.release().await.unwrap();
    let state = locker.inspect(key).await.unwrap();
    assert!(state.holders().is_empty(), "{state:?}");
    assert_eq!(state.waiters(), 0);
}

/// `list(prefix)` names exactly the held keys under `prefix`: none outside it, none released,
/// and a prefix's `*`, `?` or `[` matches itself only.
async fn list_names_the_held_keys_under_the_prefix<B: Backend + Clone>(store: B) {
    let locker = Locker::with_backend(store);
    let mut leases = Vec::new();
    for key in [
        "jobs/a", "jobs/b", "jobs/c/d", "jobs/x*1", "jobs/xy", "job", "other/a", "",
    ] {
        leases.push(locker.lock(key, LockOptions::new()).await.unwrap());
    }
    assert_eq!(
        locker.list("jobs/").await.unwrap(),
        ["jobs/a", "jobs/b", "jobs/c/d", "jobs/x*1", "jobs/xy"]
    );
    assert_eq!(locker.list("jobs/c").await.unwrap(), ["jobs/c/d"]);
    assert_eq!(locker.list("jobs/x*").await.unwrap(), ["jobs/x*1"]);
    assert_eq!(locker.list("jobs/[a]").await.unwrap(), Vec::<String>::new());
    assert_eq!(locker.list("nothing").await.unwrap(), Vec::<String>::new());
    let all = locker.list("").await.unwrap();
    assert_eq!(all.len(), 8, "{all:?}");
    leases.remove(1).release().await.unwrap();
    assert_eq!(
        locker.list("jobs/").await.unwrap(),
        ["jobs/a", "jobs/c/d", "jobs/x*1", "jobs/xy"]
    );
}

#[tokio::test]
async fn memory_describes_a_holder_and_counts_its_waiter() {
    a_holder_and_its_waiter_are_described(MemoryBackend::new()).await;
}

#[tokio::test]
async fn memory_lists_the_held_keys_under_a_prefix() {
    list_names_the_held_keys_under_the_prefix(MemoryBackend::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_describes_a_holder_and_counts_its_waiter() {
    a_holder_and_its_waiter_are_described(redis_backend("describe").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lists_the_held_keys_under_a_prefix() {
    list_names_the_held_keys_under_the_prefix(redis_backend("list").await).await;
}

/// A waiter whose process died (its waiter key expired) is not counted, though its entry is
/// still queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_counts_live_waiters_only() {
    let store = redis_backend("dead-waiter").await;
    let locker = Locker::with_backend(store.clone());
    let _lease = locker.lock("k", LockOptions::new()).await.unwrap();
    let mut raw = raw().await;
    let dead = Owner::random().to_string();
    let () = raw.rpush(store.queue_key("k"), &dead).await.unwrap();
    assert_eq!(locker.inspect("k").await.unwrap().waiters(), 0);
    let waiter = format!("{}:w:{dead}", store.lock_key("k"));
    let () = raw.set_ex(&waiter, "3000 abc 1", 10).await.unwrap();
    assert_eq!(locker.inspect("k").await.unwrap().waiters(), 1);
}

/// A lease granted by an older dlock, whose lock holds the owner alone, is renewed and released
/// by this one, and described by its fence (from the counter) with no label, host or pid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_renews_and_releases_a_lease_an_older_version_wrote() {
    let store = redis_backend("older").await;
    let mut raw = raw().await;
    let ttl = Duration::from_secs(10);
    for marked in ["", "-"] {
        let key = format!("older{marked}");
        let owner = Owner::random();
        let fence = 1_764_633_600_000_000u64;
        let () = raw
            .pset_ex(store.lock_key(&key), format!("{owner}{marked}"), 5_000)
            .await
            .unwrap();
        let () = raw
            .pset_ex(store.fence_key(&key), fence, 3_600_000)
            .await
            .unwrap();
        let state = Backend::inspect(&store, &key).await.unwrap();
        let [described] = state.holders() else {
            panic!("not one holder: {state:?}");
        };
        assert_eq!(described.owner(), owner);
        assert_eq!(described.fence(), fence);
        assert_eq!(
            (described.label(), described.host(), described.pid()),
            ("", None, None)
        );
        let renewed = store
            .renew(&[Renewal::new(&key, owner, ttl)])
            .await
            .unwrap();
        assert_eq!(
            renewed,
            [true],
            "{marked:?}: an older lease was not renewed"
        );
        let pttl: i64 = raw.pttl(store.lock_key(&key)).await.unwrap();
        assert!(pttl > 5_000, "{marked:?}: not extended ({pttl} ms)");
        // Its owner's acquire call (a retry after a lost reply) finds it its own.
        let again = store
            .acquire(&AcquireRequest::new(&key, owner, ttl, Duration::ZERO))
            .await
            .unwrap();
        assert_eq!(again.map(|acquired| acquired.fence), Some(fence));
        assert!(
            store.release(&key, owner).await.unwrap(),
            "{marked:?}: not released"
        );
        let left: Option<String> = raw.get(store.lock_key(&key)).await.unwrap();
        assert_eq!(left, None, "{marked:?}");
    }
}

/// An owner whose token is the start of the stored owner (or of the marked one) is another
/// owner: it can neither renew, release nor re-acquire the lock, whatever follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_owner_checks_compare_the_whole_owner() {
    let store = redis_backend("prefix-owner").await;
    let mut raw = raw().await;
    let ttl = Duration::from_secs(10);
    let owner = Owner::random();
    for stored in [
        format!("{owner}0"),
        format!("{owner}0-"),
        format!("{owner}--"),
        format!("{owner}0\n1/host/label/5/1764633600000000"),
        format!("{owner}0-\n1/host/label/5/1764633600000000"),
        format!("{owner}x\n"),
        format!("{owner} \n"),
    ] {
        let key = "k";
        let lock = store.lock_key(key);
        let () = raw.pset_ex(&lock, &stored, 10_000).await.unwrap();
        let renewed = store.renew(&[Renewal::new(key, owner, ttl)]).await.unwrap();
        assert_eq!(renewed, [false], "{stored:?} renewed by {owner}");
        let acquired = store
            .acquire(&AcquireRequest::new(key, owner, ttl, Duration::ZERO))
            .await
            .unwrap();
        assert_eq!(acquired, None, "{stored:?} acquired by {owner}");
        assert!(
            !store.release(key, owner).await.unwrap(),
            "{stored:?} released by {owner}"
        );
        let left: Option<String> = raw.get(&lock).await.unwrap();
        assert_eq!(left.as_ref(), Some(&stored), "{stored:?} changed");
        let pttl: i64 = raw.pttl(&lock).await.unwrap();
        assert!(pttl <= 10_000, "{stored:?} extended");
        let () = raw.del(&lock).await.unwrap();
    }
}

/// The lock's value starts with its owner's line, so `redis-cli GET` still shows who holds it,
/// and the description follows on a line of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stores_the_description_after_the_owner() {
    let store = redis_backend("value").await;
    let owner = Owner::random();
    let request = AcquireRequest::new("k", owner, Duration::from_secs(10), Duration::ZERO)
        .label("a label/with 100% of it");
    let acquired = store.acquire(&request).await.unwrap().unwrap();
    let stored: String = raw().await.get(store.lock_key("k")).await.unwrap();
    let (first_line, description) = stored.split_once('\n').unwrap();
    assert_eq!(first_line, format!("{owner}-"));
    assert!(
        description.starts_with(&format!("{}/", std::process::id())),
        "{description}"
    );
    assert!(
        description.contains("/a%20label%2Fwith%20100%25%20of%20it/"),
        "{description}"
    );
    let state = Backend::inspect(&store, "k").await.unwrap();
    assert_eq!(state.holders()[0].label(), "a label/with 100% of it");
    assert_eq!(state.holders()[0].fence(), acquired.fence);
    // Its owner renews it, re-acquires it (a retry after a lost reply) and releases it.
    let renewed = store
        .renew(&[Renewal::new("k", owner, Duration::from_secs(10))])
        .await
        .unwrap();
    assert_eq!(renewed, [true], "a described lease was not renewed");
    let again = store.acquire(&request).await.unwrap();
    assert_eq!(again.map(|again| again.fence), Some(acquired.fence));
    assert!(
        store.release("k", owner).await.unwrap(),
        "a described lease was not released"
    );
    let left: Option<String> = raw().await.get(store.lock_key("k")).await.unwrap();
    assert_eq!(left, None);
}

/// A store that does not say who holds its keys answers so, in words, rather than failing to
/// compile or pretending a key is free.
#[tokio::test]
async fn a_store_that_cannot_tell_says_so() {
    struct Plain(MemoryBackend);
    impl Backend for Plain {
        async fn acquire(
            &self,
            request: &AcquireRequest<'_>,
        ) -> Result<Option<Acquired>, LockError> {
            self.0.acquire(request).await
        }
        async fn release(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
            self.0.release(key, owner).await
        }
        async fn renew(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
            self.0.renew(leases).await
        }
    }
    let locker = Locker::with_backend(Plain(MemoryBackend::new()));
    let inspected = locker.inspect("k").await.unwrap_err();
    assert!(matches!(inspected, LockError::Unsupported { .. }));
    assert_eq!(inspected.to_string(), "this store cannot list its holders");
    let listed = locker.list("").await.unwrap_err();
    assert_eq!(listed.to_string(), "this store cannot list its held keys");
}

/// Across versions in one queue: a waiter queueing behind a described lock unmarks it and
/// keeps its description; a release hands the key to an older dlock's waiter (whose waiter key
/// carries no description) as the owner alone, which that version expects, and to this
/// version's waiter with the waiter's own description.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_hands_an_older_waiter_the_owner_alone() {
    let store = redis_backend("older-waiter").await;
    let locker = Locker::with_backend(store.clone());
    let mut raw = raw().await;
    let (key, ttl) = ("k", Duration::from_secs(10));
    let lock = store.lock_key(key);
    let holder = Owner::random();
    store
        .acquire(&AcquireRequest::new(key, holder, ttl, Duration::ZERO).label("first"))
        .await
        .unwrap()
        .expect("the key was free");
    let granted: String = raw.get(&lock).await.unwrap();
    let (_, description) = granted.split_once('\n').unwrap();
    // An older dlock's waiter, first in the queue: `<claim window> <backend id> <call>`.
    let older = Owner::random();
    let () = raw
        .rpush(store.queue_key(key), older.to_string())
        .await
        .unwrap();
    let () = raw
        .pset_ex(
            format!("{lock}:w:{older}"),
            "3000 0123456789abcdef 1",
            10_000,
        )
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let locker = locker.clone();
        async move {
            let options = LockOptions::new().wait(Duration::from_secs(10));
            locker.lock(key, options).await
        }
    });
    inspect_until(&locker, key, |state| state.waiters() == 2).await;
    let unmarked: String = raw.get(&lock).await.unwrap();
    assert_eq!(
        unmarked,
        format!("{holder}\n{description}"),
        "not unmarked as it was"
    );

    assert!(store.release(key, holder).await.unwrap());
    let handed: String = raw.get(&lock).await.unwrap();
    assert_eq!(
        handed,
        older.to_string(),
        "an older waiter was handed more than its owner"
    );
    let state = locker.inspect(key).await.unwrap();
    assert_eq!(state.holders()[0].owner(), older);
    assert_eq!(state.holders()[0].pid(), None);

    assert!(store.release(key, older).await.unwrap());
    let lease = waiter.await.unwrap().unwrap();
    let state = locker.inspect(key).await.unwrap();
    assert_eq!(state.holders()[0].owner(), lease.owner());
    assert_eq!(state.holders()[0].fence(), lease.fence());
    assert_eq!(state.holders()[0].pid(), Some(std::process::id()));
    lease.release().await.unwrap();
}
