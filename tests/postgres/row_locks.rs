//! A lock row held by a transaction that is not dlock's (a `SELECT … FOR UPDATE` in `psql`, a
//! report that joins the table with a locking clause) makes a statement on that row wait for the
//! transaction. That wait must bound neither a caller's call nor the backend's other work: a try
//! ends with the caller's wait, and the tries never take the connection renewals need.

use std::time::{Duration, Instant};

use dlock::LockOptions;
use sqlx::AssertSqlSafe;

use crate::support;
use crate::Postgres;

/// A caller that does not wait gets its answer within this, whatever the row's transaction does.
const TRY_BOUND: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_locked_by_another_transaction_neither_holds_up_tries_nor_starves_renewals() {
    let db = Postgres::fresh().await;
    // Four connections (see `Store::backend`), as many as the tries below.
    let locker = db.locker().await;
    let (locked, renewed) = (
        support::unique_key("row-locked"),
        support::unique_key("renewed"),
    );
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO \"{}\" VALUES ($1, 'stranger', 1, clock_timestamp() - interval '1 second', clock_timestamp())",
        db.table
    )))
    .bind(locked.as_bytes())
    .execute(&db.admin)
    .await
    .unwrap();
    let mut row_lock = db.admin.begin().await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "SELECT * FROM \"{}\" WHERE lock_key = $1 FOR UPDATE",
        db.table
    )))
    .bind(locked.as_bytes())
    .fetch_all(&mut *row_lock)
    .await
    .unwrap();

    // Renewed every few hundred milliseconds: a renewal that cannot get a connection loses it.
    let lease = locker
        .lock(&*renewed, LockOptions::new().ttl(Duration::from_secs(1)))
        .await
        .unwrap();
    let mut tries = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (locker, locked) = (locker.clone(), locked.clone());
        tries.spawn(async move {
            let asked = Instant::now();
            let answer = tokio::time::timeout(
                Duration::from_secs(5),
                locker.lock(&*locked, LockOptions::new().ttl(Duration::from_secs(60))),
            )
            .await;
            (
                asked.elapsed(),
                answer.map(|got| got.map(|lease| lease.fence())),
            )
        });
    }
    let mut answers = Vec::new();
    while let Some(answer) = tries.join_next().await {
        answers.push(answer.unwrap());
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = lease.is_held();
    row_lock.rollback().await.unwrap();
    assert!(
        answers
            .iter()
            .all(|(took, answer)| *took < TRY_BOUND && matches!(answer, Ok(Err(_)))),
        "tries of a row another transaction locks: {answers:?} (a lease on another key still held: {held})"
    );
    assert!(
        held,
        "a lease on another key was lost while tries waited on the locked row"
    );
    lease.release().await.unwrap();
}

/// How long the backend's own connections wait for another transaction's row lock.
const ROW_LOCK_PATIENCE: Duration = Duration::from_secs(2);

/// Tries stuck on a row another transaction keeps locked give their connections back after the
/// row-lock patience: they do not keep every other key from being locked for as long as that
/// transaction lasts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tries_stuck_on_a_locked_row_do_not_keep_other_keys_from_being_locked() {
    let db = Postgres::fresh().await;
    let locker = db.locker().await;
    let (locked, other) = (
        support::unique_key("row-locked-long"),
        support::unique_key("other"),
    );
    sqlx::query(AssertSqlSafe(format!("INSERT INTO \"{}\" VALUES ($1, 'stranger', 1, clock_timestamp() - interval '1 second', clock_timestamp())", db.table)))
        .bind(locked.as_bytes())
        .execute(&db.admin)
        .await
        .unwrap();
    let mut row_lock = db.admin.begin().await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "SELECT * FROM \"{}\" WHERE lock_key = $1 FOR UPDATE",
        db.table
    )))
    .bind(locked.as_bytes())
    .fetch_all(&mut *row_lock)
    .await
    .unwrap();
    let started = Instant::now();
    let mut tries = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (locker, locked) = (locker.clone(), locked.clone());
        tries.spawn(async move {
            let _ = locker
                .lock(&*locked, LockOptions::new().ttl(Duration::from_secs(60)))
                .await;
        });
    }
    while tries.join_next().await.is_some() {}
    tokio::time::sleep(
        (ROW_LOCK_PATIENCE + Duration::from_secs(1)).saturating_sub(started.elapsed()),
    )
    .await;
    let got = locker
        .lock(&*other, LockOptions::new().ttl(Duration::from_secs(60)))
        .await;
    row_lock.rollback().await.unwrap();
    assert!(
        got.is_ok(),
        "another key could not be locked while a transaction kept a row locked: {:?}",
        got.err()
    );
    got.unwrap().release().await.unwrap();
}
