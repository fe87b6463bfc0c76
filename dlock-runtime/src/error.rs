//! Lock failures, and how a locked function hands them to its caller.

/// Why a lock could not be had or kept.
///
/// ```
/// let error = dlock::LockError::Busy { key: "acct:42".into() };
/// assert_eq!(error.to_string(), "lock `acct:42` is busy");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// Another owner held the key for the whole of `wait`; or, for a call re-entering the key
    /// of the body it runs in, a call beside it inside that body kept its turn for the longer
    /// of its `wait` and `ttl`.
    #[error("lock `{key}` is busy")]
    Busy {
        /// The rendered key.
        key: String,
    },
    /// The lease ended while its holder was still working: a renewal was refused, or could not be
    /// confirmed before the lease's expiry less the safety margin. Also returned by a re-entered
    /// call moved to a task other than the one running the body it re-entered: the lease is not
    /// its to run under there.
    #[error("lease on `{key}` was lost before the work finished")]
    Lost {
        /// The rendered key.
        key: String,
    },
    /// No locker was given and none is configured.
    #[error(
        "no default locker: call `dlock::set_default_locker(locker)` at start-up, \
         or set the DLOCK_URL environment variable (e.g. DLOCK_URL=redis://127.0.0.1:6379)"
    )]
    NoLocker,
    /// A locker URL that cannot be used.
    #[error("cannot use locker URL `{url}`: {reason}")]
    InvalidUrl {
        /// The URL as given, with any password masked.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Lock options that cannot be used, such as a zero ttl.
    #[error("invalid lock options: {reason}")]
    InvalidOptions {
        /// What is wrong with them.
        reason: String,
    },
    /// A key the store cannot hold as it is (too long for its column, say). Rejected rather than
    /// truncated, since truncation could merge two keys into one lock.
    #[error("key `{key}` cannot be used: {reason}")]
    InvalidKey {
        /// The rendered key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The locker was shut down ([`Locker::shutdown`](crate::Locker::shutdown)): it takes no
    /// new leases.
    #[error("the locker was shut down; it takes no new leases")]
    ShutDown,
    /// The store cannot do what was asked of it: a [`Backend`](crate::backend::Backend) that
    /// does not answer [`Locker::inspect`](crate::Locker::inspect) or
    /// [`Locker::list`](crate::Locker::list), say.
    #[error("this store cannot {what}")]
    Unsupported {
        /// What it cannot do, as in "this store cannot list its holders".
        what: String,
    },
    /// The store failed or could not be reached.
    #[error("lock backend error: {0}")]
    Backend(
        /// The store's own error (its client's, or a message), with any password masked.
        #[source]
        Box<dyn std::error::Error + Send + Sync + 'static>,
    ),
}

impl LockError {
    /// An unusable `url`, with its password masked in the URL and in `reason`.
    pub(crate) fn invalid_url(url: &str, reason: impl std::fmt::Display) -> Self {
        LockError::InvalidUrl {
            url: crate::url::mask_password(url),
            reason: crate::url::redact(&reason.to_string(), url),
        }
    }

    /// A copy of this error for a second caller that shares its cause. A store's error keeps
    /// its message, not its type.
    pub(crate) fn duplicate(&self) -> Self {
        match self {
            LockError::Busy { key } => LockError::Busy { key: key.clone() },
            LockError::Lost { key } => LockError::Lost { key: key.clone() },
            LockError::NoLocker => LockError::NoLocker,
            LockError::ShutDown => LockError::ShutDown,
            LockError::InvalidUrl { url, reason } => LockError::InvalidUrl {
                url: url.clone(),
                reason: reason.clone(),
            },
            LockError::InvalidOptions { reason } => LockError::InvalidOptions {
                reason: reason.clone(),
            },
            LockError::InvalidKey { key, reason } => LockError::InvalidKey {
                key: key.clone(),
                reason: reason.clone(),
            },
            LockError::Unsupported { what } => LockError::Unsupported { what: what.clone() },
            LockError::Backend(error) => LockError::backend(error.to_string()),
        }
    }

    /// Wraps a store's error, for a [`Backend`](crate::backend::Backend) of one's own.
    ///
    /// ```
    /// let error = dlock::LockError::backend("etcd: lease keep-alive refused");
    /// assert_eq!(error.to_string(), "lock backend error: etcd: lease keep-alive refused");
    /// ```
    pub fn backend(error: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        LockError::Backend(error.into())
    }
}

/// How a function under `#[distributed_lock]` returns early when its lock cannot be had, or is
/// lost with `on_lost = "cancel"`.
///
/// Implemented for `Result<T, E>` where `E: From<LockError>`, for `Option<T>` (`None`) and for
/// `()` (the call is skipped and a `tracing` warning says why).
///
/// ```
/// use dlock::{FromLockError, LockError};
///
/// #[derive(Debug)]
/// enum AppError { Lock(LockError) }
/// impl From<LockError> for AppError {
///     fn from(e: LockError) -> Self { AppError::Lock(e) }
/// }
///
/// let r = <Result<u32, AppError>>::from_lock_error(LockError::NoLocker);
/// assert!(matches!(r, Err(AppError::Lock(LockError::NoLocker))));
/// assert_eq!(<Option<u32>>::from_lock_error(LockError::NoLocker), None);
/// ```
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` cannot return a lock failure as `{Self}`",
    label = "this return type cannot carry a `dlock::LockError`",
    note = "the return types that work: `Result<T, E>` where `E: From<dlock::LockError>`, `Option<T>`, and `()`",
    note = "to keep returning `{Self}`, wrap it: `Option<{Self}>` (`None` when the lock is not had) or `Result<{Self}, E>` (`Err` holding the `dlock::LockError`)"
)]
pub trait FromLockError {
    /// The value the function returns instead of running its body.
    fn from_lock_error(error: LockError) -> Self;
}

impl<T, E: From<LockError>> FromLockError for Result<T, E> {
    fn from_lock_error(error: LockError) -> Self {
        Err(error.into())
    }
}

impl<T> FromLockError for Option<T> {
    fn from_lock_error(_: LockError) -> Self {
        None
    }
}

impl FromLockError for () {
    fn from_lock_error(error: LockError) -> Self {
        tracing::warn!(%error, "distributed_lock: call skipped");
    }
}
