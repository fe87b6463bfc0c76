//! A waiter that stops being polled, with its future kept (parked in a `select!`, its runtime
//! stalled), costs the waiters behind it a short window, not its whole wait: its place at the
//! head of this process's queue does not keep the key from everyone else. (A grant it never
//! came back for: `support::sql_store`, run with the other SQL scenarios.)

use std::time::{Duration, Instant};

use dlock::{LockOptions, Locker};

use crate::support;
use crate::Postgres;

/// How long a woken head may take to start its try before the next waiter passes it over.
const HEAD_TURN: Duration = Duration::from_secs(1);
/// What the tests allow on top of it for the statements themselves.
const SLACK: Duration = Duration::from_secs(2);

fn held(ttl_s: u64) -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(ttl_s))
        .renew(false)
}

/// A holder (on a locker of its own) holds `key` for 60 s; a waiter on `locker` is polled for
/// 50 ms, which queues it at the head, then parked; the holder releases. Returns the parked
/// future, to keep it alive.
async fn a_parked_head_behind_a_release<'a>(
    db: &Postgres,
    locker: &'a Locker,
    key: &str,
) -> impl std::future::Future + 'a {
    let holder = db.locker().await;
    let lease = holder.lock(key, held(60)).await.unwrap();
    let mut parked = Box::pin(locker.lock(key.to_owned(), held(60).wait(Duration::from_secs(60))));
    assert!(
        tokio::time::timeout(Duration::from_millis(50), &mut parked)
            .await
            .is_err(),
        "the waiter got a held key"
    );
    lease.release().await.unwrap();
    parked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_head_does_not_keep_the_key_from_the_waiters_behind_it() {
    let db = Postgres::fresh().await;
    let locker = db.locker().await;
    let key = support::unique_key("parked-head");
    let _parked = a_parked_head_behind_a_release(&db, &locker, &key).await;
    let asked = Instant::now();
    let got = locker
        .lock(&*key, held(60).wait(Duration::from_secs(10)))
        .await;
    let waited = asked.elapsed();
    assert!(
        got.is_ok() && waited < HEAD_TURN + SLACK,
        "a live waiter got {:?} after {waited:?} behind a free key and a parked head",
        got.as_ref().map(|lease| lease.fence())
    );
    got.unwrap().release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_head_does_not_keep_the_key_from_a_caller_that_does_not_wait() {
    let db = Postgres::fresh().await;
    let locker = db.locker().await;
    let key = support::unique_key("parked-head-try");
    let _parked = a_parked_head_behind_a_release(&db, &locker, &key).await;
    let asked = Instant::now();
    loop {
        match locker.lock(&*key, held(60)).await {
            Ok(lease) => {
                lease.release().await.unwrap();
                break;
            }
            Err(error) => assert!(
                asked.elapsed() < HEAD_TURN + SLACK,
                "a caller that does not wait still got `{error}` after {:?}, the key free but for a parked head",
                asked.elapsed()
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A head whose future is parked while its try is in flight, behind a holder that dies (its
/// row expires; no release is ever announced), costs the waiters behind it a short window, not
/// their whole wait: the waiter behind passes it over and takes the expired key, and other
/// processes are not kept out either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_parked_mid_try_does_not_keep_an_expired_key_from_anyone() {
    use support::fault_proxy::{Direction, FaultProxy};

    let db = Postgres::fresh().await;
    let (proxy, url) = FaultProxy::in_front_of(&support::postgres_url());
    let locker = support::sql_store::SqlStore::locker_at(&db, &url).await;
    let key = support::unique_key("parked-mid-try");
    // A holder that died: its row runs out in 3 s, and nobody announces it.
    db.insert_row_of_a_dead_holder(&key, Duration::from_secs(3))
        .await;
    let ghost_expires = Instant::now() + Duration::from_secs(3);
    // The head's try is in flight (its answer slowed down) when its future is parked.
    proxy.set_latency(Direction::ToClient, Duration::from_millis(500));
    let mut parked = Box::pin(locker.lock(key.clone(), held(60).wait(Duration::from_secs(60))));
    assert!(
        tokio::time::timeout(Duration::from_millis(100), &mut parked)
            .await
            .is_err(),
        "the head got a held key"
    );
    proxy.set_latency(Direction::ToClient, Duration::ZERO);
    let got = locker
        .lock(&*key, held(60).wait(Duration::from_secs(20)))
        .await;
    let late = Instant::now().saturating_duration_since(ghost_expires);
    assert!(
        got.is_ok() && late < HEAD_TURN + SLACK + Duration::from_secs(2),
        "a live waiter got {:?} {late:?} after the key expired, behind a head parked mid-try",
        got.as_ref().map(|lease| lease.fence())
    );
    got.unwrap().release().await.unwrap();
    // Another process's caller that does not wait finds the key free too.
    let elsewhere = db.locker().await;
    let asked = Instant::now();
    loop {
        match elsewhere.lock(&*key, held(60)).await {
            Ok(lease) => break lease.release().await.unwrap(),
            Err(error) => assert!(
                asked.elapsed() < Duration::from_secs(3) + SLACK,
                "another process still got `{error}` after {:?}, the key free but for a parked head",
                asked.elapsed()
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(parked);
}

/// The undo of a grant its caller did not claim in time deletes that grant only: the caller,
/// polled again, may have got the key anew (the same owner, a later grant) before the undo's
/// statement ran, and that lease must stay. The undo is held up here by a trigger that sleeps
/// before each release statement of the table, as a slow or re-sent statement would be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undo_late_for_a_withdrawn_grant_leaves_the_next_grant_alone() {
    use support::fault_proxy::{Direction, FaultProxy};

    let db = Postgres::fresh().await;
    let (proxy, url) = FaultProxy::in_front_of(&support::postgres_url());
    let slow = support::sql_store::SqlStore::locker_at(&db, &url).await;
    let key = support::unique_key("late-undo");
    // Prepared on the pool's connection first, so the slowed-down statement runs at once and
    // only its answer is late.
    slow.lock(&*key, held(60))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    db.hold_up_releases(Duration::from_millis(1_500)).await;
    proxy.set_latency(Direction::ToClient, Duration::from_millis(500));
    let mut parked = Box::pin(slow.lock(key.clone(), held(60).wait(Duration::from_secs(30))));
    tokio::select! {
        got = &mut parked => panic!("the slowed-down statement answered at once: {:?}", got.map(|l| l.fence())),
        () = async { while db.rows(&key).await == 0 { tokio::time::sleep(Duration::from_millis(10)).await } } => {}
    }
    // Past the claim window (3 s, counted from the late answer): the grant is withdrawn and
    // its undo is asleep in the trigger.
    tokio::time::sleep(Duration::from_millis(3_800)).await;
    proxy.set_latency(Direction::ToClient, Duration::ZERO);
    let lease = tokio::time::timeout(Duration::from_secs(10), &mut parked)
        .await
        .expect("the caller did not get the key again")
        .expect("the caller did not get the key again");
    // The undo has woken from the trigger by now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rival = db.locker().await;
    let rival_got = rival.lock(&*key, held(60)).await;
    assert!(
        lease.is_held() && rival_got.is_err() && db.rows(&key).await == 1,
        "two holders at once: the late undo deleted the caller's next grant (rows: {}, rival: {:?})",
        db.rows(&key).await,
        rival_got.as_ref().map(|lease| lease.fence())
    );
    lease.release().await.unwrap();
}

/// Callers that gave up while their tries waited for a connection (the row they want is locked
/// by another transaction, and one try at a time may wait on it) leave nothing to do: their
/// tries are not sent once they get one. Sent anyway, each would cost the database its
/// statements for nobody, and keep the undo of the grant the first try may win, which queues
/// behind them, from freeing the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tries_whose_callers_gave_up_are_not_sent() {
    use support::sql_store::SqlStore;

    let db = Postgres::fresh().await;
    // Two connections: one for the tries, one for the rest.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&support::postgres_url())
        .await
        .unwrap();
    let backend = dlock::backend::PostgresBackend::with_pool(pool)
        .table(&db.table)
        .connect()
        .await
        .unwrap();
    let locker = Locker::with_backend(backend.clone());
    let key = support::unique_key("given-up");
    db.insert_expired_row(&key).await;
    let row_lock = db.lock_row(&key).await;
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..40 {
        let (locker, key) = (locker.clone(), key.clone());
        callers.spawn(async move {
            locker
                .lock(&*key, held(60))
                .await
                .map(|lease| lease.fence())
        });
    }
    while let Some(answer) = callers.join_next().await {
        let answer = answer.unwrap();
        assert!(answer.is_err(), "a try of a locked row got it: {answer:?}");
    }
    let after_the_callers = backend.statements();
    drop(row_lock);
    // Time for whatever is still queued to be sent; 40 tries would be 40 statements or more.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let sent = backend.statements() - after_the_callers;
    assert!(
        sent <= 4,
        "{sent} statements sent for callers that had all given up"
    );
    // And the key is free: the grant the first try may have won was undone.
    let lease = locker
        .lock(&*key, held(60).wait(Duration::from_secs(5)))
        .await;
    assert!(lease.is_ok(), "the key is still held by nobody: {lease:?}");
    lease.unwrap().release().await.unwrap();
}
