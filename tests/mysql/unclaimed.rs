//! A grant its caller never came back for (the caller's future parked while the statement was
//! in flight, or its runtime stalled) is undone after the claim window: it costs the next
//! caller that window, not the lease's ttl.

use std::time::{Duration, Instant};

use dlock::backend::MysqlBackend;
use dlock::{LockOptions, Locker};
use sqlx::{AssertSqlSafe, Row};

use crate::support::{self, fault_proxy::Direction, fault_proxy::FaultProxy};
use crate::Mysql;

/// How long a grant waits for its caller to claim it, and what the test allows on top of it.
const CLAIM_WINDOW: Duration = Duration::from_secs(3);
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

async fn rows(db: &Mysql, key: &str) -> i64 {
    sqlx::query(AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM `{}` WHERE lock_key = ?",
        db.table
    )))
    .bind(key.as_bytes())
    .fetch_one(&db.admin)
    .await
    .unwrap()
    .get::<i64, _>(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_its_caller_never_came_back_for_is_undone_after_the_claim_window() {
    let db = Mysql::fresh().await;
    let (proxy, url) = FaultProxy::in_front_of(&support::mysql_url());
    let slow = Locker::with_backend(
        MysqlBackend::builder(&url)
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
        () = async { while rows(&db, &key).await == 0 { tokio::time::sleep(Duration::from_millis(10)).await } } => {}
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
    assert_eq!(rows(&db, &key).await, 0, "a row outlived every holder");
}
