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
