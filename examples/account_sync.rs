//! Duplicate `open_id` rows in `t_account`.
//!
//! Every launch of the app center calls `submit(open_id, local_id)`, which checks for the
//! account's row and then inserts or updates it. Clients retry on time-outs, so the same call
//! arrives several times at once; with no unique index on `open_id`, two concurrent checks both
//! see "no row" and both insert. The fix: serialise `submit` per `open_id` with a
//! short lease (`SET key value NX EX 3`), and discard the request that loses the race. The
//! duplicates already in the table are then removed by a scheduled job, at most 1,000 rows per
//! run so the database is never overwhelmed, while the lock keeps new ones from appearing.
//!
//! Runs with no set-up on the in-memory store; set `DLOCK_URL` (`redis://127.0.0.1:6379`,
//! `mysql://…`, `postgres://…`, `zk://…`, with the store's feature enabled) to lock on a real one:
//!
//! ```text
//! cargo run --example account_sync
//! DLOCK_URL=postgres://postgres@127.0.0.1:5432/test cargo run --features postgres --example account_sync
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock::{distributed_lock, LockError, Locker};

/// A row of `t_account`: no unique index on `open_id`, as in many tables grown over the years.
#[derive(Debug, Clone)]
struct Account {
    id: u64,
    open_id: String,
    local_id: String,
}

/// The table, with the latency of a real round trip between the check and the write.
#[derive(Default)]
struct AccountTable {
    rows: Mutex<Vec<Account>>,
}

impl AccountTable {
    async fn find(&self, open_id: &str) -> Option<Account> {
        tokio::time::sleep(Duration::from_millis(5)).await;
        self.rows
            .lock()
            .unwrap()
            .iter()
            .find(|a| a.open_id == open_id)
            .cloned()
    }

    async fn insert(&self, open_id: &str, local_id: &str) {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let mut rows = self.rows.lock().unwrap();
        let id = rows.iter().map(|a| a.id).max().unwrap_or(0) + 1;
        rows.push(Account {
            id,
            open_id: open_id.into(),
            local_id: local_id.into(),
        });
    }

    async fn update(&self, id: u64, local_id: &str) {
        tokio::time::sleep(Duration::from_millis(5)).await;
        if let Some(row) = self.rows.lock().unwrap().iter_mut().find(|a| a.id == id) {
            row.local_id = local_id.into();
        }
    }

    /// The clean-up job, one run: deletes up to `limit` duplicate rows, keeping the
    /// oldest row (lowest id) of each `open_id`. Returns how many it deleted.
    async fn delete_duplicates(&self, limit: usize) -> usize {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let mut rows = self.rows.lock().unwrap();
        let mut oldest: BTreeMap<String, u64> = BTreeMap::new();
        for row in rows.iter() {
            let id = oldest.entry(row.open_id.clone()).or_insert(row.id);
            *id = (*id).min(row.id);
        }
        let mut deleted = 0;
        rows.retain(|row| {
            let duplicate = oldest[&row.open_id] != row.id;
            if duplicate && deleted < limit {
                deleted += 1;
                return false;
            }
            true
        });
        deleted
    }

    fn rows_per_open_id(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for row in self.rows.lock().unwrap().iter() {
            *counts.entry(row.open_id.clone()).or_default() += 1;
        }
        counts
    }
}

#[derive(Debug)]
enum AppError {
    Lock(LockError),
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError::Lock(error)
    }
}

/// The service method as it was: check, then insert or update.
async fn submit_unlocked(
    table: &AccountTable,
    open_id: &str,
    local_id: &str,
) -> Result<(), AppError> {
    match table.find(open_id).await {
        None => table.insert(open_id, local_id).await,
        Some(account) => table.update(account.id, local_id).await,
    }
    Ok(())
}

/// The same method under a lock: one caller per `open_id` at a time; a concurrent
/// duplicate finds the key busy and is discarded (`wait` defaults to zero).
#[distributed_lock(key = "acct:<open_id>", ttl = "3s")]
async fn submit(table: &AccountTable, open_id: &str, local_id: &str) -> Result<(), AppError> {
    submit_unlocked(table, open_id, local_id).await
}

