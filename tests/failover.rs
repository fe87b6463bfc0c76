//! A Redis primary with a replica, failing over the way a service sees it: the replication link
//! is cut (a partition), the primary dies, the replica is promoted and the service's address
//! moves to it, while the holder's process stays on the old primary's side of the partition
//! (it can reach the old primary, not the new one, until the partition heals). What the docs
//! promise: fences keep rising whatever the new primary forgot; leases
//! may not survive — unless `min_replicas` makes a grant and each renewal count only once a
//! replica acknowledged it, which closes the overlap.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock::backend::{AcquireRequest, Backend, Renewal};
use dlock::{current_lease, distributed_lock, LockError, LockOptions, Locker, Owner};
use support::fault_proxy::{Direction, FaultProxy};
use support::redis_commands::{self, commands, commands_between};
use support::redis_server::RedisServer;
use support::{lock_and_release, unique_key, Gauge};

/// A primary, a replica that follows it through `link` (so the link can be cut), the addresses
/// clients use, which follow whichever of the two is the primary, and a spare server that
/// becomes the new primary's replica after a fail-over.
struct ReplicatedRedis {
    primary: RedisServer,
    replica: RedisServer,
    spare: RedisServer,
    link: FaultProxy,
    /// The address the holder's process uses: on the old primary's side of the partition.
    holder_front: FaultProxy,
    /// The address every other process uses.
    front: FaultProxy,
}

impl ReplicatedRedis {
    async fn start() -> ReplicatedRedis {
        let primary = RedisServer::start();
        let replica = RedisServer::start();
        let spare = RedisServer::start();
        let link = FaultProxy::start(&format!("127.0.0.1:{}", primary.port()));
        let front = FaultProxy::start(&format!("127.0.0.1:{}", primary.port()));
        let holder_front = FaultProxy::start(&format!("127.0.0.1:{}", primary.port()));
        sync_at_once(&primary).await;
        follow(&replica, link.port()).await;
        ReplicatedRedis {
            primary,
            replica,
            spare,
            link,
            holder_front,
            front,
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.front.port())
    }

    fn holder_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.holder_front.port())
    }

    /// Kills the primary, promotes the replica and moves the service's address to it; the
    /// clients' open connections are cut, as the old primary's death would. The holder's side
    /// of the partition cannot reach the new primary yet.
    async fn fail_over(&mut self) {
        self.primary.stop();
        let mut admin = connect(&self.replica).await;
        let _: () = redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query_async(&mut admin)
            .await
            .unwrap();
        let new_primary = format!("127.0.0.1:{}", self.replica.port());
        self.holder_front.refuse_connections(true);
        self.holder_front.retarget(&new_primary);
        self.holder_front.cut_all();
        self.front.retarget(&new_primary);
        self.front.cut_all();
    }

    /// As a managed fail-over does, gives the new primary a replica of its own.
    async fn attach_new_replica(&self) {
        sync_at_once(&self.replica).await;
        follow(&self.spare, self.replica.port()).await;
    }

    /// Ends the partition: the holder's side reaches the new primary.
    fn heal(&self) {
        self.holder_front.refuse_connections(false);
    }
}

/// Lets a replica's full sync with `primary` start at once (Redis waits 5 s by default, for
/// other replicas to share the transfer).
async fn sync_at_once(primary: &RedisServer) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("repl-diskless-sync-delay")
        .arg(0)
        .query_async(&mut connect(primary).await)
        .await
        .unwrap();
}

