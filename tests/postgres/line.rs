//! The line across processes: a process whose statements reach the database later than
//! another's (farther away, or busier) still gets its turns at a key the nearer one keeps asking
//! for, rather than win only the races it happens to be first to.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dlock::{LockOptions, Locker};

use crate::support::fault_proxy::{Direction, FaultProxy};
use crate::support::{self, sql_store::SqlStore};
use crate::Postgres;

/// Three tasks of `locker` take `key` in turn, 5 ms each, until `stop`; counts their bodies.
fn take_turns(
    locker: &Locker,
    key: &str,
    stop: &Arc<AtomicBool>,
) -> (Arc<AtomicU64>, Vec<tokio::task::JoinHandle<()>>) {
    let entered = Arc::new(AtomicU64::new(0));
    let tasks = (0..3)
        .map(|_| {
            let (locker, key, stop, entered) = (
                locker.clone(),
                key.to_owned(),
                stop.clone(),
                entered.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let options = LockOptions::new()
                        .ttl(Duration::from_secs(10))
                        .wait(Duration::from_secs(30));
                    let lease = locker.lock(&*key, options).await.unwrap();
                    entered.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    lease.release().await.unwrap();
                }
            })
        })
        .collect();
    (entered, tasks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_far_process_gets_its_turns_beside_a_near_one() {
    let db = Postgres::fresh().await;
    let near = db.locker().await;
    let (proxy, far_url) = FaultProxy::in_front_of(&support::postgres_url());
    let far = db.locker_at(&far_url).await;
    let key = support::unique_key("line");
    // Prepared before the far process is slowed down.
    far.lock(&*key, LockOptions::new())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    proxy.set_latency(Direction::ToServer, Duration::from_millis(20));

    let stop = Arc::new(AtomicBool::new(false));
    let (near_entered, near_tasks) = take_turns(&near, &key, &stop);
    let (far_entered, far_tasks) = take_turns(&far, &key, &stop);
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::SeqCst);
    for task in near_tasks.into_iter().chain(far_tasks) {
        task.await.unwrap();
    }
    let (near, far) = (
        near_entered.load(Ordering::SeqCst),
        far_entered.load(Ordering::SeqCst),
    );
    eprintln!("over 3 s: the near process entered {near} times, the far one {far}");
    // In line, the processes take turns: the far one's bodies are fewer only by what its
    // slower statements cost it, not by the races it loses.
    assert!(
        far > 0 && near <= 3 * far,
        "over 3 s the near process entered {near} times, the far one {far}"
    );
}

