//! What the commands ask of the runtime, as the tool's reports: a key's state, the held keys,
//! and a forced release.

use dlock::{LockError, Locker};

use crate::report::KeyReport;

/// The state of `key`.
pub async fn inspect(_locker: &Locker, _key: &str) -> Result<KeyReport, LockError> {
    Err(LockError::backend("inspect is not available yet"))
}

/// The held keys starting with `prefix`, in key order.
pub async fn list(_locker: &Locker, _prefix: &str) -> Result<Vec<KeyReport>, LockError> {
    Err(LockError::backend("list is not available yet"))
}

/// Evicts `key`'s holder: its fence, or `None` where nobody held the key.
pub async fn force_release(_locker: &Locker, _key: &str) -> Result<Option<u64>, LockError> {
    Err(LockError::backend("force release is not available yet"))
}
