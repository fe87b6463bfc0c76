//! What operators see on etcd: the holder (label, owner, fence) and the number of waiters, the
//! held keys under a prefix, and a forced release that evicts the holder it names, and only it.

use std::time::{Duration, Instant};

use dlock::{KeyState, LockOptions, Locker};

use crate::support::unique_key;
use crate::support::Store;
use crate::Etcd;

async fn inspect_until(locker: &Locker, key: &str, done: impl Fn(&KeyState) -> bool) -> KeyState {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let state = locker.inspect(key).await.unwrap();
        if done(&state) {
            return state;
        }
        assert!(Instant::now() < deadline, "{state:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_list_and_force_release_see_the_holder_and_its_waiters() {
    let etcd = Etcd::shared().await;
    let (holder, operator) = (
        Locker::with_backend(etcd.backend().await),
        Locker::with_backend(etcd.backend().await),
    );
    let key = unique_key("operated");
    // A key whose name is a prefix of the first's (and holds a `/`): listed apart.
    let nested = format!("{key}/child");
    let options = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .label("nightly");
    let held = holder.lock(&*key, options).await.unwrap();
    let other = holder.lock(&*nested, options).await.unwrap();
    let waiting = tokio::spawn({
        let (holder, key) = (holder.clone(), key.clone());
        async move {
            holder
                .lock(&*key, options.wait(Duration::from_secs(60)))
                .await
        }
    });
    let state = inspect_until(&operator, &key, |state| state.waiters() == 1).await;
    let first = &state.holders()[0];
    assert_eq!(
        (first.owner(), first.fence(), first.label()),
        (held.owner(), held.fence(), "nightly")
    );
    let mut listed = operator.list(&key).await.unwrap();
    listed.sort();
    assert_eq!(listed, [key.clone(), nested.clone()]);
    assert_eq!(
        operator.list(&nested).await.unwrap(),
        std::slice::from_ref(&nested)
    );

    // Evicting someone who does not hold the key changes nothing.
    assert_eq!(
        operator.force_release(&key, other.owner()).await.unwrap(),
        None
    );
    assert_eq!(
        operator.force_release(&key, held.owner()).await.unwrap(),
        Some(held.fence())
    );
    tokio::time::timeout(Duration::from_secs(20), held.lost())
        .await
        .expect("the evicted holder was not told");
    let next = waiting.await.unwrap().unwrap();
    assert!(next.fence() > held.fence());
    next.release().await.unwrap();
    other.release().await.unwrap();
    inspect_until(&operator, &key, |state| !state.is_held()).await;
}
