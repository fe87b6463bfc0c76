//! What the SQL stores' tests share: a lock table of the test's own ([`SqlStore`]), and the
//! scenarios that go the same way on MySQL and PostgreSQL, run by each store's test binary:
//!
//! - a lock row held by a transaction that is not dlock's (a `SELECT … FOR UPDATE` in a
//!   client, a report that joins the table with a locking clause) makes a statement on that row
//!   wait for the transaction; that wait must bound neither a caller's call nor the backend's
//!   other work;
//! - an acquisition abandoned while its statement waits on such a transaction leaves no row
//!   behind once the statement goes through: the undo runs after the statement it undoes;
//! - a grant its caller never came back for (the caller's future parked while the statement was
//!   in flight, or its runtime stalled) is undone after the claim window: it costs the next
//!   caller that window, not the lease's ttl;
//! - an operator's view: `inspect` describes the holder (label, host, process, owner, fence,
//!   when it was acquired, its time left) and counts the waiters, `list` names the held keys
//!   under a prefix whose `%` and `_` match only themselves, and a table an earlier version
//!   created is given the describing columns and keeps working.

use std::future::Future;
use std::time::{Duration, Instant};

use dlock::backend::{AcquireRequest, Backend};
use dlock::{LockError, LockOptions, Locker};

use super::fault_proxy::{Direction, FaultProxy};
use super::{unique_key, Store};

/// What operators see and do: inspect, list, a table of an earlier version, an eviction.
mod operator;
#[allow(unused_imports)] // Each test binary calls a part.
pub use operator::*;

/// A lock table of a test's own on a SQL store, and what the scenarios do to it from outside.
pub trait SqlStore: Store + Sized {
    /// A store on a fresh table (created by the first locker).
    fn fresh() -> impl Future<Output = Self> + Send;
    /// The database's URL, for a proxy in front of it.
    fn url() -> String;
    /// A backend on this table through `url`, with a pool of its own.
    fn backend_at(&self, url: &str) -> impl Future<Output = Self::Backend> + Send;
    /// How many rows the table holds for `key`.
    fn rows(&self, key: &str) -> impl Future<Output = i64> + Send;
    /// Writes an expired row of `key`, owned by a stranger.
    fn insert_expired_row(&self, key: &str) -> impl Future<Output = ()> + Send;
    /// Makes an `INSERT` of `key` wait, in a transaction of another client's that ends when the
    /// returned guard is dropped (a gap lock on MySQL, an uncommitted insert on PostgreSQL).
    fn hold_up_inserts_of(&self, key: &str) -> impl Future<Output = RowLock> + Send;
    /// Locks `key`'s row in a transaction of another client's (`SELECT … FOR UPDATE`), rolled
    /// back when the returned guard is dropped.
    fn lock_row(&self, key: &str) -> impl Future<Output = RowLock> + Send;
    /// Creates the lock table as an earlier version of dlock did: without the columns that
    /// describe a holder (label, host, pid).
    fn create_old_table(&self) -> impl Future<Output = ()> + Send;
    /// Writes a live row of `key` for `owner`, held for an hour with `fence`, as an earlier
    /// version did (its columns only).
    fn insert_held_row(
        &self,
        key: &str,
        owner: &str,
        fence: u64,
    ) -> impl Future<Output = ()> + Send;
    /// Writes a live row, held by a stranger for an hour, for each of `keys`, in one statement.
    fn insert_live_rows(&self, keys: &[String]) -> impl Future<Output = ()> + Send;
    /// Moves the expiry of every released row (owned by nobody) an hour ahead of the
    /// database's clock, as a step back of that clock would.
    fn date_released_rows_ahead(&self) -> impl Future<Output = ()> + Send;
    /// A backend on this table that may not create or alter it (`create_table(false)`).
    fn backend_leaving_the_table(&self) -> impl Future<Output = Self::Backend> + Send;

    /// A locker on this table through `url`, with a pool of its own.
    fn locker_at(&self, url: &str) -> impl Future<Output = Locker> + Send {
        async move { Locker::with_backend(self.backend_at(url).await) }
    }

    /// A locker on this table with the store's test pool (four connections).
    fn locker(&self) -> impl Future<Output = Locker> + Send {
        async { Locker::with_backend(self.backend().await) }
    }
}

/// A transaction holding a row lock; dropped, it rolls back.
pub type RowLock = Box<dyn Send>;