/// Makes `replica` follow the server on `port`, and waits until it has the primary's data.
async fn follow(replica: &RedisServer, port: u16) {
    let mut admin = connect(replica).await;
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(port)
        .query_async(&mut admin)
        .await
        .unwrap();
    let started = Instant::now();
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut admin)
            .await
            .unwrap();
        if info.contains("master_link_status:up") {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{info}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn connect(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// When each body ran, by fence.
#[derive(Default)]
struct Record {
    stays: Mutex<Vec<Stay>>,
}

struct Stay {
    fence: u64,
    entered: Instant,
    left: Option<Instant>,
}

impl Record {
    fn enter(&self, fence: u64) {
        self.stays.lock().unwrap().push(Stay {
            fence,
            entered: Instant::now(),
            left: None,
        });
    }

    fn leave(&self, fence: u64) {
        let mut stays = self.stays.lock().unwrap();
        let stay = stays.iter_mut().find(|stay| stay.fence == fence).unwrap();
        stay.left = Some(Instant::now());
    }

    /// How long the two bodies ran at once (zero where they never did), and their fences.
    fn overlap(&self) -> (Duration, Vec<u64>) {
        let stays = self.stays.lock().unwrap();
        let [first, second] = &stays[..] else {
            panic!("expected two bodies, saw {}", stays.len());
        };
        let first_left = first.left.expect("the first body ended");
        (
            first_left.saturating_duration_since(second.entered),
            vec![first.fence, second.fence],
        )
    }
}

/// Stays inside until its lease is lost (`on_lost = "cancel"` drops it) or `for_at_most` ends.
#[distributed_lock(key = "<key>", ttl = "2s", wait = "10s", locker = locker)]
async fn hold(
    locker: &Locker,
    key: &str,
    gauge: &Gauge,
    record: &Record,
    fences: &AtomicU64,
    for_at_most: Duration,
) -> Result<(), LockError> {
    let fence = current_lease().unwrap().fence();
    assert!(
        fences.fetch_max(fence, Ordering::SeqCst) < fence,
        "fence {fence} did not rise"
    );
    gauge.enter();
    record.enter(fence);
    let _leave = scopeguard(move || {
        gauge.leave();
        record.leave(fence);
    });
    tokio::time::sleep(for_at_most).await;
    Ok(())
}

/// Runs `leave` when the body ends, whichever way (a cancelled body is dropped).
fn scopeguard(leave: impl FnOnce()) -> impl Drop {
    struct Leave<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Leave<F> {
        fn drop(&mut self) {
            if let Some(leave) = self.0.take() {
                leave();
            }
        }
    }
    Leave(Some(leave))
}

/// What one fail-over did to a holder and the next caller.
struct Outcome {
    overlapped: bool,
    /// How long the two bodies ran at once.
    overlap: Duration,
    /// The holder's fence and the next caller's.
    fences: Vec<u64>,
    holder: Result<(), LockError>,
}

/// A holder enters; the replication link is cut, and the holder's process stays on the old
/// primary's side of the partition; 2.5 s later (past the ttl, so the replica's copy of the lease
/// has run out) the primary dies and the replica takes over; a second caller then asks for the
/// key on the new primary, while the new primary is given a replica of its own.
async fn fail_over_under_a_holder(min_replicas: usize) -> Outcome {
    let mut redis = ReplicatedRedis::start().await;
    let locker = |url: String| async move {
        Locker::with_backend(support::redis_acknowledged_by(&url, min_replicas).await)
    };
    let (holder_locker, next_locker) =
        (locker(redis.holder_url()).await, locker(redis.url()).await);
    let key = unique_key("failover");
    let gauge = Arc::new(Gauge::default());
    let record = Arc::new(Record::default());
    let fences = Arc::new(AtomicU64::new(0));

    let holder = {
        let (key, gauge, record, fences) =
            (key.clone(), gauge.clone(), record.clone(), fences.clone());
        tokio::spawn(async move {
            hold(
                &holder_locker,
                &key,
                &gauge,
                &record,
                &fences,
                Duration::from_secs(8),
            )
            .await
        })
    };
    while gauge.entered() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.link.stall(Direction::Both);
    let cut_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    redis.fail_over().await;
    let failed_over_at = Instant::now();

    let (next, ()) = tokio::join!(
        hold(
            &next_locker,
            &key,
            &gauge,
            &record,
            &fences,
            Duration::from_millis(300)
        ),
        redis.attach_new_replica(),
    );
    assert!(next.is_ok(), "the caller after the fail-over: {next:?}");
    redis.heal();
    let holder = holder.await.unwrap();
    let (overlap, fences) = record.overlap();
    {
        let stays = record.stays.lock().unwrap();
        let origin = stays[0].entered;
        let at = |instant: Instant| instant.saturating_duration_since(origin);
        eprintln!(
            "cut at {:?}, fail-over at {:?}; bodies (entered, left): {:?}",
            at(cut_at),
            at(failed_over_at),
            stays
                .iter()
                .map(|stay| (at(stay.entered), stay.left.map(at)))
                .collect::<Vec<_>>()
        );
    }
    Outcome {
        overlapped: gauge.max() > 1,
        overlap,
        fences,
        holder,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_min_replicas_a_failover_that_forgot_the_lease_lets_a_second_holder_in() {
    let outcome = fail_over_under_a_holder(0).await;
    eprintln!(
        "overlap {:?}, fences {:?}, holder {:?}",
        outcome.overlap, outcome.fences, outcome.holder
    );
    // What the docs warn of: the new primary never heard of the renewals made after the
    // partition, so it let the second caller in while the first still held the lease by every
    // confirmation it had received (the old primary's, until it died). Once the partition
    // heals, the holder's next renewal, refused, stops it (or its own deadline would, a ttl
    // less the margin after the old primary's last confirmation); the fences still rose.
    assert!(outcome.overlapped, "expected the documented overlap");
    assert!(!outcome.overlap.is_zero());
    assert!(
        matches!(outcome.holder, Err(LockError::Lost { .. })),
        "{:?}",
        outcome.holder
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_min_replicas_a_holder_cut_off_from_its_replica_stops_before_the_failover() {
    let outcome = fail_over_under_a_holder(1).await;
    eprintln!(
        "overlap {:?}, fences {:?}, holder {:?}",
        outcome.overlap, outcome.fences, outcome.holder
    );
    // Renewals no replica acknowledged do not count: the holder lost its lease by its own
    // deadline, before the replica's copy ran out, so the two never overlapped.
    assert!(!outcome.overlapped, "two holders after the fail-over");
    assert!(outcome.overlap.is_zero(), "{:?}", outcome.overlap);
    assert!(
        matches!(outcome.holder, Err(LockError::Lost { .. })),
        "{:?}",
        outcome.holder
    );
}

/// Every command `server` ran so far, by name.
async fn command_counts(server: &RedisServer) -> BTreeMap<String, u64> {
    redis_commands::command_counts(&mut connect(server).await).await
}

/// What `min_replicas` costs the server: one `WAIT` after each acquire call and one after each
/// renewal pipeline, and nothing else (the release waits for nobody).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_adds_one_wait_to_an_acquire_and_to_a_renewal_and_nothing_else() {
    let redis = ReplicatedRedis::start().await;
    let backend = support::redis_acknowledged_by(&redis.url(), 1).await;
    let locker = Locker::with_backend(backend.clone());
    // The first pair teaches the server the scripts.
    lock_and_release(&locker, "warm-up", LockOptions::new()).await;
    let owner = Owner::random();
    let renewal = [Renewal::new("warm-up", owner, Duration::from_secs(30))];
    backend.renew(&renewal).await.unwrap();
    for round in 0..3 {
        let key = unique_key("commands");
        let before = command_counts(&redis.primary).await;
        lock_and_release(&locker, &key, LockOptions::new()).await;
        let ran = commands_between(&before, &command_counts(&redis.primary).await);
        // An uncontended release deletes a lock nobody queued for without looking at the queue.
        let expected = commands(&[
            ("del", 1),
            ("evalsha", 2),
            ("exists", 1),
            ("get", 1),
            ("set", 2),
            ("time", 1),
            ("wait", 1),
        ]);
        assert_eq!(ran, expected, "acquire and release, round {round}");

        let granted = backend
            .acquire(&AcquireRequest::new(
                &key,
                owner,
                Duration::from_secs(30),
                Duration::ZERO,
            ))
            .await
            .unwrap();
        assert!(granted.is_some());
        let before = command_counts(&redis.primary).await;
        let renewal = [Renewal::new(&key, owner, Duration::from_secs(30))];
        assert_eq!(backend.renew(&renewal).await.unwrap(), vec![true]);
        let ran = commands_between(&before, &command_counts(&redis.primary).await);
        assert_eq!(
            ran,
            commands(&[("evalsha", 1), ("get", 1), ("pexpire", 1), ("wait", 1)]),
            "renewal, round {round}"
        );
        assert!(backend.release(&key, owner).await.unwrap());
    }
}

/// A grant no replica acknowledged does not count: a caller that may not wait gets an error
/// naming `min_replicas`, and the key is free again on the primary at once; a caller that may
/// wait is granted the key once the replica catches up within its wait, and not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_no_replica_acknowledged_is_undone_or_asked_again_within_the_wait() {
    let redis = ReplicatedRedis::start().await;
    let backend = support::redis_acknowledged_by(&redis.url(), 1).await;
    let locker = Locker::with_backend(backend.clone());
    redis.link.stall(Direction::Both);
    let key = unique_key("unacknowledged");
    let ttl = Duration::from_secs(2);

    let started = Instant::now();
    let error = locker
        .lock(&*key, LockOptions::new().ttl(ttl))
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, LockError::Backend(_)), "{error:?}");
    assert!(
        message.contains("min_replicas") && message.contains("0 of the 1"),
        "{message}"
    );
    // WAIT gave up after ttl/12.
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    let holder: Option<String> = redis::cmd("GET")
        .arg(backend.lock_key(&key))
        .query_async(&mut connect(&redis.primary).await)
        .await
        .unwrap();
    assert_eq!(holder, None, "the grant was not undone");

    let waiter = {
        let (locker, key) = (locker.clone(), key.clone());
        tokio::spawn(async move {
            let options = LockOptions::new().ttl(ttl).wait(Duration::from_secs(10));
            locker.lock(&*key, options).await
        })
    };
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        !waiter.is_finished(),
        "granted with no replica acknowledging"
    );
    redis.link.resume(Direction::Both);
    let lease = waiter.await.unwrap().unwrap();
    assert!(lease.is_held());
    lease.release().await.unwrap();
}

/// Holds every client's commands on `server` for `period` (`CLIENT PAUSE`), so that commands
/// sent meanwhile run back to back once it ends, in the order they came.
async fn pause_clients(server: &RedisServer, period: Duration) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(period.as_millis() as u64)
        .query_async(&mut connect(server).await)
        .await
        .unwrap();
}

