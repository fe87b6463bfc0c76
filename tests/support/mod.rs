//! Test support shared by the integration tests: a store abstraction so one set of property
//! tests runs on every backend, a counting backend wrapper, and small helpers.
#![allow(dead_code)]

pub mod chaos;
pub mod etcd_server;
pub mod fault_proxy;
pub mod force;
pub mod history;
pub mod pg_server;
pub mod properties;
pub mod redis_commands;
pub mod redis_server;
pub mod sql_store;
pub mod zk_server;

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use dlock::backend::{AcquireRequest, Acquired, Backend, Renewal};
use dlock::{LockError, LockOptions, Locker, Owner};

/// A store the property tests run against.
pub trait Store: Send + Sync + 'static {
    /// The store's backend type.
    type Backend: Backend + Clone;

    /// Whether a release wakes the key's waiters at once. A store that cannot tell a waiter that
    /// a key came free (MySQL) makes it poll instead: it is held to getting a waiter in within a
    /// few seconds of the release, not within a moment.
    const WAKES_WAITERS_ON_RELEASE: bool = true;

    /// Whether waiters get a key in the order they asked for it. A store whose waiters poll
    /// (MySQL) lets whichever polls first in: it is held to letting every waiter in, each once.
    const SERVES_IN_ARRIVAL_ORDER: bool = true;

    /// A new backend handle on the same store (a separate client, as another process would have).
    fn backend(&self) -> impl Future<Output = Self::Backend> + Send;

    /// Takes `key`'s lease away from its holder from outside, as an expiry or a takeover would.
    fn take_away(&self, key: &str) -> impl Future<Output = ()> + Send;

    /// Makes `key`'s lease expire on the store now, as if its holder had died long ago.
    fn expire(&self, key: &str) -> impl Future<Output = ()> + Send;
}

/// The MariaDB/MySQL the tests use: `DLOCK_MYSQL_URL`, else the machine's server as root.
pub fn mysql_url() -> String {
    std::env::var("DLOCK_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// Drops `table` from [`mysql_url`]'s database, from any context.
pub fn drop_mysql_table(table: &str) {
    let drop_table = format!("DROP TABLE IF EXISTS `{table}`");
    on_a_runtime_of_its_own(async move {
        if let Ok(admin) = sqlx::mysql::MySqlPool::connect(&mysql_url()).await {
            let _ = sqlx::query(sqlx::AssertSqlSafe(drop_table))
                .execute(&admin)
                .await;
        }
    });
}

/// Runs `task` to its end over a runtime of its own, on a thread of its own, so it also works
/// from a `Drop` that blocks a runtime (a test's, whose connections are then stuck with it).
pub fn on_a_runtime_of_its_own(task: impl Future<Output = ()> + Send + 'static) {
    let _ = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(task);
    })
    .join();
}

/// The PostgreSQL the tests use: `DLOCK_POSTGRES_URL`, else the machine's server as `postgres`
/// (trust authentication) in the database `test`.
pub fn postgres_url() -> String {
    std::env::var("DLOCK_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// Drops `table` from [`postgres_url`]'s database, from any context.
pub fn drop_postgres_table(table: &str) {
    // The lock table and its waiters table.
    let drop_table = format!("DROP TABLE IF EXISTS \"{table}\", \"{table}_waiters\" CASCADE");
    let drop_function = format!("DROP FUNCTION IF EXISTS \"{table}_pause\"()");
    on_a_runtime_of_its_own(async move {
        if let Ok(admin) = sqlx::postgres::PgPool::connect(&postgres_url()).await {
            let _ = sqlx::query(sqlx::AssertSqlSafe(drop_table))
                .execute(&admin)
                .await;
            // The function of a test that slowed the table's deletes down, if any.
            let _ = sqlx::query(sqlx::AssertSqlSafe(drop_function))
                .execute(&admin)
                .await;
        }
    });
}

/// A port of 127.0.0.1 where a server accepts connections and never says a word: each
/// connect or request to it runs into its time-out.
pub fn black_hole() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            held.push(stream);
        }
    });
    port
}

/// A Redis backend on `url` whose grants and renewals count only once `replicas` replicas have
/// acknowledged them (`min_replicas`).
pub async fn redis_acknowledged_by(url: &str, replicas: usize) -> dlock::backend::RedisBackend {
    dlock::backend::RedisBackend::builder(url)
        .unwrap()
        .min_replicas(replicas)
        .connect()
        .await
        .unwrap()
}

/// A port of 127.0.0.1 nobody listens on now.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("cannot bind 127.0.0.1:0");
    listener.local_addr().unwrap().port()
}

