//! A release hands the key to the next waiter of its own process in the release's statement:
//! the waiter sends nothing to take it. A handed key the waiter does not take (its future
//! dropped, or parked) goes back within moments, never held by nobody for the waiter's ttl.

use std::future::Future;
use std::time::{Duration, Instant};

use dlock::backend::PostgresBackend;
use dlock::{Lease, LockOptions, Locker};

use crate::support::fault_proxy::{Direction, FaultProxy};
use crate::support::{self, Store};
use crate::Postgres;

/// The claim window a handed key waits for its waiter.
const CLAIM_WINDOW: Duration = Duration::from_secs(3);
/// What the tests allow on top of it for the statements themselves.
const SLACK: Duration = Duration::from_secs(2);

fn held(ttl_s: u64) -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(ttl_s))
        .renew(false)
}

/// A waiter for `key` on `locker`, polled until it rests behind the holder (its first try
/// found the key busy); returned unpolled since, to poll or drop.
async fn a_waiter_at_rest<'a>(
    locker: &'a Locker,
    key: &str,
) -> std::pin::Pin<Box<impl Future<Output = Result<Lease, dlock::LockError>> + 'a>> {
    let mut waiter = Box::pin(locker.lock(key.to_owned(), held(60).wait(Duration::from_secs(60))));
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut waiter)
            .await
            .is_err(),
        "the waiter got a held key"
    );
    waiter
}

