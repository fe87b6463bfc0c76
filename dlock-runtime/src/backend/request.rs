//! What an acquisition asks of a store ([`AcquireRequest`]), what a store answers
//! ([`Acquired`]), and one lease of a renewal batch ([`Renewal`]).

use std::time::{Duration, Instant};

use crate::{Mode, Owner};

/// When a wait of `wait` from now ends. A wait too long for the clock to add (`Duration::MAX`,
/// for a store driven directly) ends in a century: no caller waits that long, and an overflow
/// would panic.
#[cfg(any(
    feature = "memory",
    feature = "redis",
    feature = "mysql",
    feature = "postgres"
))]
pub(crate) fn wait_deadline(wait: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    let now = Instant::now();
    now.checked_add(wait.min(CENTURY)).unwrap_or(now)
}

/// One acquisition asked of a backend. The runtime makes these; build one yourself to drive a
/// backend directly, in a test of a [`Backend`](super::Backend) of your own, say.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// use std::time::Duration;
/// use dlock::backend::{AcquireRequest, Backend, MemoryBackend};
/// use dlock::Owner;
///
/// let store = MemoryBackend::new();
/// let (first, second) = (Owner::random(), Owner::random());
/// let ttl = Duration::from_secs(5);
/// let granted = store.acquire(&AcquireRequest::new("acct:42", first, ttl, Duration::ZERO)).await?;
/// assert!(granted.is_some());
/// let busy = store.acquire(&AcquireRequest::new("acct:42", second, ttl, Duration::ZERO)).await?;
/// assert!(busy.is_none(), "a busy key is Ok(None), not an error");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct AcquireRequest<'a> {
    /// The rendered key.
    pub key: &'a str,
    /// The token the key is to be stored under.
    pub owner: Owner,
    /// Lease length, judged by the store's clock.
    pub ttl: Duration,
    /// How long to wait for a busy key; zero tries once.
    pub wait: Duration,
    /// Whether the lease will be renewed while held (the watchdog's renewals): a store may then
    /// grant a lease that needs its first renewal sooner than a third of the ttl (see
    /// [`Acquired::valid_from`]). `false` unless set: a caller that renews nothing gets a lease
    /// valid for its ttl. A `Locker` sets it from [`LockOptions::renew`](crate::LockOptions::renew),
    /// and for a lease whose ttl it shortened to
    /// [`Backend::ttl_limit`](super::Backend::ttl_limit), which it renews up to
    /// the ttl asked whatever that option says.
    pub renewed: bool,
    /// The acquisition's name for operators, stored with the lease and shown by
    /// [`Locker::inspect`](crate::Locker::inspect) as the holder's
    /// [`label`](crate::Holder::label). Empty unless set.
    pub label: &'a str,
    /// Whether the key is asked for by a reader, to share with other readers, or by a writer,
    /// alone ([`Mode::Write`] unless set). Only a store whose
    /// [`shares_reads`](super::Backend::shares_reads) is `true` is ever asked for a reader.
    pub mode: Mode,
}

/// A granted acquisition, as a backend answers [`Backend::acquire`](super::Backend::acquire).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// use std::time::{Duration, Instant};
/// use dlock::backend::{AcquireRequest, Backend, MemoryBackend};
/// use dlock::Owner;
///
/// let store = MemoryBackend::new();
/// let asked_at = Instant::now();
/// let request = AcquireRequest::new("acct:42", Owner::random(), Duration::from_secs(5), Duration::ZERO);
/// let acquired = store.acquire(&request).await?.expect("the key was free");
/// assert!(acquired.fence > 0);
/// assert!(acquired.valid_from >= asked_at);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquired {
    /// A fencing token greater than every earlier one of this key.
    pub fence: u64,
    /// A client instant no later than the moment the store started the lease's ttl: the client
    /// counts the lease's validity from here, which can only err on the safe side.
    ///
    /// Where the store granted less than the ttl for now (a grant that its first renewal is to
    /// extend, for a request that is [`renewed`](AcquireRequest::renewed)), this is the start of
    /// a ttl-long lease whose validity, less the margin the client takes off a ttl, ends no later
    /// than the shorter grant's, less the same share of it. It may lie further back than a
    /// third of the ttl: the first renewal then comes a third of the way into the validity left.
    pub valid_from: Instant,
}

