//! The record of acquisitions an acquire call of which was sent twice.

use std::collections::HashSet;
use std::sync::Mutex;

use super::keys::LockKeys;

/// The acquisitions (lock key, owner) an acquire call of which was sent twice, the first copy's
/// connection having dropped: that copy may still be on its way, to grant the key once it lands.
/// Until such an acquisition is released, its release leaves the cancel marker, as an undo does
/// (see `release_or_leave`).
#[derive(Default)]
pub(super) struct Resent(Mutex<HashSet<(String, [u8; 32])>>);

impl Resent {
    /// Records that an acquire call of this acquisition was sent twice.
    pub(super) fn note(&self, keys: &LockKeys) {
        self.0.lock().unwrap().insert(keys.acquisition());
    }

    /// Whether an acquire call of this acquisition was sent twice. `keys` is only named where
    /// some acquisition was: the set is almost always empty, and naming costs allocations.
    pub(super) fn contains(&self, keys: impl FnOnce() -> LockKeys) -> bool {
        let resent = self.0.lock().unwrap();
        !resent.is_empty() && resent.contains(&keys().acquisition())
    }

    /// Forgets this acquisition, once its release was sent.
    pub(super) fn forget(&self, keys: &LockKeys) {
        self.0.lock().unwrap().remove(&keys.acquisition());
    }
}