/// A key no other test uses, even across processes that share a server.
pub fn unique_key(name: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    // Only characters that key escaping leaves alone, so a key renders as itself.
    format!(
        "test-{}-{}-{}-{name}",
        std::process::id(),
        Owner::random(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Takes `key` with `options` and releases it at once; returns the lease's fence. For a test that
/// needs the key to have been taken once (a warm-up, a fence to compare) and nothing held after.
pub async fn lock_and_release(locker: &Locker, key: &str, options: LockOptions) -> u64 {
    let lease = locker
        .lock(key, options)
        .await
        .unwrap_or_else(|error| panic!("locking `{key}`: {error}"));
    let fence = lease.fence();
    lease
        .release()
        .await
        .unwrap_or_else(|error| panic!("releasing `{key}`: {error}"));
    fence
}

/// Wraps a backend and counts what is asked of it.
#[derive(Clone)]
pub struct Counting<B> {
    pub inner: B,
    pub acquires: Arc<AtomicU64>,
    pub releases: Arc<AtomicU64>,
    pub renew_calls: Arc<AtomicU64>,
    pub renewed: Arc<AtomicU64>,
}

impl<B> Counting<B> {
    pub fn new(inner: B) -> Self {
        Counting {
            inner,
            acquires: Arc::default(),
            releases: Arc::default(),
            renew_calls: Arc::default(),
            renewed: Arc::default(),
        }
    }

    pub fn acquires(&self) -> u64 {
        self.acquires.load(Ordering::SeqCst)
    }
}

impl<B: Backend> Backend for Counting<B> {
    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Option<Acquired>, LockError> {
        self.acquires.fetch_add(1, Ordering::SeqCst);
        self.inner.acquire(request).await
    }

    async fn release(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        self.inner.release(key, owner).await
    }

    async fn undo_acquire(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        self.inner.undo_acquire(key, owner).await
    }

    async fn renew(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
        self.renew_calls.fetch_add(1, Ordering::SeqCst);
        self.renewed
            .fetch_add(leases.len() as u64, Ordering::SeqCst);
        self.inner.renew(leases).await
    }

    fn shares_reads(&self) -> bool {
        self.inner.shares_reads()
    }

    fn release_now(&self, key: &str, owner: Owner) -> bool {
        let done = self.inner.release_now(key, owner);
        if done {
            self.releases.fetch_add(1, Ordering::SeqCst);
        }
        done
    }
}

/// Counts how many bodies run at once, and the most ever seen.
#[derive(Default)]
pub struct Gauge {
    now: AtomicUsize,
    max: AtomicUsize,
    entered: AtomicUsize,
}

impl Gauge {
    pub fn enter(&self) {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        self.entered.fetch_add(1, Ordering::SeqCst);
    }

    pub fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }

    pub fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }

    pub fn entered(&self) -> usize {
        self.entered.load(Ordering::SeqCst)
    }
}

/// Instantiates the read-write lock's property tests (`properties/read_write.rs`) for one store
/// that takes readers, as [`lock_properties!`] does the lock's.
#[macro_export]
macro_rules! read_write_properties {
    ($store:expr) => {
        $crate::lock_properties!(@tests $store;
            readers_are_inside_together,
            a_writer_is_never_inside_beside_anyone,
            a_plain_lock_and_readers_exclude_each_other,
            a_waiting_writer_is_not_overtaken_by_later_readers,
            a_release_hands_the_key_to_the_run_of_readers_at_the_head,
            a_dead_readers_lease_runs_out_and_a_writer_gets_the_key,
            fences_increase_across_readers_and_writers,
            each_readers_lease_is_its_own,
            a_reader_or_writer_that_stops_waiting_leaves_nothing_behind,
            a_read_mode_with_permits_or_a_campaign_is_refused,
            a_nested_read_reenters_and_a_nested_write_in_a_reader_is_refused,
            a_readers_hold_keeps_writers_out_to_its_end,
        );
    };
}

/// Instantiates every property test of `properties` for one store. `$store` is an expression
/// (evaluated per test) whose value implements [`Store`]; what the store cannot promise, its
/// [`Store`] constants say, and the properties concerned test what it does promise instead.
#[macro_export]
macro_rules! lock_properties {
    ($store:expr) => {
        $crate::lock_properties!(@tests $store;
            sixty_four_callers_never_overlap,
            losers_with_no_wait_skip_the_body,
            waiters_are_woken_by_the_release,
            waiters_are_served_in_arrival_order,
            nested_call_on_the_same_key_reenters_without_acquiring,
            spawned_and_joined_calls_are_other_owners,
            panic_releases_at_once,
            dropped_caller_future_releases_at_once,
            body_longer_than_ttl_keeps_the_key,
            lease_taken_away_cancels_the_body,
            on_lost_continue_lets_the_body_finish,
            unrenewed_lease_is_lost_when_its_ttl_runs_out,
            fences_strictly_increase,
            keys_are_escaped,
            manual_lease_excludes_and_releases,
            renewals_are_batched,
            a_wait_without_end_grants_a_free_key,
            a_hold_keeps_the_key_to_its_end_and_no_longer,
            one_leader_at_a_time_and_the_next_on_resign,
            a_leader_whose_term_is_taken_away_stops_its_work,
            a_campaign_needs_renewal_and_respects_its_wait,
            three_permits_admit_three_bodies_at_once_and_no_more,
            permit_waiters_are_served_in_arrival_order,
            a_vanished_holders_permit_is_free_again_after_its_ttl,
            each_permit_is_a_lease_of_its_own_under_the_semaphores_key,
            zero_permits_and_a_campaign_with_permits_are_refused,
            a_parked_permit_waiter_holds_up_the_line_only_briefly,
            a_nested_call_of_the_other_kind_on_the_key_is_refused,
        );
    };
    (@tests $store:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let store = $store;
                support::properties::$name(&store).await;
            }
        )*
    };
}
