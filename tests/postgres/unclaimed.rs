//! A waiter that stops being polled, with its future kept (parked in a `select!`, its runtime
//! stalled), costs the waiters behind it a short window, not its whole wait or a ttl: neither
//! its place at the head of this process's queue nor a grant it never came back for keeps the
//! key from everyone else.

use std::time::{Duration, Instant};

use dlock::{LockOptions, Locker};

use crate::support::{self, fault_proxy::Direction, fault_proxy::FaultProxy};
use crate::Postgres;

/// How long a woken head may take to start its try before the next waiter passes it over.
const HEAD_TURN: Duration = Duration::from_secs(1);
/// How long a grant waits for its caller to claim it.
const CLAIM_WINDOW: Duration = Duration::from_secs(3);
/// What the tests allow on top of either for the statements themselves.
const SLACK: Duration = Duration::from_secs(2);
/// The delay the proxy puts on the slowed-down locker's answers: its grant reaches it that much
/// after the row was written, and the window starts then; its undo's connection check takes a
/// round trip of it.
const LATENCY: Duration = Duration::from_millis(500);

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

/// The grant lands while its caller is parked: the statement is in flight (slowed down by a
/// proxy) when the caller stops polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_its_caller_never_came_back_for_is_undone_after_the_claim_window() {
    let db = Postgres::fresh().await;
    let (proxy, url) = FaultProxy::in_front_of(&support::postgres_url());
    let slow = Locker::with_backend(
        dlock::backend::PostgresBackend::builder(&url)
            .unwrap()
            .table(&db.table)
            .connect()
            .await
            .unwrap(),
    );
    let key = support::unique_key("unclaimed-grant");
    // Prepared on the pool's connection first, so the slowed-down statement is executed at
    // once and only its answer is late.
    slow.lock(&*key, held(60))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    proxy.set_latency(Direction::ToClient, LATENCY);
    // A wait of its own, so that the statement's slow answer is not the end of the try.
    let mut parked = Box::pin(slow.lock(key.clone(), held(60).wait(Duration::from_secs(30))));
    // Polled until its statement wrote the row, then parked with the answer on its way.
    tokio::select! {
        got = &mut parked => panic!("the slowed-down statement answered at once: {:?}", got.map(|l| l.fence())),
        () = async { while db.rows(&key).await == 0 { tokio::time::sleep(Duration::from_millis(10)).await } } => {}
    }
    let rival = db.locker().await;
    let asked = Instant::now();
    let got = rival
        .lock(&*key, held(60).wait(Duration::from_secs(10)))
        .await;
    let waited = asked.elapsed();
    assert!(
        got.is_ok() && waited < CLAIM_WINDOW + 2 * LATENCY + SLACK,
        "the key went to the rival only after {waited:?} ({:?}): a grant nobody claimed was held for its ttl",
        got.as_ref().err()
    );
    let lease = got.unwrap();
    // Polled again, the parked caller finds its grant withdrawn and waits for the key, held.
    proxy.set_latency(Direction::ToClient, Duration::ZERO);
    let late = tokio::time::timeout(Duration::from_secs(2), &mut parked).await;
    assert!(
        !matches!(late, Ok(Ok(_))),
        "two holders at once: the withdrawn grant was claimed"
    );
    drop(parked);
    lease.release().await.unwrap();
    assert_eq!(db.rows(&key).await, 0, "a row outlived every holder");
}