/// A caller that does not wait gets its answer within this, whatever the row's transaction does.
const TRY_BOUND: Duration = Duration::from_secs(2);

/// How long the backend's own connections wait for another transaction's row lock.
const ROW_LOCK_PATIENCE: Duration = Duration::from_secs(2);

/// A holder of a contended key (rivals try it without waiting, again and again: each try's
/// statement locks the row for its own short run) keeps its lease: its renewals get through.
pub async fn a_contended_holder_keeps_its_lease<S: SqlStore>() {
    let db = S::fresh().await;
    let locker = db.locker().await;
    let key = unique_key("contended");
    let holder = locker
        .lock(&*key, LockOptions::new().ttl(Duration::from_secs(1)))
        .await
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut rivals = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (rival, key, stop) = (db.locker().await, key.clone(), stop.clone());
        rivals.spawn(async move {
            let mut granted = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(lease) = rival.lock(&*key, LockOptions::new()).await {
                    granted += 1;
                    lease.release().await.unwrap();
                }
            }
            granted
        });
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let held = holder.is_held();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut granted = 0;
    while let Some(rival) = rivals.join_next().await {
        granted += rival.unwrap();
    }
    assert!(held, "the holder of a contended key lost its lease");
    assert_eq!(granted, 0, "a rival got a held key");
    holder.release().await.unwrap();
}

/// A held lease whose row another transaction locks (a `SELECT … FOR UPDATE` left open in a
/// client) cannot be renewed while it is locked; the other leases of the same locker, renewed
/// in the same batch, are renewed all the same, and stay held. (PostgreSQL only: MySQL's batch
/// waits for the row, a limit its backend's documentation states.)
pub async fn a_held_row_locked_by_another_transaction_costs_the_other_leases_nothing<
    S: SqlStore,
>() {
    let db = S::fresh().await;
    let locker = db.locker().await;
    let (locked, other) = (unique_key("held-locked"), unique_key("held-free"));
    let contended = unique_key("held-contended");
    let ttl = LockOptions::new().ttl(Duration::from_secs(1));
    let stuck = locker.lock(&*locked, ttl).await.unwrap();
    let kept = locker.lock(&*other, ttl).await.unwrap();
    // A third lease of the batch whose row rivals' tries lock for a moment, again and again.
    let busy = locker.lock(&*contended, ttl).await.unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut rivals = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (rival, key, stop) = (db.locker().await, contended.clone(), stop.clone());
        rivals.spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(lease) = rival.lock(&*key, LockOptions::new()).await {
                    lease.release().await.unwrap();
                }
            }
        });
    }
    let row_lock = db.lock_row(&locked).await;
    // Past the ttl: every renewal of the batch came while the row was locked.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (held, contended_held) = (kept.is_held(), busy.is_held());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    while rivals.join_next().await.is_some() {}
    drop(row_lock);
    assert!(
        held && contended_held,
        "a lease was lost because another lease's row was locked by someone else \
         (the free key's held: {held}, the contended key's: {contended_held})"
    );
    kept.release().await.unwrap();
    busy.release().await.unwrap();
    drop(stuck);
}

/// Tries on a row another transaction locks end with the caller's wait, and never take the
/// connection renewals need: a lease on another key stays held meanwhile.
pub async fn a_row_locked_by_another_transaction_neither_holds_up_tries_nor_starves_renewals<
    S: SqlStore,
