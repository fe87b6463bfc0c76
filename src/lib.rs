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
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! dlock::set_default_locker(dlock::Locker::memory()); // or DLOCK_URL=redis://…
//! submit("oX7f", "device-1").await.unwrap();
//! # }
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
//! | `crate = "path"` | `::dlock` | where dlock is, for crates that re-export it |
//!
//! Mistakes are compile errors on the offending token: a placeholder naming no parameter (the
//! message lists those that exist), `<>`, an unclosed `<` or stray `>`, a placeholder on a
//! destructured parameter or on a value that is not `Display`, two placeholders with no separator
//! between them, a non-literal or empty key, a malformed, zero or overflowing duration, an unknown
//! or repeated argument, a function that is not `async`, and a return type that cannot carry a
//! lock failure.
//!
//! **Keys.** Each placeholder's value is rendered with `Display` and percent-encoded except for
//! ASCII letters, digits and `-_.@`, so `acct:<open_id>` with `open_id = "a:b"` is `acct:a%3Ab`
//! and two different arguments can never render the same key.
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
//! A lease is never left to expire unless the process itself dies; then the store's ttl frees
//! the key.
//!
//! ## Semantics
//!
//! - **Owners.** Every outermost acquisition stores a fresh 128-bit [`Owner`]; release and
//!   renewal take effect only where the stored owner matches, atomically on the store.
//! - **Re-entrancy.** A call awaited inside the body, in the same task, on the same key and
//!   locker re-enters the held lease without asking the store; only the outermost exit releases.
//!   Calls joined side by side (`tokio::join!`) or spawned are other owners.
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
//! ## Backends
//!
//! Each behind the cargo feature of the same name; `memory` is on by default.
//!
//! - `memory` ([`backend::MemoryBackend`]) — in-process, with the same semantics: expiry by its
//!   own clock, fences, first-come first-served hand-off. The embedded default of examples and
//!   single-process programs, and the store for tests.
//!
//! A `Locker` comes from [`Locker::connect`] with a URL, or [`Locker::with_backend`] with any
//! [`backend::Backend`]. Without a `locker = …` argument the attribute uses the locker given to
//! [`set_default_locker`], else one built once from the `DLOCK_URL` environment variable, else it
//! fails with [`LockError::NoLocker`].
//!
//! ## Observability
//!
//! `tracing` events at `debug` for acquire (with the time waited and the fence) and release, at
//! `trace` for re-entry and renewal, and at `warn` for a lost lease, a failed renewal, a failed
//! release and a call skipped for want of its lock.
#![warn(missing_docs)]

pub use dlock_macros::distributed_lock;
pub use dlock_runtime::*;
