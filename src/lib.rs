//! # dlock — a distributed lock in one line
//!
//! Put `#[distributed_lock]` on an `async fn` and at most one caller per rendered key — across
//! every process that shares the store — runs its body at a time:
//!
//! ```
//! use dlock::{distributed_lock, LockError};
//!
//! #[derive(Debug)]
//! enum AppError { Lock(LockError) /* , Db(…) */ }
//! impl From<LockError> for AppError {
//!     fn from(error: LockError) -> Self { AppError::Lock(error) }
//! }
//!
//! #[distributed_lock(key = "acct:<open_id>", ttl = "3s")]
//! async fn submit(open_id: &str, local_id: &str) -> Result<(), AppError> {
//!     // check, then insert or update: no concurrent duplicate gets in between
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), AppError> {
//! // For a shared store: set DLOCK_URL=redis://… and call `dlock::init_from_env().await?`.
//! let locker = dlock::Locker::memory();
//! dlock::set_default_locker(locker.clone());
//! submit("oX7f", "device-1").await?;
//! locker.shutdown().await?; // last thing before exit: nothing stays held
//! # Ok(()) }
//! ```
//!
//! The attribute acquires a lease on the store before the body runs, renews it with a watchdog
//! while the body runs, lets nested calls on the same key re-enter without a round trip, stops
//! the body when the lease is lost, and releases the lease on every way out of the body.
//!
//! ## The attribute
//!
//! | argument | default | meaning |
//! | --- | --- | --- |
//! | `key = "…"` | required | literal text and placeholders `<param>` / `<param.field>` (`self` too) |
//! | `ttl = "…"` | `"30s"` | lease length: `ms`, `s`, `m`, `h`, combinable (`"1m30s"`) |
//! | `wait = "…"` | `"0s"` | how long to wait for a busy key; `"0s"` tries once |
//! | `renew = bool` | `true` | a watchdog renews the lease every ttl/3 while the body runs |
//! | `on_lost = "cancel" \| "continue"` | `"cancel"` | what happens when the lease is lost mid-body |
//! | `locker = EXPR` | the default locker | a `&Locker` (`&self.locker`, `&LOCKS` for a `static LazyLock<Locker>`) |
//! | `label = "…"` | the function's path | the holder's name for operators: the `label` of the [metrics](#metrics) |
//! | `hold_at_least = "…"` | none | the key stays held until this long after the grant, however soon the body ends, then expires by itself: a job scheduled on every replica runs once per window ([`LockOptions::hold_at_least`]) |
//! | `permits = N` | `1` | a semaphore: at most N bodies per key at once, each with its own lease, fence and renewal; waiters served first come, first served ([`LockOptions::permits`]) |
//! | `mode = "read" \| "write"` | `"write"` | a read-write lock: readers of a key run side by side, a writer (every call without `mode` too) alone; a waiting writer keeps later readers out ([`Mode`]) |
//! | `crate = "path"` | `::dlock` | where dlock is, for crates that re-export it |
//!
//! Mistakes are compile errors on the offending token: a placeholder naming no parameter (the
//! message lists those that exist), `<>`, an unclosed `<` or stray `>`, a placeholder on a
//! destructured parameter or on a value that is not `Display`, two placeholders with no separator
//! between them, a non-literal or empty key, a malformed, zero or overflowing duration, an unknown
//! or repeated argument, an empty label, a `hold_at_least` longer than the ttl of a lease with
//! `renew = false`, `permits = 0` or a `permits` that is no integer literal, a `mode` other than
//! `"read"` or `"write"`, `mode` beside `permits`, a function that is not `async`, and a return type that
//! cannot carry a lock failure.
//!
//! **Keys.** Each placeholder's value is rendered with `Display` and percent-encoded except for
//! ASCII letters, digits and `-_.@`, so `acct:<open_id>` with `open_id = "a:b"` is `acct:a%3Ab`
//! and two different arguments can never render the same key.
//!
//! **Semaphores.** `permits = N` lets up to N bodies run on a key at once, each under a lease of
//! its own (owner, fence, renewal; a holder that dies frees its permit at its ttl), and queues
//! the others first come, first served. A permit's fence rises each time that permit is granted
//! again, not across permits, so fence writes with it only where each permit guards a resource
//! of its own ([`LockOptions::permits`] says more).
//!
//! ```
//! use std::sync::LazyLock;
//! use dlock::{current_lease, distributed_lock, LockError, Locker};
//!
//! static LOCKS: LazyLock<Locker> = LazyLock::new(Locker::memory);
//!
//! // The partner's API takes at most four calls at once from all our replicas.
//! #[distributed_lock(key = "partner-api", permits = 4, wait = "10s", locker = &LOCKS)]
//! async fn call_partner(order: u64) -> Result<u64, LockError> {
//!     assert_eq!(current_lease().expect("inside a locked body").key(), "partner-api");
//!     Ok(order)
//! }
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let calls: Vec<_> = (0..10).map(|order| tokio::spawn(call_partner(order))).collect();
//! for call in calls {
//!     call.await.unwrap().unwrap(); // four at a time, the others waiting their turn
//! }
//! # }
//! ```
//!
//! **Read-write locks.** `mode = "read"` lets any number of readers of a key in at once, each
//! under a lease and fence of its own, while no writer holds it; `mode = "write"`, like every
//! call without `mode`, runs alone. Readers and writers wait in one queue, first come, first
//! served, so a writer that waits is never overtaken by readers that come after it. A read call
//! nested in a body holding the key (as reader or writer) re-enters; a write call nested in a
//! reader's body fails with [`LockError::InvalidOptions`], as an upgrade would wait for ever
//! beside another reader doing the same. The in-process store has read-write locks; on the
//! others a read call fails with [`LockError::Unsupported`] before it asks the store anything
//! ([`Mode`] says more).
//!
//! ```
//! use std::sync::LazyLock;
//! use dlock::{distributed_lock, LockError, Locker};
//!
//! static LOCKS: LazyLock<Locker> = LazyLock::new(Locker::memory);
//!
//! #[distributed_lock(key = "prices:<shop>", mode = "read", wait = "5s", locker = &LOCKS)]
//! async fn quote(shop: &str, sku: &str) -> Result<u64, LockError> {
//!     Ok(sku.len() as u64) // many quotes at once
//! }
//!
//! #[distributed_lock(key = "prices:<shop>", mode = "write", wait = "5s", locker = &LOCKS)]
//! async fn reprice(shop: &str) -> Result<(), LockError> {
//!     Ok(()) // alone: no quote runs meanwhile
//! }
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let (a, b) = tokio::join!(quote("acme", "tea"), quote("acme", "coffee"));
//! assert_eq!((a.unwrap(), b.unwrap()), (3, 6));
//! reprice("acme").await.unwrap();
//! # }
//! ```
//!
//! **Return types.** When the lock cannot be had (busy after `wait`, a store error) or is lost
//! with `on_lost = "cancel"`, the function returns early through [`FromLockError`]:
//! `Result<T, E>` with `E: From<LockError>` gives `Err(error.into())`, `Option<T>` gives `None`,
//! and `()` skips the call (a `tracing` warning says why).
//!
//! ## What each way out of the body does
//!
//! | the body… | the lease |
//! | --- | --- |
//! | returns, or leaves by `?` / `return` | released, and the release awaited, before the call returns |
//! | panics | released at once (queued without blocking) as the panic unwinds |
//! | is dropped by its caller (a time-out, `select!`) | released at once, the same way |
//! | outlives its lease (`on_lost = "cancel"`) | the body is dropped at its next await; the call returns `LockError::Lost` |
//! | outlives its lease (`on_lost = "continue"`) | the body runs on; [`current_lease()`] reports `is_held() == false` |
//!
//! A lease is never left to expire unless the process dies, or exits without
//! [`Locker::shutdown`] (a release queued by a dropped lease runs on a background thread that
//! dies with the process); then the store's ttl frees the key.
//!
//! ## Semantics
//!
//! - **Owners.** Every outermost acquisition stores a fresh 128-bit [`Owner`]; release and
//!   renewal take effect only where the stored owner matches, atomically on the store.
//! - **Re-entrancy.** A call awaited inside the body, in the same task, on the same key and
//!   locker re-enters the held lease without asking the store; only the outermost exit releases.
//!   Calls joined side by side (`tokio::join!`) or spawned are other owners, and so are tasks
//!   polled inside the body's poll (a `LocalSet` the body drives with `run_until`, a runtime of
//!   its own it drives with `block_on`): only the task that runs the body is inside it. Inside
//!   means polled inside it now. A call decides at its first poll whether it re-enters (a body
//!   on its key is being polled around that poll) or asks the store; the calls it makes later
//!   decide at theirs. So a call started outside any body and first polled inside one re-enters
//!   it, while one that already asked the store (polled once, then awaited inside a body on its
//!   key) stays a store acquisition, and waits for its own caller's key until its `wait` runs
//!   out (`LockError::Busy`). A re-entered call polled outside the body it
//!   re-entered (awaited beside it or after it, or `tokio::spawn`ed) returns `LockError::Lost`
//!   at that poll without running further, whatever its `on_lost`: it has the lease only inside
//!   that body. A re-entered call runs under the outer call's lease: the outer `ttl` and
//!   renewal hold for it, whatever its own `ttl` and `renew` say, while its own `on_lost`
//!   applies to its own body.
//! - **Siblings inside a body take turns.** Calls on the held key joined inside the body
//!   (`tokio::join!`, `join_all`, `select!`) re-enter one at a time, each waiting in process for
//!   the one before it to end, for at most its own `wait` or `ttl`, whichever is longer: after
//!   it the call returns `LockError::Busy`. The bound matters when the sibling inside is a future
//!   nobody polls until this call ends (one arm of a `select!` loop whose other arm awaits this
//!   call): no wait would ever end. A call nested inside a re-entered call re-enters at once.
//! - **Stacked attributes.** Two `#[distributed_lock]` attributes on one function take both
//!   locks, the one written lower first (it wraps the other), and release them in the opposite
//!   order; inside the body [`current_lease()`] reports the one written on top.
//! - **A body never runs on an invalid lease.** Validity is checked before the body's first poll
//!   and, with `on_lost = "cancel"`, before every later poll: a grant that reaches a stalled
//!   caller after its lease ran out, or a body whose lease ran out while its runtime was busy
//!   elsewhere, is dropped and the call returns `LockError::Lost`.
//! - **Watchdog.** One renewal driver per [`Locker`] renews every lease it holds, in batches:
//!   one store call per tick, not one timer and request per lease.
//! - **Loss.** A lease is lost when a renewal is refused, or when none was confirmed before the
//!   lease's expiry less a safety margin of ttl/10 — judged on the client's clock from the last
//!   confirmation, so it is seen even when the store is unreachable.
//! - **Fencing.** Every acquisition gets a `u64` fence greater than every earlier fence of the
//!   key ([`LeaseInfo::fence`]); pass it with the writes the lock protects so a store can reject
//!   a stale holder's write.
//! - **Waiting.** Waiters are woken by the release, first come first served, not by polling.
//!
//! ## Without the attribute
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
//! use std::time::Duration;
//! use dlock::{LockOptions, Locker};
//!
//! let locker = Locker::connect("memory://").await?;
//! let options = LockOptions::new().ttl(Duration::from_secs(3)).wait(Duration::from_millis(200));
//! let lease = locker.lock("stock:sku-1", options).await?;
//! println!("holding {} with fence {}", lease.key(), lease.fence());
//! lease.release().await?; // dropping it would release it too
//! # Ok(()) }
//! ```
//!
//! ## Leader election
//!
//! One instance of a service runs a background loop (a scheduler, an outbox relay) and another
//! takes over when it dies. [`Locker::campaign`] waits until this instance leads, and
//! [`Leadership::run`] runs the loop for as long as it does: the loop is dropped at the loss,
//! before the store lets another instance lead. [`Locker::leader`] says who leads.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
//! use std::time::Duration;
//! use dlock::{LockError, LockOptions, Locker};
//!
//! # async fn relay_outbox_batch(_fence: u64) {}
//! let locker = Locker::connect("memory://").await?;
//! let options = LockOptions::new().ttl(Duration::from_secs(10)).label("outbox-relay");
//! let leadership = locker.campaign("outbox-relay", options).await?;
//! let fence = leadership.fence(); // passed with the leader's writes
//! let relay = async {
//!     for _ in 0..3 {
//!         relay_outbox_batch(fence).await;
//!     }
//! };
//! match leadership.run(relay).await {
//!     Ok(()) => leadership.resign().await?,
//!     Err(LockError::Lost { .. }) => println!("another instance leads now"),
//!     Err(other) => return Err(other),
//! }
//! # Ok(()) }
//! ```
//!
//! ## Choosing a backend
//!
//! Each store is behind the cargo feature of the same name; `memory` and `redis` are on by
//! default. Take the store you already run, and check that its promise is the one you need:
//!
//! | | memory | Redis | MySQL / MariaDB | PostgreSQL | ZooKeeper | etcd |
//! | --- | --- | --- | --- | --- | --- | --- |
//! | URL | `memory://` | `redis://`, `rediss://`, `redis+cluster://` | `mysql://` | `postgres://`, `postgresql://` | `zk://host:port[/chroot]` | `etcd://host:port[,host:port]` |
//! | exclusion across a fail-over | one process only | no by default: a replica promoted before it saw the lock (or the last renewals) forgets it; yes with `min_replicas = N` (grants and renewals count after `WAIT N`, one more command in the same round trip) where the promoted replica is one of those counted; fences rise either way | as far as the database's replication is synchronous | as far as the database's replication is synchronous | yes: quorum writes | yes: quorum writes, linearizable reads |
//! | fencing | store counter | per-key counter, floored by the server's µs clock | `GREATEST(fence + 1, database µs clock)` | `GREATEST(fence + 1, database µs clock)` | node `czxid` | key create revision |
//! | fair (FIFO) waiting | yes | yes (queue + hand-off) | no (jittered back-off) | yes (woken by `NOTIFY`; a line in the table across processes) | yes (each waiter watches its predecessor) | yes (each waiter watches its predecessor) |
//! | expiry judged by | its own clock | the server (`PX`) | the database (`UTC_TIMESTAMP(6)`) | the database (`clock_timestamp()`) | the session | the backend's etcd lease |
//!
//! Whatever the store, the client also judges loss on its own clock (see *Loss* above), and the
//! fence lets the resource itself reject a stale holder — the only protection that survives a
//! holder paused past its lease.
//!
//! ## Choosing `ttl` and `wait`
//!
//! - `ttl` bounds how long a crashed holder blocks the key; the watchdog renews every ttl/3, so
//!   a short ttl costs more renewals, not a shorter critical section. Pick the longest outage of
//!   the holder you would rather wait out than risk overlapping: a few seconds for request
//!   handlers, longer for batch jobs.
//! - On ZooKeeper a lease lives on the client's session, and the ensemble's leader may start
//!   counting the session's timeout before the request the client counts a lease from (a
//!   follower reports its clients' activity only in its ping replies, every half tick), by up to
//!   a third of the session timeout and half a tick. So `ttl` is at most two thirds of the
//!   granted session timeout less one tick — 18 s with the default session of 30 s and
//!   ZooKeeper's default tick of 2 s — and a longer one, the default 30 s among them, is
//!   shortened to that: it costs more frequent renewals, not a shorter hold (with
//!   `renew = false` too: such a lease is confirmed at that pace until its own ttl runs out,
//!   with checks that extend nothing), and a crashed holder blocks its key for the session
//!   timeout whatever the ttl. For longer leases raise
//!   `ZookeeperBuilder::session_timeout` (within the server's `maxSessionTimeout`); on an
//!   ensemble whose `tickTime` is not 2 s, say so with `ZookeeperBuilder::tick_time`.
//! - `wait = "0s"` (the default) suits de-duplication: the loser of a race is a duplicate and is
//!   dropped. A positive `wait` suits serialisation (every caller must run, one at a time): make
//!   it longer than the queue you expect times the critical section.
//!
//! ## Re-entrancy and cancellation
//!
//! ```
//! use dlock::{distributed_lock, LockError, Locker};
//! use std::sync::LazyLock;
//!
//! static LOCKS: LazyLock<Locker> = LazyLock::new(Locker::memory);
//!
//! #[distributed_lock(key = "order:<id>", locker = &LOCKS)]
//! async fn pay(id: u64) -> Result<(), LockError> {
//!     reserve(id).await // same key, same task: re-enters, no second acquisition
//! }
//!
//! #[distributed_lock(key = "order:<id>", locker = &LOCKS)]
//! async fn reserve(id: u64) -> Result<(), LockError> {
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! pay(7).await.unwrap();
//! // Dropping the call's future — a time-out, a `select!` — releases the lease at once.
//! let _ = tokio::time::timeout(std::time::Duration::from_millis(1), pay(8)).await;
//! # }
//! ```
//!
//! With `on_lost = "cancel"` (the default) a body whose lease is lost is dropped at its next
//! `.await`, as if its caller had dropped it, so write bodies whose awaits are safe places to
//! stop — the same rule as any cancellable async code. Work that must not be interrupted halfway
//! belongs in one database transaction, or under `on_lost = "continue"` with a check of
//! [`current_lease()`] before it commits.
//!
//! ## Fencing
//!
//! A lease can end while its holder is paused (a GC pause, a stalled VM): it wakes up believing it
//! still holds the key. Pass the fence with every write the lock protects and let the resource
//! refuse a write older than the newest it has seen:
//!
//! ```
//! # use dlock::{distributed_lock, current_lease, LockError};
//! # struct Db;
//! # impl Db { async fn execute(&self, _sql: &str, _args: (u64, u64, &str)) -> Result<u64, LockError> { Ok(1) } }
//! # #[derive(Debug)] enum AppError { Lock(LockError), Stale }
//! # impl From<LockError> for AppError { fn from(e: LockError) -> Self { AppError::Lock(e) } }
//! #[distributed_lock(key = "stock:<sku>", ttl = "5s")]
//! async fn set_stock(db: &Db, sku: &str, units: u64) -> Result<(), AppError> {
//!     let fence = current_lease().expect("inside a locked body").fence();
//!     let updated = db
//!         .execute(
//!             "UPDATE stock SET units = ?, fence = ? WHERE sku = ? AND fence < ?",
//!             (units, fence, sku),
//!         )
//!         .await?;
//!     if updated == 0 {
//!         return Err(AppError::Stale); // a newer holder has written since: this holder lost
//!     }
//!     Ok(())
//! }
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! # dlock::set_default_locker(dlock::Locker::memory());
//! # set_stock(&Db, "sku-1", 3).await.unwrap();
//! # }
//! ```
//!
//! ## Lockers
//!
//! A [`Locker`] is a handle to one store. Get one from a URL with [`Locker::connect`] (or
//! [`Locker::from_env`], which reads the URL from `DLOCK_URL`), or build a backend with its
//! options — `RedisBackend::builder(url)?`, `MysqlBackend::builder(url)?`,
//! `PostgresBackend::builder(url)?`, `ZookeeperBackend::builder(url)?`, each giving a builder that ends in `connect().await` —
//! and hand it to [`Locker::with_backend`], which takes any [`backend::Backend`].
//!
//! Without a `locker = …` argument the attribute uses the default locker: the one given to
//! [`set_default_locker`] or [`init_from_env`], else one built on first use from `DLOCK_URL`,
//! else it fails with [`LockError::NoLocker`]. The two ways from `DLOCK_URL` share one locker:
//! calls made before [`init_from_env`] and after it exclude each other. A service calls [`init_from_env`] at start-up, so
//! a missing URL or an unreachable store fails its boot rather than its first request, and
//! [`Locker::shutdown`] last:
//!
//! ```
//! use dlock::distributed_lock;
//!
//! #[distributed_lock(key = "invoice:<id>", ttl = "10s")]
//! async fn send_invoice(id: u64) -> Result<(), dlock::LockError> {
//!     Ok(())
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), dlock::LockError> {
//! #   std::env::set_var("DLOCK_URL", "memory://");
//!     let locker = dlock::init_from_env().await?; // DLOCK_URL=redis://127.0.0.1:6379, say
//!     send_invoice(7).await?;
//!     // … after the service's own graceful shutdown has returned:
//!     locker.shutdown().await?;
//!     Ok(())
//! }
//! ```
//!
//! ## Observability
//!
//! `tracing` events at `debug` for acquire (with the time waited and the fence) and release, at
//! `trace` for re-entry and renewal, and at `warn` for a lost lease, a failed renewal, a failed
//! release and a call skipped for want of its lock.
//!
//! ## Metrics
//!
//! Through the [`metrics`](https://docs.rs/metrics) crate's facade: whatever recorder the
//! program installs (an exporter such as `metrics-exporter-prometheus`) gets them. With none
//! installed nothing is recorded, and a call pays one look at the facade's recorder per metric
//! site: no clock read, allocation or lock (docs/benchmarks.md has the figures).
//!
//! | name | kind | labels | what |
//! | --- | --- | --- | --- |
//! | `dlock_acquire_wait_seconds` | histogram | `label`, `store`, `outcome` | time from the call to the store's answer, for acquisitions that were granted (`outcome="granted"`) and for those that found the key busy for their whole wait (`outcome="busy"`); not for those that failed (a store error, a shutdown, an invalid key) |
//! | `dlock_hold_seconds` | histogram | `label`, `store` | time from the grant to the end of the lease: its release, or its loss, whichever comes first |
//! | `dlock_busy_total` | counter | `label`, `store` | acquisitions that found the key busy for their whole wait ([`LockError::Busy`]) |
//! | `dlock_lost_total` | counter | `label`, `store` | leases lost while held: a renewal refused, or none confirmed in time (a lease given up by a shutdown is not counted) |
//! | `dlock_renewal_failures_total` | counter | `label`, `store` | renewals of one lease the store did not answer (an error, a time-out); each is tried again until the lease is renewed or lost; a refusal counts as a loss instead |
//! | `dlock_reentries_total` | counter | `label`, `store` | calls that re-entered a lease their task already holds, without asking the store |
//! | `dlock_leases_held` | gauge | `label`, `store` | leases held now: up at each grant, down at its release or loss |
//!
//! `label` names the holder: the attribute's `label = "…"`, by default the function's path,
//! `concat!(module_path!(), "::", "fn_name")` (a method's type is not part of it: the attribute
//! sees the method, not its `impl`); for [`Locker::lock`], [`LockOptions::label`], by default
//! `"unlabelled"`. Labels are `&'static str`s written into the program, so naming costs a call
//! nothing. `store` is `memory`, `redis`, `mysql`, `postgres`, `zookeeper`, `etcd`, or `custom` for a
//! [`Backend`](backend::Backend) of your own. The key is never a label: keys are as many as the
//! resources locked, and each label value is a series of its own.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
//! use dlock::{distributed_lock, LockError, Locker};
//! use metrics_util::debugging::{DebugValue, DebuggingRecorder};
//!
//! #[distributed_lock(key = "report:<month>", label = "reports::monthly")]
//! async fn monthly_report(month: &str) -> Result<(), LockError> {
//!     Ok(())
//! }
//!
//! let recorder = DebuggingRecorder::new();
//! let snapshotter = recorder.snapshotter();
//! recorder.install().expect("the program's one recorder");
//! dlock::set_default_locker(Locker::memory());
//! monthly_report("2026-12").await?;
//!
//! let holds = snapshotter.snapshot().into_vec().into_iter().find_map(|(key, .., value)| {
//!     let key = key.key();
//!     let ours = key.labels().any(|l| l.key() == "label" && l.value() == "reports::monthly");
//!     match value {
//!         DebugValue::Histogram(holds) if ours && key.name() == "dlock_hold_seconds" => Some(holds),
//!         _ => None,
//!     }
//! });
//! assert_eq!(holds.map(|holds| holds.len()), Some(1));
//! # Ok(()) }
//! ```
//!
//! A recorder is found as the facade finds one, at each call: the one installed for the thread
//! (`metrics::with_local_recorder`), else the global one. A lease's end and its renewals are
//! often recorded on dlock's background threads, where only a global recorder is seen: install
//! a global one. dlock tells a recorder from none by its size: the facade's no-op recorder,
//! used when none is installed, has none, and every recorder that records keeps some state; a
//! zero-sized recorder of your own would be taken for none (give it a field).
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

pub use dlock_macros::distributed_lock;
pub use dlock_runtime::*;

// The README's examples, compiled and run by `cargo test --doc`, so the first code a user reads
// always builds. Only under `cfg(doctest)`: it adds nothing to the library or its docs.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

// The operators' page's examples, for the same reason.
#[cfg(doctest)]
#[doc = include_str!("../docs/operating.md")]
struct OperatingDoctests;
