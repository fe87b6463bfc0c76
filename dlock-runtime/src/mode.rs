//! Which way a key is taken: shared by readers, or by one writer alone.

/// How a key is taken: [`Write`](Mode::Write) (the default) by one holder alone, or
/// [`Read`](Mode::Read) by any number of readers at once, while no writer holds it.
///
/// A key taken with no mode, by `#[distributed_lock]` or [`Locker::lock`](crate::Locker::lock),
/// is taken as a writer: a reader of a key and a plain holder of that key exclude each other.
///
/// - **Readers**: each has a lease of its own (its owner, its ttl and renewal, its fence).
///   Every grant of a key, to a reader or a writer, gets a fence above every earlier one of that
///   key, so two readers inside at once carry two fences.
/// - **Order**: callers waiting for a key are served in one queue, in arrival order. A reader
///   that arrives while anyone waits queues behind them, even where readers hold the key: a
///   writer that waits is never overtaken by a stream of readers. When the key frees up, it goes
///   to the writer at the head of the queue, or to every reader at its head up to the first
///   writer.
/// - **Nesting** (a call inside a locked body on the same key, with `#[distributed_lock]`): a
///   read call inside a read body re-enters its lease; a read call inside a write body re-enters
///   the writer's lease, as the writer already excludes everyone; a write call inside a read body
///   fails with [`LockError::InvalidOptions`](crate::LockError::InvalidOptions), as an upgrade
///   would: two readers upgrading at once would wait for each other for ever. Take the key as a
///   writer from the start where the body may write. Only bodies of `#[distributed_lock]` are
///   re-entered: a read taken with [`Locker::lock`](crate::Locker::lock) is not, and a read
///   call on its key inside the work it guards is a second reader, which waits behind any
///   writer waiting meanwhile, and that writer behind the first reader: it ends `Busy` when its
///   `wait` runs out.
/// - **Hold**: [`LockOptions::hold_at_least`](crate::LockOptions::hold_at_least) applies to a
///   reader's lease as to a writer's: that reader's lease stays until the hold's end.
/// - **Stores**: the in-process store. The others answer a read acquisition with
///   [`LockError::Unsupported`](crate::LockError::Unsupported) before asking anything of the
///   store. A read mode cannot be combined with [`permits`](crate::LockOptions::permits) or a
///   [`campaign`](crate::Locker::campaign): both fail with
///   [`LockError::InvalidOptions`](crate::LockError::InvalidOptions).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// use dlock::{LockError, LockOptions, Locker, Mode};
///
/// let locker = Locker::memory();
/// let read = LockOptions::new().mode(Mode::Read);
/// let first = locker.lock("catalog", read).await?;
/// let second = locker.lock("catalog", read).await?; // readers share the key
/// assert!(second.fence() > first.fence());
/// // A writer (a plain lock too) waits for both.
/// assert!(matches!(locker.lock("catalog", LockOptions::new()).await, Err(LockError::Busy { .. })));
/// first.release().await?;
/// second.release().await?;
/// let writer = locker.lock("catalog", LockOptions::new().mode(Mode::Write)).await?;
/// # drop(writer);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Shared: any number of readers hold the key at once, while no writer does.
    Read,
    /// Exclusive: one holder alone, as a plain lock. The default.
    #[default]
    Write,
}

impl Mode {
    /// `"read"` or `"write"`, as the attribute's `mode` spells it.
    ///
    /// ```
    /// assert_eq!(dlock::Mode::Read.as_str(), "read");
    /// assert_eq!(dlock::Mode::default().as_str(), "write");
    /// ```
    pub const fn as_str(self) -> &'static str {
        match self {
            Mode::Read => "read",
            Mode::Write => "write",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
