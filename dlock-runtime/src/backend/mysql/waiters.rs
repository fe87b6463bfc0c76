//! This backend's count of its waiting acquisitions per key. MySQL keeps no queue (a waiter
//! polls), so the database cannot say who waits: `inspect` reports the waiters of the backend
//! it is asked through, which are the ones an operator's process can see.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// The waiting acquisitions of one backend, by key.
#[derive(Clone, Default)]
pub(super) struct Waiting {
    counts: Arc<Mutex<HashMap<String, usize>>>,
}

impl Waiting {
    fn counts(&self) -> MutexGuard<'_, HashMap<String, usize>> {
        // Nothing panics while the map is locked.
        self.counts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts one more waiter of `key`, until the returned guard is dropped (the acquisition
    /// ended, however).
    pub(super) fn wait_for(&self, key: &str) -> Waiter {
        *self.counts().entry(key.to_owned()).or_default() += 1;
        Waiter {
            waiting: self.clone(),
            key: key.to_owned(),
        }
    }

    /// How many acquisitions of this backend wait for `key` now.
    pub(super) fn waiters(&self, key: &str) -> usize {
        self.counts().get(key).copied().unwrap_or(0)
    }
}

/// One waiting acquisition, counted while it lives.
pub(super) struct Waiter {
    waiting: Waiting,
    key: String,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut counts = self.waiting.counts();
        if let Some(count) = counts.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Waiting;

    #[test]
    fn a_waiter_is_counted_while_it_waits() {
        let waiting = Waiting::default();
        let first = waiting.wait_for("k");
        let second = waiting.wait_for("k");
        assert_eq!((waiting.waiters("k"), waiting.waiters("other")), (2, 0));
        drop(first);
        assert_eq!(waiting.waiters("k"), 1);
        drop(second);
        assert_eq!(waiting.waiters("k"), 0);
        assert!(waiting.counts().is_empty());
    }
}