/// A waiter's claim of a lock handed to it counts only once a replica acknowledged the grant,
/// even where the claim changes nothing on the primary: a grant for the whole ttl (a ttl within
/// the liveness window) claimed in the millisecond it was made finds the lock's expiry where
/// the claim would set it (Redis 7.2 freezes a script's clock at its start). The grant was
/// written by the releaser's call, on a connection of its own, which nobody `WAIT`ed for; from
/// Redis 7.2, `WAIT` counts the writes of its own connection alone, so a claim that wrote
/// nothing would confirm a lock the replica never saw (a fail-over to it would lose the lock).
/// The server holds its clients' commands while the release and the waiter's next poll (which
/// claims the lock) reach it, so both run in the same millisecond. (Redis 7.0's `WAIT` counts
/// every write made before the connection's last command, the grant among them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_counts_only_once_a_replica_acknowledged_the_grant() {
    let redis = ReplicatedRedis::start().await;
    let waiter_backend = support::redis_acknowledged_by(&redis.url(), 1).await;
    let waiter_locker = Locker::with_backend(waiter_backend.clone());
    // The holder is another process: its release goes out on a connection of its own.
    let holder_locker = Locker::with_backend(support::redis_acknowledged_by(&redis.url(), 0).await);
    let mut admin = connect(&redis.primary).await;
    // Within the default liveness window (3 s): the hand-off grants the whole ttl.
    let ttl = Duration::from_secs(2);
    for round in 0..3 {
        let key = unique_key("claim-acknowledged");
        let lease = holder_locker
            .lock(&*key, LockOptions::new().ttl(ttl))
            .await
            .unwrap();
        let waiter = {
            let (locker, key) = (waiter_locker.clone(), key.clone());
            tokio::spawn(async move {
                let options = LockOptions::new().ttl(ttl).wait(Duration::from_secs(20));
                locker.lock(&*key, options).await
            })
        };
        let queue = waiter_backend.queue_key(&key);
        let started = Instant::now();
        loop {
            let queued: u64 = redis::cmd("LLEN")
                .arg(&queue)
                .query_async(&mut admin)
                .await
                .unwrap();
            if queued == 1 {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(5), "never queued");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The queue call's own WAIT saw the replica acknowledge it.
        tokio::time::sleep(Duration::from_millis(50)).await;
        redis.link.stall(Direction::Both);
        // Longer than the waiter's polls are apart (a third of the claim window at most).
        pause_clients(&redis.primary, Duration::from_millis(900)).await;
        // Answered once the pause ends.
        lease.release().await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !waiter.is_finished(),
            "round {round}: the waiter's claim was confirmed with the replication link cut: {:?}",
            waiter.await.unwrap().map(|lease| lease.fence())
        );
        redis.link.resume(Direction::Both);
        let lease = waiter.await.unwrap().unwrap();
        assert!(lease.is_held());
        lease.release().await.unwrap();
    }
}
