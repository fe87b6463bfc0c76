//! Options of one acquisition.

use std::time::Duration;

use crate::{LockError, Mode};

/// How to acquire and keep one lease: its ttl, how long to wait for a busy key, whether a
/// watchdog renews it, and the label it is known by to operators.
///
/// ```
/// use std::time::Duration;
/// let options = dlock::LockOptions::new().ttl(Duration::from_secs(3)).wait(Duration::from_millis(500));
/// assert_eq!(options.ttl, Duration::from_secs(3));
/// assert!(options.renew);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockOptions {
    /// Lease length (default 30 s). The store lets the lease expire this long after the last
    /// acquisition or renewal it confirmed.
    pub ttl: Duration,
    /// How long to wait for a busy key (default zero: try once). Waits longer than
    /// [`MAX_WAIT`](Self::MAX_WAIT), `Duration::MAX` among them, wait that long.
    pub wait: Duration,
    /// Whether the watchdog renews the lease every ttl/3 while it is held (default `true`).
    pub renew: bool,
    /// The holder's name for operators: the `label` of the acquisition's metrics (see
    /// "Metrics" in the crate docs). Default [`UNLABELLED`](Self::UNLABELLED); under
    /// `#[distributed_lock]`, the attribute's `label`, else the function's path.
    pub label: &'static str,
    /// How long after its grant the key stays held at least, whenever the holder ends (zero, the
    /// default: no such hold). A lease released sooner is kept instead, unrenewed, and expires
    /// by itself at that time on the store, even if this process ends meanwhile: a job
    /// scheduled on every replica runs once per window. The attribute's `hold_at_least`.
    pub hold_at_least: Duration,
    /// How many holders the key admits at once (default 1: a mutex). More makes the key a
    /// semaphore; see [`permits`](Self::permits). The attribute's `permits`.
    pub permits: u32,
    /// Whether the key is taken by readers together or by one writer alone (default
    /// [`Mode::Write`], a plain lock); see [`mode`](Self::mode). The attribute's `mode`.
    pub mode: Mode,
}

impl LockOptions {
    /// The defaults: ttl 30 s, no wait, renewal on. `const`, so options can be a constant.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dlock::LockOptions;
    ///
    /// const IMPORT: LockOptions = LockOptions::new().ttl(Duration::from_secs(60));
    /// assert_eq!(LockOptions::new(), LockOptions::default());
    /// assert_eq!(IMPORT.wait, Duration::ZERO);
    /// ```
    pub const fn new() -> Self {
        LockOptions {
            ttl: Duration::from_secs(30),
            wait: Duration::ZERO,
            renew: true,
            label: Self::UNLABELLED,
            hold_at_least: Duration::ZERO,
            permits: 1,
            mode: Mode::Write,
        }
    }

    /// The label of an acquisition that was given none: `"unlabelled"`, which tells an operator
    /// looking at a metric that the code taking the lock did not name itself.
    pub const UNLABELLED: &'static str = "unlabelled";

    /// Names the holder for operators: the `label` that the acquisition's metrics carry.
    /// A `&'static str`, a literal or a constant, so that naming costs a call nothing; keep it to
    /// a handful of values per program (a function or a job, never a key or an id), as each
    /// value is a series of its own in a metrics store.
    ///
    /// ```
    /// let options = dlock::LockOptions::new().label("billing::nightly_invoices");
    /// assert_eq!(options.label, "billing::nightly_invoices");
    /// assert_eq!(dlock::LockOptions::new().label, dlock::LockOptions::UNLABELLED);
    /// ```
    pub const fn label(mut self, label: &'static str) -> Self {
        self.label = label;
        self
    }