/// `users` users launch the app; each launch arrives eight times at once (client retries).
async fn launch_storm<F, Fut>(table: Arc<AccountTable>, users: usize, call: F) -> (usize, usize)
where
    F: Fn(Arc<AccountTable>, String, String) -> Fut,
    Fut: std::future::Future<Output = Result<(), AppError>> + Send + 'static,
{
    let mut calls = Vec::new();
    for user in 0..users {
        for retry in 0..8 {
            let open_id = format!("oX7f-user-{user}");
            let local_id = format!("device-{user}-{retry}");
            calls.push(tokio::spawn(call(table.clone(), open_id, local_id)));
        }
    }
    let (mut applied, mut discarded) = (0, 0);
    for call in calls {
        match call.await.expect("submit panicked") {
            Ok(()) => applied += 1,
            // Busy: a concurrent duplicate holds the account. Lost: the store answered so late
            // (a loaded store) that the lease ran out before the work began; the body did not
            // run. Either way the client's retry decides, as it would for a time-out.
            Err(AppError::Lock(LockError::Busy { .. } | LockError::Lost { .. })) => discarded += 1,
            Err(other) => panic!("submit failed: {other:?}"),
        }
    }
    (applied, discarded)
}

fn report(title: &str, table: &AccountTable, applied: usize, discarded: usize) {
    let counts = table.rows_per_open_id();
    let rows: usize = counts.values().sum();
    println!("{title}: {applied} calls applied, {discarded} discarded as concurrent duplicates");
    for (open_id, n) in &counts {
        println!("  {open_id}: {n} row(s)");
    }
    println!(
        "  => {} open_ids, {rows} rows, {} duplicate rows",
        counts.len(),
        rows - counts.len()
    );
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let locker = match std::env::var("DLOCK_URL") {
        Ok(url) if !url.is_empty() => Locker::connect(&url).await?,
        _ => Locker::memory(),
    };
    println!("locker: {locker:?}\n");
    dlock::set_default_locker(locker);

    let table = Arc::new(AccountTable::default());
    let (applied, discarded) = launch_storm(table.clone(), 5, |t, o, l| async move {
        submit_unlocked(&t, &o, &l).await
    })
    .await;
    report("without a lock", &table, applied, discarded);

    let table = Arc::new(AccountTable::default());
    let (applied, discarded) = launch_storm(table.clone(), 5, |t, o, l| async move {
        submit(&t, &o, &l).await
    })
    .await;
    report(
        "\nwith #[distributed_lock(key = \"acct:<open_id>\", ttl = \"3s\")]",
        &table,
        applied,
        discarded,
    );

    // Production already holds the duplicates of the months before the fix: 400 users' worth.
    let table = Arc::new(AccountTable::default());
    launch_storm(table.clone(), 400, |t, o, l| async move {
        submit_unlocked(&t, &o, &l).await
    })
    .await;
    let duplicates: usize = table.rows_per_open_id().values().map(|n| n - 1).sum();
    println!("\nclean-up: {duplicates} old duplicate rows; the job deletes at most 1,000 per run,");
    println!("while the same 400 users launch again, under the lock");
    let launches = tokio::spawn(launch_storm(table.clone(), 400, |t, o, l| async move {
        submit(&t, &o, &l).await
    }));
    for run in 1.. {
        let deleted = table.delete_duplicates(1_000).await;
        println!("  run {run}: deleted {deleted} rows");
        if deleted == 0 && launches.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (applied, discarded) = launches.await.expect("the launches panicked");
    let counts = table.rows_per_open_id();
    let rows: usize = counts.values().sum();
    println!(
        "after the clean-up: {} open_ids, {rows} rows, {} duplicate rows ({applied} launches applied, {discarded} discarded)",
        counts.len(),
        rows - counts.len()
    );
    Ok(())
}