>() {
    let db = S::fresh().await;
    // Four connections (see `Store::backend`), as many as the tries below.
    let locker = db.locker().await;
    let (locked, renewed) = (unique_key("row-locked"), unique_key("renewed"));
    db.insert_expired_row(&locked).await;
    let row_lock = db.lock_row(&locked).await;

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
    drop(row_lock);
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

/// Tries stuck on a row another transaction keeps locked give their connections back after the
/// row-lock patience: they do not keep every other key from being locked for as long as that
/// transaction lasts.
pub async fn tries_stuck_on_a_locked_row_do_not_keep_other_keys_from_being_locked<S: SqlStore>() {
    let db = S::fresh().await;
    let locker = db.locker().await;
    let (locked, other) = (unique_key("row-locked-long"), unique_key("other"));
    db.insert_expired_row(&locked).await;
    let row_lock = db.lock_row(&locked).await;
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
    drop(row_lock);
    assert!(
        got.is_ok(),
        "another key could not be locked while a transaction kept a row locked: {:?}",
        got.err()
    );
    got.unwrap().release().await.unwrap();
}

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

/// A grant its caller never came back for is undone after the claim window, and the caller,
/// polled again, finds it withdrawn.
pub async fn a_grant_its_caller_never_came_back_for_is_undone_after_the_claim_window<
    S: SqlStore,
>() {
    let db = S::fresh().await;
    let (proxy, url) = FaultProxy::in_front_of(&S::url());
    let slow = db.locker_at(&url).await;
    let key = unique_key("unclaimed-grant");
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

/// A late copy of an acquire statement (re-sent after its connection broke while the first
/// copy was held up on the server) that lands between its owner's grant and the undo of that
/// grant, withdrawn unclaimed, must not move the row's fence: the undo deletes that grant only,
/// by its fence, and a row whose fence moved would stay held by nobody until its ttl. The late
/// copy is modelled by the same owner's acquire sent on another connection while the grant
/// waits to be claimed; the grant is left unclaimed by a caller parked with its answer on the
/// way (as in the scenario above).
pub async fn a_late_copy_of_an_acquire_does_not_keep_an_unclaimed_grant_from_its_undo<
    S: SqlStore,
>() {
    use dlock::Owner;

    let db = S::fresh().await;
    let (proxy, url) = FaultProxy::in_front_of(&S::url());
    let slow = db.backend_at(&url).await;
    let key = unique_key("late-copy");
    let ttl = Duration::from_secs(60);
    // Prepared on the pool's connection first, so the slowed-down statement is executed at
    // once and only its answer is late.
    let warm = Owner::random();
    let warm_up = AcquireRequest::new(&key, warm, ttl, Duration::ZERO);
    assert!(slow.acquire(&warm_up).await.unwrap().is_some());
    assert!(slow.release(&key, warm).await.unwrap());
    proxy.set_latency(Direction::ToClient, LATENCY);
    let owner = Owner::random();
    let request = AcquireRequest::new(&key, owner, ttl, Duration::from_secs(30));
    let mut parked = Box::pin(slow.acquire(&request));
    // Polled until its statement wrote the row, then parked with the answer on its way.
    tokio::select! {
        got = &mut parked => panic!("the slowed-down statement answered at once: {got:?}"),
        () = async { while db.rows(&key).await == 0 { tokio::time::sleep(Duration::from_millis(10)).await } } => {}
    }
    // The late copy: the same owner's acquire, granted again (the row is that owner's).
    let copy = db.backend().await;
    let late = AcquireRequest::new(&key, owner, ttl, Duration::ZERO);
    assert!(
        copy.acquire(&late).await.unwrap().is_some(),
        "an acquire of the row's own owner was refused"
    );
    // The parked grant is withdrawn after the claim window and undone by its fence.
    let rival = db.locker().await;
    let asked = Instant::now();
    let got = rival
        .lock(&*key, held(60).wait(Duration::from_secs(10)))
        .await;
    let waited = asked.elapsed();
    assert!(
        got.is_ok() && waited < CLAIM_WINDOW + 2 * LATENCY + SLACK,
        "the key went to the rival only after {waited:?} ({:?}): the undo of a grant nobody claimed missed the row a late copy of its statement re-granted",
        got.as_ref().err()
    );
    drop(parked);
    got.unwrap().release().await.unwrap();
}

/// An acquisition abandoned while its `INSERT` waits on another transaction leaves no row
/// behind once the `INSERT` goes through: the undo runs after the statement it undoes, so the
/// key is free at once, not after the abandoned lease's ttl.
pub async fn an_acquisition_abandoned_while_its_insert_waits_leaves_no_row<S: SqlStore>() {
    let db = S::fresh().await;
    let (abandoner, rival) = (db.locker().await, db.locker().await);
    let key = unique_key("ghost");
    let blocker = db.hold_up_inserts_of(&key).await;

    let ttl = Duration::from_secs(60);
    let abandoned = tokio::time::timeout(
        Duration::from_millis(500),
        abandoner.lock(&*key, LockOptions::new().ttl(ttl).renew(false)),
    )
    .await;
    assert!(
        abandoned.is_err(),
        "the acquisition should have waited on the other transaction"
    );
    // Time for whatever the abandoned acquisition queued to run while the insert still waits.
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(blocker);

    let started = Instant::now();
    let taken = rival
        .lock(
            &*key,
            LockOptions::new()
                .ttl(Duration::from_secs(5))
                .wait(Duration::from_secs(5)),
        )
        .await;
    assert!(
        taken.is_ok(),
        "the key stayed held by nobody after the abandoned acquisition ({:?} later, ttl {ttl:?}): {:?}",
        started.elapsed(),
        taken.err()
    );
    taken.unwrap().release().await.unwrap();
    assert_eq!(db.rows(&key).await, 0, "a row outlived every holder");
}

/// A grant whose answer was lost (its connection broke once the row was written) and whose copy
/// sent again found the row locked by another transaction past the lock timeout is undone: the
/// try reads as not granted (busy, or an error that says the grant is unknown), and the row it
/// may have written is deleted by its owner once that transaction ends, so the key is free
/// then, not after the lease's ttl. The lost answer is modelled by a proxy that delays the
/// answers and cuts the connection while the grant's answer is on its way. Here the caller does
/// not wait: its try ends before the answer that leaves the grant unknown comes.
pub async fn a_grant_whose_answer_was_lost_and_whose_retry_met_a_locked_row_is_undone<
    S: SqlStore,
>() {
    lost_grant_and_a_locked_row::<S>(
        Duration::ZERO,
        ROW_LOCK_PATIENCE + Duration::from_millis(500),
    )
    .await;
}

/// As above, by a caller that waits: it takes the answer that leaves the grant unknown, tries
/// again while the other transaction still holds the row, and its wait ends first (that try's
/// statement too gives up on the row, and writes nothing). The acquisition fails (whether the
/// key was granted is unknown), and its undo deletes the row once the transaction ends.
pub async fn a_waiting_acquisition_that_ends_after_a_lost_grant_is_undone<S: SqlStore>() {
    lost_grant_and_a_locked_row::<S>(
        Duration::from_secs(3),
        2 * ROW_LOCK_PATIENCE + Duration::from_secs(1),
    )
    .await;
}

/// A try whose connection breaks while its answer is on its way, and whose statement sent again
/// finds the key held by another, reads as busy, as any try at a held key: the statement sent
/// again would have taken a row of its own over, so there is none to undo, and the caller is
/// not told the store failed.
pub async fn a_busy_key_reads_busy_after_a_broken_connection<S: SqlStore>() {
    let db = S::fresh().await;
    let (proxy, url) = FaultProxy::in_front_of(&S::url());
    let slow = db.locker_at(&url).await;
    let key = unique_key("busy-after-a-cut");
    // Prepared on the pool's connection first, as in the scenarios above.
    slow.lock(&*key, held(60))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let holder = db.locker().await.lock(&*key, held(60)).await.unwrap();
    for wait in [Duration::ZERO, Duration::from_millis(1500)] {
        proxy.set_latency(Direction::ToClient, LATENCY);
        let sent = proxy.chunks(Direction::ToServer);
        let caller = {
            let (slow, key) = (slow.clone(), key.clone());
            tokio::spawn(async move { slow.lock(&*key, held(60).wait(wait)).await.map(|_| ()) })
        };
        // The statement has left (after the pool's check of the connection, where it makes one):
        // its answer is on its way when the connection breaks.
        let started = Instant::now();
        while proxy.chunks(Direction::ToServer) == sent || started.elapsed() < LATENCY / 2 {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "nothing was sent"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        proxy.cut_all();
        proxy.set_latency(Direction::ToClient, Duration::ZERO);
        let answered = tokio::time::timeout(Duration::from_secs(10), caller)
            .await
            .expect("the try never returned")
            .unwrap();
        assert!(
            matches!(answered, Err(LockError::Busy { .. })),
            "a try at a held key whose connection broke read as {answered:?}, not busy (wait {wait:?})"
        );
    }
    holder.release().await.unwrap();
}

/// An acquisition waiting up to `wait` whose grant's answer is lost, with the row locked by
/// another transaction from then on, for `row_locked_for`.
async fn lost_grant_and_a_locked_row<S: SqlStore>(wait: Duration, row_locked_for: Duration) {
    let db = S::fresh().await;
    let (proxy, url) = FaultProxy::in_front_of(&S::url());
    let slow = db.locker_at(&url).await;
    let key = unique_key("lost-grant");
    // Prepared on the pool's connection first, so the slowed-down statement is executed at
    // once and only its answer is late.
    slow.lock(&*key, held(60))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    proxy.set_latency(Direction::ToClient, LATENCY);
    let caller = {
        let (slow, key) = (slow.clone(), key.clone());
        tokio::spawn(async move {
            slow.lock(&*key, held(60).wait(wait))
                .await
                .map(|lease| lease.fence())
        })
    };
    // The grant is written; its answer is on its way when another client locks the row and the
    // connection breaks: the statement is sent again on a fresh connection, and waits for that
    // transaction until the lock timeout.
    let written = tokio::time::timeout(Duration::from_secs(5), async {
        while db.rows(&key).await == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(written.is_ok(), "the grant was never written");
    let row_lock = db.lock_row(&key).await;
    proxy.cut_all();
    proxy.set_latency(Direction::ToClient, Duration::ZERO);
    tokio::time::sleep(row_locked_for).await;
    drop(row_lock);
    let answered = tokio::time::timeout(TRY_BOUND, caller).await;
    assert!(
        matches!(answered, Ok(Ok(Err(_)))),
        "the try whose answer was lost should read as not granted: {answered:?}"
    );
    let rival = db.locker().await;
    let asked = Instant::now();
    let got = rival
        .lock(&*key, held(60).wait(Duration::from_secs(5)))
        .await;
    assert!(
        got.is_ok(),
        "the key stayed held by nobody {:?} after the transaction ended ({:?}): the grant whose answer was lost was never undone",
        asked.elapsed(),
        got.as_ref().err()
    );
    got.unwrap().release().await.unwrap();
    assert_eq!(db.rows(&key).await, 0, "a row outlived every holder");
}

/// An acquire statement of an owner that already holds the key never shortens its lease. Such a
/// statement is a copy that arrives late: re-sent after its connection broke while the first
/// copy was held up on the server (a stalled backend process, a wait on another transaction's
/// row), the first copy then lands after the second was granted, or after a renewal, with the
/// expiry it computed when it began. The client counts the lease from the second copy, so an
/// earlier expiry would let a rival in while the holder still runs its body. The late copy is
/// modelled here by an acquire of the same owner with a shorter ttl.
pub async fn a_late_acquire_of_the_holder_never_shortens_its_lease<S: SqlStore>() {
    use dlock::Owner;

    let store = S::fresh().await;
    let backend = store.backend().await;
    let key = unique_key("late-acquire");
    let owner = Owner::random();
    let held = AcquireRequest::new(&key, owner, Duration::from_secs(60), Duration::ZERO);
    assert!(backend.acquire(&held).await.unwrap().is_some());
    let late = AcquireRequest::new(&key, owner, Duration::from_millis(300), Duration::ZERO);
    assert!(backend.acquire(&late).await.unwrap().is_some());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rival = store.locker().await;
    let got = rival.lock(&*key, LockOptions::new()).await;
    assert!(
        got.is_err(),
        "a rival got the key 1 s into a 60 s lease: a late acquire of its holder cut it to 0.3 s"
    );
}

/// A ttl past what the database's timestamps hold is refused, and writes nothing: it must not
/// come out as an expiry in the past (MariaDB reads `+ INTERVAL 18446744073709551615 MICROSECOND`
/// as minus one microsecond, and wraps other huge intervals likewise), whose row a rival then
/// takes over, nor as an unclear error. The longest ttl taken, a century, keeps a rival out.
pub async fn a_lease_with_a_huge_ttl_keeps_rivals_out<S: SqlStore>() {
    const YEAR: u64 = 365 * 24 * 3600;
    let db = S::fresh().await;
    let (holder, rival) = (db.locker().await, db.locker().await);
    for ttl in [
        // The longest ttl the options take.
        Duration::from_millis(i64::MAX as u64),
        // Wraps, in microseconds, to half a second in the past on MariaDB.
        Duration::from_secs(18_446_744_073_709),
        // Past the year 9999 on MySQL, past 294276 on PostgreSQL.
        Duration::from_secs(10_000 * YEAR),
        Duration::from_secs(300_000 * YEAR),
        // Just past a century.
        Duration::from_secs(100 * YEAR + 1),
    ] {
        let key = unique_key("huge-ttl");
        let got = holder.lock(&*key, LockOptions::new().ttl(ttl)).await;
        assert!(
            matches!(got, Err(LockError::InvalidOptions { .. })),
            "a lease of {ttl:?} gave {:?}",
            got.as_ref().map(|lease| lease.fence())
        );
        assert_eq!(db.rows(&key).await, 0, "a refused acquisition wrote a row");
    }
    let key = unique_key("century");
    let lease = holder
        .lock(
            &*key,
            LockOptions::new().ttl(Duration::from_secs(100 * YEAR)),
        )
        .await
        .expect("a lease of a century was refused");
    let got = rival.lock(&*key, LockOptions::new()).await;
    assert!(
        matches!(got, Err(LockError::Busy { .. })),
        "a rival asked for a key held for a century, and got {:?}: two holders",
        got.as_ref().map(|lease| lease.fence())
    );
    lease.release().await.unwrap();
}

/// A renewal never moves its lease's expiry back. The watchdog sends a renewal again when the
/// first goes unanswered, so the first copy can land after a later one, held up on the server
/// (a stalled backend process, a wait on another transaction's row) with the expiry it
/// computed as it began: earlier than the one the client counts from after the later copy, so
/// a rival could take the key while the holder still runs its body. The late copy is modelled
/// here by a renewal of the holder with a shorter ttl.
pub async fn a_late_renewal_never_shortens_its_lease<S: SqlStore>() {
    use dlock::backend::{AcquireRequest, Backend, Renewal};
    use dlock::Owner;

    let store = S::fresh().await;
    let backend = store.backend().await;
    let key = unique_key("late-renewal");
    let owner = Owner::random();
    let held = AcquireRequest::new(&key, owner, Duration::from_secs(60), Duration::ZERO);
    assert!(backend.acquire(&held).await.unwrap().is_some());
    let late = Renewal::new(&key, owner, Duration::from_millis(300));
    assert_eq!(backend.renew(&[late]).await.unwrap(), [true]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rival = store.locker().await;
    let got = rival.lock(&*key, LockOptions::new()).await;
    assert!(
        got.is_err(),
        "a rival got the key 1 s into a 60 s lease: a late renewal of its holder cut it to 0.3 s"
    );
}

/// A key's next grant after a release gets a fence above every earlier grant's, even one made
/// with a later clock than the database's now: a grant whose statement read the clock and was
/// then held up while another came and went, or a server whose clock stepped back. The last
/// grant here carries a fence some seventy years ahead of the clock; a fresh row's clock floor
/// would go below it, and a fenced resource would refuse the new holder's writes.
pub async fn a_released_key_s_next_fence_is_above_its_last_whatever_the_clock<S: SqlStore>() {
    let db = S::fresh().await;
    let backend = db.backend().await;
    let locker = Locker::with_backend(backend.clone());
    // The table exists once a locker has used it.
    let other = unique_key("table");
    locker
        .lock(&*other, LockOptions::new())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let key = unique_key("fence-ahead");
    let (owner, ahead) = (dlock::Owner::random(), 4_000_000_000_000_000);
    db.insert_held_row(&key, &owner.to_string(), ahead).await;
    assert!(
        backend.release(&key, owner).await.unwrap(),
        "the release missed its row"
    );
    let lease = locker.lock(&*key, LockOptions::new()).await.unwrap();
    assert!(
        lease.fence() > ahead,
        "the grant after a release of fence {ahead} got fence {}",
        lease.fence()
    );
    lease.release().await.unwrap();
}

/// A released row is owned by nobody whatever its expiry says: after a step back of the
/// database's clock (an NTP step, a fail-over to a host whose clock is behind) its expiry lies
/// ahead of the clock again, and the key must still be free to take, and shown as free.
pub async fn a_released_row_is_free_after_a_step_back_of_the_clock<S: SqlStore>() {
    let db = S::fresh().await;
    let locker = db.locker().await;
    let key = unique_key("stepped-back");
    let released = locker.lock(&*key, LockOptions::new()).await.unwrap();
    let fence = released.fence();
    released.release().await.unwrap();
    db.date_released_rows_ahead().await;

    let state = locker.inspect(&key).await.expect("inspect failed");
    assert!(state.holders().is_empty(), "a released row shown as held");
    let listed = locker.list(&key).await.unwrap();
    assert!(
        listed.is_empty(),
        "a released row listed as held: {listed:?}"
    );
    let lease = locker.lock(&*key, LockOptions::new()).await;
    let lease = lease.expect("a released key read as busy");
    assert!(lease.fence() > fence, "the fence went back");
    lease.release().await.unwrap();
}
