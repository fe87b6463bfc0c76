//! The `#[distributed_lock]` attribute of [dlock](https://docs.rs/dlock).
//!
//! This crate only parses and expands; everything the expansion does at run time lives in
//! `dlock-runtime`. Depend on `dlock`, which re-exports the attribute, rather than on this crate.
//!
//! The work is split the way the parts are read: [`attr`](self) parses the argument list,
//! `duration` and `template` check the two little languages inside it, and `expand` writes the
//! function back with its body handed to one runtime call. All of it works on `proc_macro2` so
//! that it is unit-tested without a compiler.
#![forbid(unsafe_code)]

mod attr;
mod boxed_future;
mod duration;
mod expand;
mod key;
mod returns;
mod spec;
mod template;

use proc_macro::TokenStream;

/// Serialises calls of an `async fn` per rendered key with a lease on a distributed store: at
/// most one caller per key, in every process that shares the store, runs the body at a time.
///
/// ```
/// use dlock::{distributed_lock, LockError};
///
/// #[distributed_lock(key = "acct:<open_id>", ttl = "3s")]
/// async fn submit(open_id: &str, local_id: &str) -> Result<(), LockError> {
///     // check, then insert or update: no concurrent duplicate gets in between
///     Ok(())
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// # dlock::set_default_locker(dlock::Locker::memory());
/// # submit("oX7f", "device-1").await.unwrap();
/// # }
/// ```
///
/// # Arguments
///
/// | argument | default | meaning |
/// | --- | --- | --- |
/// | `key = "…"` | required | literal text and placeholders `<param>` or `<param.field.field>` (`self` included) |
/// | `ttl = "…"` or `ttl = PATH` | `"30s"` | lease length, from 1 ms to `i64::MAX` ms: an integer and a unit (`ms`, `s`, `m`, `h`), combinable (`"1m30s"`), or the path of a `std::time::Duration` constant |
/// | `wait = "…"` or `wait = PATH` | `"0s"` | how long to wait for a busy key; `"0s"` tries once |
/// | `renew = bool` | `true` | a watchdog renews the lease every ttl/3 while the body runs |
/// | `on_lost = "…"` | `"cancel"` | `"cancel"`: the body is dropped at its next await and the call returns `LockError::Lost`; `"continue"`: the body runs on and `current_lease().is_held()` says the lease is gone |
/// | `locker = EXPR` | the default locker | a `&Locker` evaluated at each call (deref coercion applies): `&LOCKS` for a `static LOCKS: LazyLock<Locker>`, `&self.locker`, a parameter |
/// | `label = "…"` | the function's path | the holder's name shown to operators: the `label` of dlock's metrics; a non-empty string literal |
/// | `permits = N` | `1` | a semaphore: at most N bodies per key at once, each with a lease of its own; an integer literal from 1 to 1024 (see `LockOptions::permits`) |
/// | `mode = "read" \| "write"` | `"write"` | a read-write lock: readers of a key run side by side, a writer (and every call without `mode`) alone; a waiting writer keeps later readers out. In-process store only for now (see `dlock::Mode`) |
/// | `crate = "path"` | `::dlock` | where dlock is, for crates that re-export it |
///
/// The default label is `concat!(module_path!(), "::", "fn_name")`, e.g. `billing::submit`. A
/// method's type is not part of it (the attribute sees the method, not the `impl` around it):
/// two methods of one name in one module share a label unless one is given.
///
/// A literal duration is checked when the attribute expands; a constant is read at compile time
/// (`const LOCK_TTL: Duration = Duration::from_secs(3);`, `Self::TTL`, `config::LOCK_WAIT`),
/// and a path that is no `Duration` constant is a type error on the path. A ttl constant out of
/// the bounds every call checks (shorter than 1 ms, or longer than `i64::MAX` ms) is an error on
/// its path: as soon as the crate is checked for a constant named on its own or through a module
/// (`LOCK_TTL`, `config::LOCK_TTL`), and once the function is compiled for a caller for one
/// through a type (`Self::TTL`, `Jobs::TTL`), which may be a generic parameter of the `impl`.
///
/// ```
/// use std::time::Duration;
/// use dlock::{distributed_lock, LockError};
///
/// const LOCK_TTL: Duration = Duration::from_secs(3);
///
/// #[distributed_lock(key = "acct:<open_id>", ttl = LOCK_TTL, wait = "200ms")]
/// async fn submit(open_id: &str) -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// # Keys
///
/// Each placeholder's value is rendered through `Display` and percent-encoded except ASCII
/// letters, digits and `-_.@`, so two different argument tuples never render the same key:
/// `acct:<open_id>` with `open_id = "a:b"` is `acct:a%3Ab`.
///
/// # When the lock cannot be had
///
/// Busy after `wait`, a store error, or a lease lost under `on_lost = "cancel"`: the function
/// returns early without running (the rest of) its body, through `dlock::FromLockError`:
/// `Err(LockError.into())` for `Result<T, E>` where `E: From<LockError>`, `None` for
/// `Option<T>`, and nothing for `()` (a `tracing` warning names the function and says why).
/// Behind `-> impl Trait`, the type the body returns must be one of these: write
/// `Result<impl Trait, E>` (an axum handler: `Result<impl IntoResponse, AppError>`).
///
/// # Methods of `#[async_trait]` traits
///
/// Write the attribute on the method, inside the `#[async_trait]` impl (or on a default method
/// of the `#[async_trait]` trait). `#[async_trait]` expands first and turns the method into one
/// that returns a boxed future; the attribute locks that future, so the method keeps working
/// through `dyn Trait`:
///
/// ```
/// use async_trait::async_trait;
/// use dlock::{distributed_lock, LockError};
///
/// #[async_trait]
/// trait Accounts: Send + Sync {
///     async fn submit(&self, open_id: &str) -> Result<(), LockError>;
/// }
///
/// struct Service;
///
/// #[async_trait]
/// impl Accounts for Service {
///     #[distributed_lock(key = "acct:<open_id>", ttl = "3s")]
///     async fn submit(&self, open_id: &str) -> Result<(), LockError> {
///         Ok(())
///     }
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// # dlock::set_default_locker(dlock::Locker::memory());
/// let accounts: Box<dyn Accounts> = Box::new(Service);
/// accounts.submit("oX7f").await?;
/// # Ok(())
/// # }
/// ```
///
/// A function written by hand in the shape `#[async_trait]` gives its methods, one that
/// returns `Pin<Box<dyn Future<Output = R> + …>>` and ends in `Box::pin(async move { … })`, is
/// locked the same way. Only the boxed future is locked: a statement before `Box::pin` would
/// run when the function is called, without the lock, so it is a compile error on that
/// statement. Move it into the `async move` block, or make the function an `async fn`. The
/// attribute does not move it for you: such a statement usually prepares what the future
/// captures (an `Arc` cloned so that the future is `'static`), and moved into the block it would
/// run only at the first poll, and often no longer compile. Items there (a helper `fn`, a
/// `const`) run nothing and are accepted.
///
/// # With `#[tracing::instrument]`
///
/// Write `#[distributed_lock]` above `#[tracing::instrument]`: the attribute above expands first
/// and the one below wraps its result, so the function's span then holds the lock's events too
/// (waiting, acquired, released, and the warning of a skipped call). In the other order the span
/// is only entered once the lock is held. The same holds on an `#[async_trait]` method.
///
/// ```
/// # use dlock::{distributed_lock, LockError};
/// #[distributed_lock(key = "acct:<open_id>")]
/// #[tracing::instrument]
/// async fn submit(open_id: &str) -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// # Composition
///
/// - A call on the same key and locker awaited inside the body re-enters the held lease without
///   a round trip, under the outer call's ttl and renewal; calls joined inside the body on that
///   key re-enter one at a time, each waiting for its turn at most its own `wait` or `ttl`,
///   whichever is longer, and then returning `LockError::Busy`. Calls joined side by side outside any body, spawned tasks, and
///   tasks polled inside the body (a `LocalSet` or a runtime the body drives) are other owners.
///   A call decides at its first poll whether it re-enters (a body on its key is being polled
///   around it) or asks the store; a re-entered call polled outside the body it re-entered
///   (awaited beside it, after it, or in another task) returns `LockError::Lost` at that poll.
/// - Two attributes stacked on one function take both locks, the lower one first.
///
/// # Compile errors
///
/// Each on the offending token, with the fix in the message: a placeholder naming no parameter
/// (the parameters are listed), `<>`, an unclosed `<`, a stray `>`, a placeholder on a
/// destructured parameter, a field of a placeholder's path that its parameter does not have (on
/// the key), a value that is not `Display`, a non-literal or empty key, a malformed, zero or
/// overflowing duration literal, an empty label, `permits = 0` or a `permits` that is no integer
/// literal, a `mode` other than `"read"` or `"write"`, `mode` beside `permits`, a ttl literal longer than `i64::MAX` ms, a duration path that
/// is no `Duration` constant, a ttl constant out of the bounds (above), an unknown or repeated
/// argument, a function that is not `async`, a statement before the `Box::pin` of a function
/// that returns a boxed future (above), a return type that cannot carry a lock failure
/// (the message says which can, and how to make this one), a `locker` expression that is no
/// `&Locker`, and one that builds a new `Locker` at every call (`&Locker::memory()`: no two
/// calls would exclude each other). The function is still written back under an error, so that
/// call sites keep compiling and no warning about its parameters follows.
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::distributed_lock(args.into(), item.into()).into()
}