/// Tries `key` on `locker` every 50 ms, without waiting, until it gets it or `patience` runs
/// out; the lease, and when it was got.
async fn try_until(locker: &Locker, key: &str, patience: Duration) -> Option<(Lease, Instant)> {
    let asked = Instant::now();
    while asked.elapsed() < patience {
        if let Ok(lease) = locker.lock(key, held(60)).await {
            return Some((lease, Instant::now()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_key_to_a_waiter_of_its_process_in_one_statement() {
    let db = Postgres::fresh().await;
    let backend = db.backend().await;
    let locker = Locker::with_backend(backend.clone());
    let key = support::unique_key("handoff");
    let lease = locker.lock(&*key, held(60)).await.unwrap();
    let waiter = a_waiter_at_rest(&locker, &key).await;
    let before = backend.statements();
    lease.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter did not get the released key")
        .unwrap();
    let sent = backend.statements() - before;
    assert_eq!(
        sent, 1,
        "the release and the waiter's taking of the key sent {sent} statements"
    );
    assert!(next.fence() > 0 && db.rows(&key).await == 1);
    next.release().await.unwrap();
    assert_eq!(db.rows(&key).await, 0, "the last release left a row");
}

/// The waiter is dropped while the release's statement waits to write the row (a trigger
/// slows down the lock table's updates): the locker's own undo of the dropped acquisition, a
/// release by the waiter's owner, finds nothing of its yet, and the release then hands the row
/// to a waiter that is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_handed_to_a_waiter_dropped_meanwhile_goes_back_at_once() {
    let db = Postgres::fresh().await;
    let locker = db.locker().await;
    let elsewhere = db.locker().await;
    let key = support::unique_key("handoff-dropped");
    let lease = locker.lock(&*key, held(60)).await.unwrap();
    let waiter = a_waiter_at_rest(&locker, &key).await;
    db.slow_down("UPDATE", Duration::from_millis(1_000)).await;
    let releasing = tokio::spawn(async move { lease.release().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(waiter);
    releasing.await.unwrap().unwrap();
    // Tries are updates too (an upsert): they go at full speed again.
    db.stop_slowing_down().await;
    let dropped_at = Instant::now();
    let got = try_until(&elsewhere, &key, Duration::from_secs(20)).await;
    let (lease, at) = got.expect("the key handed to a dropped waiter stayed held for 20 s");
    assert!(
        at - dropped_at < SLACK,
        "the key handed to a dropped waiter came back only {:?} later",
        at - dropped_at
    );
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_handed_to_a_parked_waiter_goes_back_after_the_claim_window() {
    let db = Postgres::fresh().await;
    let locker = db.locker().await;
    let elsewhere = db.locker().await;
    let key = support::unique_key("handoff-parked");
    let lease = locker.lock(&*key, held(60)).await.unwrap();
    let mut parked = a_waiter_at_rest(&locker, &key).await;
    let released_at = Instant::now();
    lease.release().await.unwrap();
    let got = try_until(&elsewhere, &key, Duration::from_secs(20)).await;
    let (rival, at) = got.expect("the key handed to a parked waiter stayed held for 20 s");
    assert!(
        at - released_at < CLAIM_WINDOW + SLACK,
        "the key handed to a parked waiter came back only {:?} after the release",
        at - released_at
    );
    // The waiter, polled again, does not run on the grant it did not claim in time: it waits
    // for the rival, and then holds the key with a later fence.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut parked)
            .await
            .is_err(),
        "the parked waiter took back a withdrawn grant while the rival held the key"
    );
    let rival_fence = rival.fence();
    rival.release().await.unwrap();
    let late = tokio::time::timeout(Duration::from_secs(10), parked)
        .await
        .expect("the parked waiter never got the key")
        .unwrap();
    assert!(late.fence() > rival_fence);
    late.release().await.unwrap();
}

/// A locker whose statements go through a proxy (its listener straight to the server), holding
/// a lease of a fresh key; and another locker, to try the key from elsewhere.
async fn a_holder_behind_a_proxy(
    db: &Postgres,
    name: &str,
) -> (FaultProxy, Locker, Locker, String, Lease) {
    let (proxy, url) = FaultProxy::in_front_of(&support::postgres_url());
    let backend = PostgresBackend::builder(&url)
        .unwrap()
        .table(&db.table)
        .listen_url(&support::postgres_url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let locker = Locker::with_backend(backend);
    let key = support::unique_key(name);
    let lease = locker.lock(&*key, held(60)).await.unwrap();
    (proxy, locker, db.locker().await, key, lease)
}

/// Releases `lease` so that the release's statement hands the row over and commits, but its
/// answer is lost with its connection: the hand-over waits 1 s on the server before it writes,
/// its answer is held meanwhile, and its connection is cut. Sent again on a fresh connection,
/// it finds the row no longer the releaser's.
async fn release_losing_the_answer(db: &Postgres, proxy: &FaultProxy, lease: Lease) {
    db.slow_down("UPDATE", Duration::from_millis(1_000)).await;
    let releasing = tokio::spawn(async move { lease.release().await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.stall_open(Direction::ToClient);
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    proxy.cut_all();
    let _ = releasing.await.unwrap();
    db.stop_slowing_down().await;
}

/// Asserts that `elsewhere` gets `key` within `within`, the key `what` held.
async fn comes_back_within(elsewhere: &Locker, key: &str, within: Duration, what: &str) {
    let asked = Instant::now();
    let got = try_until(elsewhere, key, Duration::from_secs(15)).await;
    let (lease, at) = got.unwrap_or_else(|| panic!("the key {what} stayed held for 15 s"));
    assert!(
        at - asked < within,
        "the key {what} came back only {:?} later",
        at - asked
    );
    lease.release().await.unwrap();
}

/// A hand-over whose answer was lost, while the waiter's own wait ran out: the row it may hold
/// is deleted, rather than left held by nobody for its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_whose_answer_was_lost_leaves_no_row_to_a_waiter_that_gave_up() {
    let db = Postgres::fresh().await;
    let (proxy, locker, elsewhere, key, lease) =
        a_holder_behind_a_proxy(&db, "handoff-lost-answer").await;
    let waiter = tokio::spawn({
        let (locker, key) = (locker.clone(), key.clone());
        async move {
            locker
                .lock(&*key, held(60).wait(Duration::from_secs(2)))
                .await
                .map(|lease| lease.fence())
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The waiter gives up (its 2 s wait runs out) while the statement, sent again, is answered.
    release_losing_the_answer(&db, &proxy, lease).await;
    let gave_up = waiter.await.unwrap();
    assert!(gave_up.is_err(), "the waiter got the key: {gave_up:?}");
    comes_back_within(&elsewhere, &key, SLACK, "handed to a waiter that gave up").await;
}

/// As above, but the waiter is parked (its future kept, no longer polled) rather than gone: the
/// key goes to others within the claim window rather than after the waiter's ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_whose_answer_was_lost_leaves_no_row_to_a_parked_waiter() {
    let db = Postgres::fresh().await;
    let (proxy, locker, elsewhere, key, lease) =
        a_holder_behind_a_proxy(&db, "handoff-lost-parked").await;
    let parked = a_waiter_at_rest(&locker, &key).await;
    release_losing_the_answer(&db, &proxy, lease).await;
    comes_back_within(
        &elsewhere,
        &key,
        CLAIM_WINDOW + SLACK,
        "handed to a parked waiter",
    )
    .await;
    drop(parked);
}

/// The release's statement does not answer (it stands here for a connection gone half-open:
/// a trigger holds up the hand-over alone for 10 s): after a few seconds its outcome counts
/// as unknown, the waiter it was offered to gives up with an error, and the key, deleted under
/// either owner, goes to others rather than wait for that statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_that_never_answers_holds_nobody_up_for_long() {
    let db = Postgres::fresh().await;
    let locker = db.locker().await;
    let elsewhere = db.locker().await;
    let key = support::unique_key("handoff-stuck");
    let lease = locker.lock(&*key, held(60)).await.unwrap();
    let waiter = tokio::spawn({
        let (locker, key) = (locker.clone(), key.clone());
        async move {
            locker
                .lock(&*key, held(60).wait(Duration::from_secs(60)))
                .await
                .map(|lease| lease.fence())
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    db.hold_up_hand_overs(Duration::from_secs(10)).await;
    let released_at = Instant::now();
    let releasing = tokio::spawn(async move { lease.release().await });
    let gave_up = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the waiter still waited 20 s for a release that never answered")
        .unwrap();
    assert!(gave_up.is_err(), "the waiter got the key: {gave_up:?}");
    let got = try_until(&elsewhere, &key, Duration::from_secs(20)).await;
    let (lease, at) =
        got.expect("the key stayed held for 20 s behind a release that never answered");
    assert!(
        at - released_at < Duration::from_secs(10),
        "the key came back only {:?} after a release that never answered",
        at - released_at
    );
    lease.release().await.unwrap();
    drop(releasing);
}

/// A grant handed to a waiter that is passed over before it claims it is withdrawn, and its
/// undo deletes by that grant's fence; the waiter, polled again, tries again as the same owner
/// and may be granted the key before that undo (slow here: a trigger holds up releases) reaches
/// the database. Its new grant must take a new fence, which the undo misses: the lease it holds
/// keeps the row, and another process's caller finds the key busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undo_late_for_a_hand_over_withdrawn_as_its_waiter_was_passed_over_leaves_its_next_grant_alone(
) {
    let db = Postgres::fresh().await;
    let locker = db.locker().await;
    let elsewhere = db.locker().await;
    let key = support::unique_key("handoff-passed-over");
    let lease = locker.lock(&*key, held(60)).await.unwrap();
    // The head: polled until it rests behind the holder, then parked.
    let mut parked = a_waiter_at_rest(&locker, &key).await;
    lease.release().await.unwrap();
    let handed_fence = db.fence(&key).await.expect("the release deleted the row");
    db.hold_up_releases(Duration::from_secs(3)).await;
    // A waiter behind, with a short wait: it passes the parked head over once its turn lapses
    // (which withdraws the grant handed to it, and sends the undo), finds the key busy, and
    // gives up.
    let behind = tokio::spawn({
        let (locker, key) = (locker.clone(), key.clone());
        async move {
            locker
                .lock(&*key, held(60).wait(Duration::from_millis(2_500)))
                .await
                .map(|lease| lease.fence())
        }
    });
    let behind = tokio::time::timeout(Duration::from_secs(10), behind)
        .await
        .expect("the waiter behind never gave up")
        .unwrap();
    assert!(
        behind.is_err(),
        "the waiter behind got {behind:?} while the grant's undo was held up"
    );
    // Polled again, the passed-over waiter queues again and gets the key anew while the undo
    // is still held up.
    let again = tokio::time::timeout(Duration::from_secs(10), &mut parked)
        .await
        .expect("the passed-over waiter did not get the key again")
        .expect("the passed-over waiter did not get the key again");
    // The undo's DELETE has woken from the trigger by now.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let row_fence = db.fence(&key).await;
    let rival = elsewhere.lock(&*key, held(60)).await;
    assert!(
        again.is_held()
            && row_fence == Some(again.fence() as i64)
            && matches!(rival, Err(dlock::LockError::Busy { .. })),
        "two holders at once: the late undo of the withdrawn grant (fence {handed_fence}) deleted \
         the waiter's next grant (fence {}, row's fence now {row_fence:?}, rival: {:?})",
        again.fence(),
        rival.as_ref().map(|lease| lease.fence())
    );
    drop(rival);
    again.release().await.unwrap();
}
