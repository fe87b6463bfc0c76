//! The SQL stores' scenarios of an operator's view: `inspect` describes the holder and counts
//! the waiters, `list` names the held keys under a prefix literally and reads every page, a table
//! an earlier version created is given the describing columns (or left as it is) and keeps
//! working, and an eviction keeps the fence for the next grant.

use std::time::{Duration, Instant, SystemTime};

use dlock::backend::{AcquireRequest, Backend};
use dlock::{KeyState, LockOptions, Locker, Owner};

use super::SqlStore;
use crate::support::unique_key;

/// This host's name as the stores record it (`/proc/sys/kernel/hostname` on Linux).
fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|name| name.trim().to_owned())
        .unwrap()
}

/// Asks `locker` about `key` until `done` says its state is the one awaited (a waiter's first
/// try takes a round trip), for at most ten seconds.
async fn inspect_until(locker: &Locker, key: &str, done: impl Fn(&KeyState) -> bool) -> KeyState {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = locker.inspect(key).await.unwrap();
        if done(&state) || Instant::now() > deadline {
            return state;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// While a lease granted under a label is held and another acquisition of the same backend
/// waits for it, `inspect` describes the holder — its label, this host, this process, its owner
/// and fence, acquired now by the database's clock, less than its ttl left — and counts the
/// waiter; once the waiter holds the key, it is the holder, and nobody waits.
pub async fn inspect_describes_the_holder_and_counts_its_waiters<S: SqlStore>() {
    let db = S::fresh().await;
    let backend = db.backend().await;
    let locker = Locker::with_backend(backend.clone());
    let key = unique_key("inspected");
    let free = locker.inspect(&key).await.unwrap();
    assert!(!free.is_held() && free.waiters() == 0, "{free:?}");

    let (owner, ttl) = (Owner::random(), Duration::from_secs(30));
    let request = AcquireRequest::new(&key, owner, ttl, Duration::ZERO).label("nightly-report");
    let asked_at = SystemTime::now();
    let acquired = backend
        .acquire(&request)
        .await
        .unwrap()
        .expect("the key was free");
    let waiter = tokio::spawn({
        let (locker, key) = (locker.clone(), key.clone());
        async move {
            locker
                .lock(&*key, LockOptions::new().wait(Duration::from_secs(20)))
                .await
        }
    });

    let state = inspect_until(&locker, &key, |state| state.waiters() == 1).await;
    assert_eq!(state.key(), key);
    assert_eq!(state.waiters(), 1, "{state:?}");
    let [holder] = state.holders() else {
        panic!("one holder expected: {state:?}")
    };
    assert_eq!(holder.label(), "nightly-report");
    assert_eq!(holder.host(), Some(this_host().as_str()));
    assert_eq!(holder.pid(), Some(std::process::id()));
    assert_eq!(holder.owner(), owner);
    assert_eq!(holder.fence(), acquired.fence);
    let skew = |a: SystemTime, b: SystemTime| a.duration_since(b).unwrap_or_else(|e| e.duration());
    assert!(
        skew(holder.acquired_at(), asked_at) < Duration::from_secs(5),
        "acquired at {:?}, asked at {asked_at:?}",
        holder.acquired_at()
    );
    let left = holder.time_left().expect("a SQL lease has an expiry");
    assert!(left <= ttl && left > Duration::ZERO, "{left:?} left");

    assert!(backend.release(&key, owner).await.unwrap());
    let lease = waiter.await.unwrap().unwrap();
    let state = locker.inspect(&key).await.unwrap();
    assert_eq!(state.waiters(), 0, "{state:?}");
    let [holder] = state.holders() else {
        panic!("one holder expected: {state:?}")
    };
    assert_eq!(
        (holder.owner(), holder.fence()),
        (lease.owner(), lease.fence())
    );
    assert_eq!(
        holder.label(),
        dlock::LockOptions::UNLABELLED,
        "the waiter asked under no label"
    );
    lease.release().await.unwrap();
    assert!(!locker.inspect(&key).await.unwrap().is_held());
}

/// `list` names exactly the held keys under a prefix, in order: not a released one, not an
/// expired one, not one under another prefix; and a prefix's `%` and `_` match only
/// themselves, not any run of characters, or any one.
pub async fn list_names_the_held_keys_under_a_prefix_literally<S: SqlStore>() {
    let db = S::fresh().await;
    let locker = db.locker().await;
    let base = unique_key("listed");
    let key = |tail: &str| format!("{base}{tail}");
    let mut leases = Vec::new();
    for tail in [":b", ":a", "%x", "_y", "-other", ":released"] {
        leases.push(locker.lock(key(tail), LockOptions::new()).await.unwrap());
    }
    leases.pop().unwrap().release().await.unwrap();
    db.insert_expired_row(&key(":expired")).await;

    assert_eq!(
        locker.list(&key(":")).await.unwrap(),
        [key(":a"), key(":b")]
    );
    assert_eq!(locker.list(&key("%")).await.unwrap(), [key("%x")]);
    assert_eq!(locker.list(&key("_")).await.unwrap(), [key("_y")]);
    assert!(locker.list(&key(":c")).await.unwrap().is_empty());
    let mut all = vec![key("%x"), key("-other"), key(":a"), key(":b"), key("_y")];
    all.sort();
    assert_eq!(
        locker.list("").await.unwrap(),
        all,
        "the table holds the test's keys only"
    );
    drop(leases);
}

/// A table created by an earlier version (no label, host or pid) is given those columns when a
/// backend connects (two at once here, as the processes of a deployment do), and keeps
/// working: a row an earlier version wrote is described without them, and taken over, and a
/// new grant is described in full.
pub async fn a_table_of_an_earlier_version_is_upgraded_and_keeps_working<S: SqlStore>() {
    let db = S::fresh().await;
    db.create_old_table().await;
    let (old, new) = (unique_key("old-row"), unique_key("new-row"));
    let stranger = Owner::random();
    db.insert_held_row(&old, &stranger.to_string(), 1).await;

    let (first, second) = tokio::join!(db.backend(), db.backend());
    let locker = Locker::with_backend(first);
    let state = locker.inspect(&old).await.unwrap();
    let [holder] = state.holders() else {
        panic!("one holder expected: {state:?}")
    };
    assert_eq!(holder.owner(), stranger);
    assert_eq!(
        (holder.label(), holder.host(), holder.pid()),
        ("", None, None)
    );
    assert_eq!(locker.list("").await.unwrap(), std::slice::from_ref(&old));

    let owner = Owner::random();
    let request =
        AcquireRequest::new(&new, owner, Duration::from_secs(30), Duration::ZERO).label("upgraded");
    second
        .acquire(&request)
        .await
        .unwrap()
        .expect("the key was free");
    let state = locker.inspect(&new).await.unwrap();
    assert_eq!(state.holders()[0].label(), "upgraded");
    assert_eq!(state.holders()[0].pid(), Some(std::process::id()));

    // The earlier version's row, once expired, is taken over as any other.
    let expired = unique_key("expired-old-row");
    db.insert_expired_row(&expired).await;
    let lease = locker.lock(&*expired, LockOptions::new()).await.unwrap();
    assert_eq!(
        locker.inspect(&expired).await.unwrap().holders()[0].owner(),
        lease.owner()
    );
}

/// A table of an earlier version that a backend may not alter (`create_table(false)`: a DBA
/// owns the schema) keeps working as it is: leases are granted and released, and described
/// without label, host or process.
pub async fn a_table_of_an_earlier_version_left_as_it_is_keeps_working<S: SqlStore>() {
    let db = S::fresh().await;
    db.create_old_table().await;
    let locker = Locker::with_backend(db.backend_leaving_the_table().await);
    let key = unique_key("left-as-it-is");
    let lease = locker.lock(&*key, LockOptions::new()).await.unwrap();
    let state = locker.inspect(&key).await.unwrap();
    let [holder] = state.holders() else {
        panic!("one holder expected: {state:?}")
    };
    assert_eq!(
        (holder.owner(), holder.fence()),
        (lease.owner(), lease.fence())
    );
    assert_eq!(
        (holder.label(), holder.host(), holder.pid()),
        ("", None, None)
    );
    assert_eq!(locker.list("").await.unwrap(), std::slice::from_ref(&key));
    lease.release().await.unwrap();
    assert!(!locker.inspect(&key).await.unwrap().is_held());
}

/// `list` reads the table a page at a time and goes on past a full page: more held keys than a
/// page holds are all listed, each once, and the keys just past the prefix's range are not.
pub async fn list_reads_every_page<S: SqlStore>() {
    let db = S::fresh().await;
    let locker = db.locker().await;
    let base = unique_key("paged");
    let keys: Vec<String> = (0..2_345).map(|i| format!("{base}:{i:05}")).collect();
    // Around the range: the prefix's successor (`;` follows `:`), and a key just before it.
    let outside = vec![format!("{base};"), format!("{base}9")];
    db.insert_live_rows(&keys).await;
    db.insert_live_rows(&outside).await;
    let listed = locker.list(&format!("{base}:")).await.unwrap();
    assert_eq!(listed.len(), keys.len());
    assert_eq!(listed, keys);
}

/// An upgrade that cannot have the table to itself (a transaction of another client's reads
/// it) gives up soon rather than hold every statement on the table behind it: the backend
/// connects and works, its holders described without label, host or process; once the table is
/// free, the next backend to connect upgrades it.
pub async fn an_upgrade_that_cannot_lock_the_table_gives_up_and_leaves_it_working<S: SqlStore>() {
    let db = S::fresh().await;
    db.create_old_table().await;
    let (old, key, later) = (unique_key("old"), unique_key("during"), unique_key("after"));
    db.insert_held_row(&old, &Owner::random().to_string(), 1)
        .await;
    let reader = db.lock_row(&old).await;

    let backend = tokio::time::timeout(Duration::from_secs(30), db.backend())
        .await
        .expect("the upgrade waited for the reader's transaction");
    let locker = Locker::with_backend(backend);
    let lease = locker.lock(&*key, LockOptions::new()).await.unwrap();
    let state = locker.inspect(&key).await.unwrap();
    assert_eq!(state.holders()[0].owner(), lease.owner());
    assert_eq!(
        state.holders()[0].pid(),
        None,
        "described without the columns"
    );
    lease.release().await.unwrap();

    drop(reader);
    let upgraded = db.backend().await;
    let request = AcquireRequest::new(
        &later,
        Owner::random(),
        Duration::from_secs(30),
        Duration::ZERO,
    )
    .label("after the upgrade");
    upgraded
        .acquire(&request)
        .await
        .unwrap()
        .expect("the key was free");
    let state = Locker::with_backend(upgraded)
        .inspect(&later)
        .await
        .unwrap();
    assert_eq!(state.holders()[0].label(), "after the upgrade");
    assert_eq!(state.holders()[0].pid(), Some(std::process::id()));
}

/// An operator evicts a holder whose fence is far ahead of the database's clock (a clock that
/// stepped back, or fences an earlier table carried over): the next grant's fence is still
/// greater, as a fenced resource that saw the evicted holder's needs. (A deleted row would
/// start again from the clock, below the evicted fence.)
pub async fn an_eviction_keeps_the_fence_for_the_next_grant<S: SqlStore>() {
    let db = S::fresh().await;
    let locker = db.locker().await;
    let key = unique_key("evicted-ahead");
    assert!(
        !locker.inspect(&key).await.unwrap().is_held(),
        "creates the table"
    );
    let (stuck, ahead) = (Owner::random(), u64::MAX / 4);
    db.insert_held_row(&key, &stuck.to_string(), ahead).await;
    assert_eq!(
        locker.force_release(&key, stuck).await.unwrap(),
        Some(ahead)
    );
    assert!(!locker.inspect(&key).await.unwrap().is_held());
    let next = locker.lock(&*key, LockOptions::new()).await.unwrap();
    assert!(next.fence() > ahead, "{} after {ahead}", next.fence());
    next.release().await.unwrap();
    locker.shutdown().await.unwrap();
}