/// A process whose listener went deaf without its connection breaking (a load balancer dropped
/// the idle flow, or the listener goes through PgBouncer) cannot hear the release of the key
/// it waits for: it learns of it within a second or so all the same (its place keeper reads
/// whether the keys its waiters wait for came free), not when the old holder's lease would have
/// run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deaf_process_learns_of_a_release_within_moments() {
    use std::time::Instant;

    use dlock::backend::PostgresBackend;

    let db = Postgres::fresh().await;
    let (listen_proxy, listen_url) = FaultProxy::in_front_of(&support::postgres_url());
    let deaf = Locker::with_backend(
        PostgresBackend::builder(&support::postgres_url())
            .unwrap()
            .table(&db.table)
            .listen_url(&listen_url)
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    listen_proxy.stall_open(Direction::ToClient);
    let holder = db.locker().await;
    let key = support::unique_key("deaf");
    let held = LockOptions::new().ttl(Duration::from_secs(20)).renew(false);
    let lease = holder.lock(&*key, held).await.unwrap();
    let waiting = tokio::spawn({
        let (deaf, key) = (deaf.clone(), key.clone());
        async move {
            let lease = deaf
                .lock(&*key, LockOptions::new().wait(Duration::from_secs(60)))
                .await?;
            let at = Instant::now();
            lease.release().await?;
            Ok::<_, dlock::LockError>(at)
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let released_at = Instant::now();
    lease.release().await.unwrap();
    let entered = waiting.await.unwrap().map(|at| at - released_at);
    assert!(
        entered
            .as_ref()
            .is_ok_and(|after| *after < Duration::from_secs(3)),
        "the deaf process got the key {entered:?} after its release"
    );
}

/// The next waiter of a process takes its turn when the waiter ahead of it, handed the key,
/// holds it past its first ttl (renewed) and then releases it: the release hands the key on at
/// once, even where the process's listener is deaf. The waiter behind rests until the holder's
/// expiry and looks again then, as the lease is renewed; it must not sleep on until a time it
/// read before the key went round (here, the first holder's expiry a minute on), nor count as a
/// waiter that let its turn lapse meanwhile (a release would then delete the row rather than
/// hand it over, and nobody would tell the deaf process it is free).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_waiter_takes_its_turn_after_a_renewed_holder_of_its_process() {
    use std::time::Instant;

    use dlock::backend::PostgresBackend;

    let db = Postgres::fresh().await;
    let (listen_proxy, listen_url) = FaultProxy::in_front_of(&support::postgres_url());
    let deaf = Locker::with_backend(
        PostgresBackend::builder(&support::postgres_url())
            .unwrap()
            .table(&db.table)
            .listen_url(&listen_url)
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    listen_proxy.stall_open(Direction::ToClient);
    let key = support::unique_key("renewed-ahead");
    let first = deaf
        .lock(&*key, LockOptions::new().ttl(Duration::from_secs(60)))
        .await
        .unwrap();
    // Waits, then holds the key for three of its 2 s ttls, renewed, and releases it.
    let ahead = tokio::spawn({
        let (deaf, key) = (deaf.clone(), key.clone());
        async move {
            let options = LockOptions::new()
                .ttl(Duration::from_secs(2))
                .wait(Duration::from_secs(60));
            let lease = deaf.lock(&*key, options).await?;
            tokio::time::sleep(Duration::from_secs(6)).await;
            let released_at = Instant::now();
            lease.release().await?;
            Ok::<_, dlock::LockError>(released_at)
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let behind = tokio::spawn({
        let (deaf, key) = (deaf.clone(), key.clone());
        async move {
            let lease = deaf
                .lock(&*key, LockOptions::new().wait(Duration::from_secs(120)))
                .await?;
            let at = Instant::now();
            lease.release().await?;
            Ok::<_, dlock::LockError>(at)
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    first.release().await.unwrap();
    let released_at = ahead.await.unwrap().unwrap();
    let entered = tokio::time::timeout(Duration::from_secs(10), behind)
        .await
        .map(|entered| entered.unwrap().map(|at| at - released_at));
    assert!(
        entered
            .as_ref()
            .is_ok_and(|after| after.as_ref().is_ok_and(|after| *after < Duration::from_secs(3))),
        "the next waiter got the key {entered:?} after the waiter ahead of it released it (Err(Elapsed): not within 10 s)"
    );
}

/// A waiter that joins while a release hands the key to the head of its process's queue, and
/// that head never comes for it (its future parked), passes the head over once its turn lapses
/// and gets the key within moments, even where the process's listener is deaf: it must not
/// sleep until its own deadline, told only that the head was not due yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_joins_during_a_hand_over_passes_over_a_head_that_never_takes_it() {
    use std::time::Instant;

    use dlock::backend::PostgresBackend;

    let db = Postgres::fresh().await;
    let (listen_proxy, listen_url) = FaultProxy::in_front_of(&support::postgres_url());
    let deaf = Locker::with_backend(
        PostgresBackend::builder(&support::postgres_url())
            .unwrap()
            .table(&db.table)
            .listen_url(&listen_url)
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    listen_proxy.stall_open(Direction::ToClient);
    let key = support::unique_key("joins-mid-hand-over");
    let lease = deaf
        .lock(&*key, LockOptions::new().ttl(Duration::from_secs(60)))
        .await
        .unwrap();
    // The head: polled until it rests behind the holder, then parked for good.
    let mut head = Box::pin(
        deaf.lock(
            key.clone(),
            LockOptions::new()
                .ttl(Duration::from_secs(60))
                .wait(Duration::from_secs(60)),
        ),
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut head)
            .await
            .is_err(),
        "the head got a held key"
    );
    db.hold_up_hand_overs(Duration::from_millis(1500)).await;
    let released_at = Instant::now();
    let releasing = tokio::spawn(async move { lease.release().await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Joins while the hand-over is on its way.
    let behind = tokio::spawn({
        let (deaf, key) = (deaf.clone(), key.clone());
        async move {
            let lease = deaf
                .lock(&*key, LockOptions::new().wait(Duration::from_secs(60)))
                .await?;
            let at = Instant::now();
            lease.release().await?;
            Ok::<_, dlock::LockError>(at)
        }
    });
    releasing.await.unwrap().unwrap();
    let entered = tokio::time::timeout(Duration::from_secs(15), behind)
        .await
        .map(|entered| entered.unwrap().map(|at| at - released_at));
    assert!(
        entered
            .as_ref()
            .is_ok_and(|after| after.as_ref().is_ok_and(|after| *after < Duration::from_secs(8))),
        "the waiter behind got the key {entered:?} after the release (Err(Elapsed): not within 15 s)"
    );
    drop(head);
}