    /// Sets the lease length. A store that cannot keep a lease that long shortens it to the
    /// longest it can (on ZooKeeper, two thirds of the session timeout less a tick: see
    /// `ZookeeperBackend`). A shorter lease is renewed more often — a lease without renewal
    /// too, up to the ttl set here and no further — and only a holder cut off from the store
    /// gives it up sooner.
    ///
    /// A ttl under 1 ms makes [`Locker::lock`](crate::Locker::lock) fail with
    /// [`LockError::InvalidOptions`].
    ///
    /// ```
    /// use std::time::Duration;
    /// // A crashed holder blocks the key for at most 5 s.
    /// let options = dlock::LockOptions::new().ttl(Duration::from_secs(5));
    /// ```
    pub const fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets how long to wait for a busy key: zero (the default) tries once, and
    /// `Duration::MAX` waits until the key is free.
    ///
    /// ```
    /// use std::time::Duration;
    /// // Every caller must run, one at a time: queue for the key.
    /// let options = dlock::LockOptions::new().wait(Duration::from_secs(2));
    /// ```
    pub const fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Turns the watchdog's renewal on or off. Off, the lease ends a ttl after it was granted
    /// however long its holder works: for work that must never outlast a fixed window. (Where
    /// the store shortened the ttl, the lease is confirmed at the shorter ttl's pace up to that
    /// end, so it still lasts the ttl set.)
    ///
    /// ```
    /// use std::time::Duration;
    /// let options = dlock::LockOptions::new().ttl(Duration::from_secs(60)).renew(false);
    /// ```
    pub const fn renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }

    /// Keeps the key held until `hold` after the grant, however soon the holder releases it: the
    /// lease is then kept, no longer renewed, and the store expires it at that time by itself
    /// (so it outlives a holder that ends, or whose process exits). A lease released later than
    /// that is released at once. For a job every replica runs on a schedule that must run once
    /// per window: each replica tries with no wait, and those after the first find the key
    /// busy for the whole window (ShedLock's `lockAtLeastFor`).
    ///
    /// A call that re-enters a lease its task holds adds no hold of its own: the outer call's
    /// options decide how the lease ends. A holder whose process dies before it releases keeps
    /// the key only until its lease expires, as without a hold. A store that cannot expire a key
    /// by itself at a set time (ZooKeeper, whose lock nodes live as long as their holder's
    /// session) answers [`LockError::Unsupported`] before acquiring. A lease without renewal whose ttl is shorter than `hold` would end before
    /// the hold does: [`LockError::InvalidOptions`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// use std::time::Duration;
    /// use dlock::{LockError, LockOptions, Locker};
    ///
    /// let locker = Locker::memory();
    /// let nightly = LockOptions::new().hold_at_least(Duration::from_secs(60));
    /// let first = locker.lock("nightly-cleanup", nightly).await?;
    /// // … the clean-up, done in a second …
    /// first.release().await?;
    /// // Another replica, a moment later: the window is still the first one's.
    /// let second = locker.lock("nightly-cleanup", nightly).await;
    /// assert!(matches!(second, Err(LockError::Busy { .. })));
    /// # Ok(()) }
    /// ```
    pub const fn hold_at_least(mut self, hold: Duration) -> Self {
        self.hold_at_least = hold;
        self
    }

    /// Makes the key a semaphore of `permits` permits: at most that many holders at once, each
    /// with a lease of its own (its owner, its fence, its renewal), where 1, the default, is the
    /// plain mutex. For work that a shared resource can take a few of at a time: calls to a
    /// rate-limited partner API, exports that each load the database.
    ///
    /// - **Waiting**: a caller that finds every permit taken waits up to
    ///   [`wait`](Self::wait) for one. Waiters are served in the order the store serves a
    ///   mutex's: first come, first served across processes on memory, Redis and ZooKeeper
    ///   (MySQL lets in whichever waiter polls first; PostgreSQL as its docs say).
    /// - **Holders that die**: each permit is a lease of the key's; a holder that dies lets its
    ///   permit go when its ttl runs out, as for a mutex.
    /// - **Key**: [`Lease::key`](crate::Lease::key) and
    ///   [`LeaseInfo::key`](crate::LeaseInfo::key) are the key given, and a call nested in a
    ///   body holding a permit of the key re-enters that permit. The store holds each permit
    ///   under a key of its own (the key, the control character U+001F and the permit's
    ///   number), which operators see in [`Locker::list`](crate::Locker::list), and which is a
    ///   few bytes longer than the key: a key near a store's length limit is refused with
    ///   [`LockError::InvalidKey`], which says by how much.
    /// - **Fences**: a permit's fence is its own. It increases each time *that permit* is
    ///   granted again, not across the permits: two holders of a key at once may carry one
    ///   fence value. Fence a write with it only where each permit guards a resource of its
    ///   own; where the holders share one resource, that resource cannot tell a stale holder
    ///   from a current one by fence, and must not be fenced with it.
    /// - **One number per key**: give a key the same `permits` everywhere. A key taken as a
    ///   semaphore and the same key taken as a mutex do not exclude each other.
    /// - **Cost**: uncontended, three round trips to the store (take the queue's turnstile,
    ///   take a permit, give the turnstile back), one with a zero `wait` (which takes a free
    ///   permit or none, without queueing); each held permit is renewed in the locker's batch,
    ///   as any lease.
    ///
    /// Zero admits nobody, and more than [`MAX_PERMITS`](Self::MAX_PERMITS) is refused (a
    /// waiter waits on every permit at once): [`Locker::lock`](crate::Locker::lock) fails with
    /// [`LockError::InvalidOptions`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::{LockError, LockOptions, Locker};
    ///
    /// let locker = Locker::memory();
    /// let exports = LockOptions::new().permits(2);
    /// let first = locker.lock("exports", exports).await?;
    /// let second = locker.lock("exports", exports).await?;
    /// assert_eq!(second.key(), "exports");
    /// // A third caller finds both permits taken.
    /// assert!(matches!(locker.lock("exports", exports).await, Err(LockError::Busy { .. })));
    /// first.release().await?;
    /// let third = locker.lock("exports", exports).await?;
    /// # drop((second, third));
    /// # Ok(()) }
    /// ```
    pub const fn permits(mut self, permits: u32) -> Self {
        self.permits = permits;
        self
    }

    /// Takes the key as a reader ([`Mode::Read`]: together with other readers, while no writer
    /// holds it) or as a writer ([`Mode::Write`], the default: alone, as a plain lock). A waiting
    /// writer keeps readers that come after it out, so readers never starve it. See [`Mode`] for
    /// the order callers are served in, nesting, and the stores that have it (the in-process
    /// one; the others answer [`LockError::Unsupported`]).
    ///
    /// A read mode with [`permits`](Self::permits) above 1 makes
    /// [`Locker::lock`](crate::Locker::lock) fail with [`LockError::InvalidOptions`]: a key is
    /// a semaphore or a read-write lock, not both.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::{LockError, LockOptions, Locker, Mode};
    ///
    /// let locker = Locker::memory();
    /// let reader = locker.lock("prices", LockOptions::new().mode(Mode::Read)).await?;
    /// let another = locker.lock("prices", LockOptions::new().mode(Mode::Read)).await?;
    /// // The writer waits for both readers.
    /// let writer = locker.lock("prices", LockOptions::new().mode(Mode::Write)).await;
    /// assert!(matches!(writer, Err(LockError::Busy { .. })));
    /// # drop((reader, another));
    /// # Ok(()) }
    /// ```
    pub const fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// The most permits a key may have ([`permits`](Self::permits)): a waiter waits on every
    /// permit at once, each a key of the store's with a place in its queue, so a key with more
    /// would cost each waiter more than the concurrency it buys. The attribute refuses more at
    /// compile time.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use dlock::{LockError, LockOptions, Locker};
    ///
    /// let too_many = LockOptions::new().permits(LockOptions::MAX_PERMITS + 1);
    /// let refused = Locker::memory().lock("exports", too_many).await;
    /// assert!(matches!(refused, Err(LockError::InvalidOptions { .. })));
    /// # }
    /// ```
    pub const MAX_PERMITS: u32 = 1024;

    /// The longest wait honoured: a century, which is forever for a lock, and far enough from
    /// the end of `Instant`'s range that adding it to the present never overflows.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dlock::LockOptions;
    ///
    /// // Both wait until the key is free.
    /// let forever = LockOptions::new().wait(Duration::MAX);
    /// let century = LockOptions::new().wait(LockOptions::MAX_WAIT);
    /// ```
    pub const MAX_WAIT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

    /// The options as every store gets them: checked, with `wait` capped at
    /// [`MAX_WAIT`](Self::MAX_WAIT) so that `Duration::MAX` means "wait forever" everywhere.
    pub(crate) fn checked(mut self) -> Result<Self, LockError> {
        self.validate()?;
        self.wait = self.wait.min(Self::MAX_WAIT);
        Ok(self)
    }

    fn validate(&self) -> Result<(), LockError> {
        if self.permits == 0 {
            return Err(LockError::InvalidOptions {
                reason: "permits is 0, which admits nobody; give at least 1 (1 is a mutex)".into(),
            });
        }
        if self.permits > Self::MAX_PERMITS {
            return Err(LockError::InvalidOptions {
                reason: format!(
                    "permits is {}, more than the {} a key may have: a waiter waits on every \
                     permit at once",
                    self.permits,
                    Self::MAX_PERMITS
                ),
            });
        }
        if self.permits > 1 && self.mode == Mode::Read {
            return Err(LockError::InvalidOptions {
                reason: format!(
                    "permits is {} with the read mode: a key is a semaphore or a read-write \
                     lock, not both; drop one of them",
                    self.permits
                ),
            });
        }
        if ttl_is_too_short(self.ttl) {
            return Err(LockError::InvalidOptions {
                reason: format!("ttl {:?} is shorter than 1ms", self.ttl),
            });
        }
        if ttl_is_too_long(self.ttl) {
            return Err(LockError::InvalidOptions {
                reason: format!("ttl {:?} is too long", self.ttl),
            });
        }
        if ttl_is_too_long(self.hold_at_least) {
            return Err(LockError::InvalidOptions {
                reason: format!("hold_at_least {:?} is too long", self.hold_at_least),
            });
        }
        if !self.renew && self.ttl < self.hold_at_least {
            return Err(LockError::InvalidOptions {
                reason: format!(
                    "a lease without renewal ends at its ttl {:?}, before hold_at_least {:?}: \
                     turn renewal on, or make the ttl at least as long as the hold",
                    self.ttl, self.hold_at_least
                ),
            });
        }
        Ok(())
    }
}

/// Whether `ttl` is shorter than any lease may be: 1 ms. `const`, so that `#[distributed_lock]`
/// checks a ttl constant at compile time by the same bound.
pub const fn ttl_is_too_short(ttl: Duration) -> bool {
    ttl.as_nanos() < 1_000_000
}

/// Whether `ttl` is longer than any lease may be: `i64::MAX` milliseconds (about 292 million
/// years). `const`, so that `#[distributed_lock]` checks a ttl constant at compile time by the
/// same bound.
pub const fn ttl_is_too_long(ttl: Duration) -> bool {
    ttl.as_millis() > i64::MAX as u128
}

impl Default for LockOptions {
    fn default() -> Self {
        Self::new()
    }
}