/// One lease to renew, as the watchdog asks [`Backend::renew`](super::Backend::renew) for each
/// lease it keeps.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// use std::time::Duration;
/// use dlock::backend::{AcquireRequest, Backend, MemoryBackend, Renewal};
/// use dlock::Owner;
///
/// let store = MemoryBackend::new();
/// let (holder, stranger) = (Owner::random(), Owner::random());
/// let ttl = Duration::from_secs(5);
/// store.acquire(&AcquireRequest::new("acct:42", holder, ttl, Duration::ZERO)).await?;
/// let held = store
///     .renew(&[Renewal::new("acct:42", holder, ttl), Renewal::new("acct:42", stranger, ttl)])
///     .await?;
/// assert_eq!(held, [true, false]); // only the owner's renewal takes effect
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Renewal<'a> {
    /// The rendered key.
    pub key: &'a str,
    /// The owner the lease was acquired with.
    pub owner: Owner,
    /// The lease length to extend to, from now by the store's clock.
    pub ttl: Duration,
}

impl<'a> Renewal<'a> {
    /// A renewal of `key` for `owner` by `ttl`.
    ///
    /// ```
    /// use std::time::Duration;
    /// let renewal = dlock::backend::Renewal::new("acct:42", dlock::Owner::random(), Duration::from_secs(5));
    /// assert_eq!(renewal.key, "acct:42");
    /// ```
    pub fn new(key: &'a str, owner: Owner, ttl: Duration) -> Self {
        Renewal { key, owner, ttl }
    }
}

impl<'a> AcquireRequest<'a> {
    /// A request for `key` by `owner`, for a lease of `ttl`, waiting up to `wait` for a busy key.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dlock::{backend::AcquireRequest, Owner};
    ///
    /// let request = AcquireRequest::new("acct:42", Owner::random(), Duration::from_secs(5), Duration::ZERO);
    /// assert!(request.wait.is_zero()); // try once
    /// ```
    pub fn new(key: &'a str, owner: Owner, ttl: Duration, wait: Duration) -> Self {
        AcquireRequest {
            key,
            owner,
            ttl,
            wait,
            renewed: false,
            label: "",
            mode: Mode::Write,
        }
    }

    /// The same request, under `label`, the name operators see the holder by (empty unless set).
    ///
    /// ```
    /// use std::time::Duration;
    /// use dlock::{backend::AcquireRequest, Owner};
    ///
    /// let request = AcquireRequest::new("acct:42", Owner::random(), Duration::from_secs(5), Duration::ZERO);
    /// assert_eq!(request.label, "");
    /// assert_eq!(request.label("billing::charge").label, "billing::charge");
    /// ```
    pub fn label(mut self, label: &'a str) -> Self {
        self.label = label;
        self
    }

    /// The same request, for a lease that is renewed while held or not (not, unless set).
    ///
    /// ```
    /// use std::time::Duration;
    /// use dlock::{backend::AcquireRequest, Owner};
    ///
    /// let request = AcquireRequest::new("acct:42", Owner::random(), Duration::from_secs(5), Duration::ZERO);
    /// assert!(!request.renewed);
    /// assert!(request.renewed(true).renewed);
    /// ```
    pub fn renewed(mut self, renewed: bool) -> Self {
        self.renewed = renewed;
        self
    }

    /// The same request, by a reader or a writer ([`Mode::Write`] unless set).
    ///
    /// ```
    /// use std::time::Duration;
    /// use dlock::{backend::AcquireRequest, Mode, Owner};
    ///
    /// let request = AcquireRequest::new("acct:42", Owner::random(), Duration::from_secs(5), Duration::ZERO);
    /// assert_eq!(request.mode, Mode::Write);
    /// assert_eq!(request.mode(Mode::Read).mode, Mode::Read);
    /// ```
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }
}
