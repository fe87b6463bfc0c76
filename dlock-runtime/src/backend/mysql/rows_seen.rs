//! The keys a backend has seen a row of, whose tries start with the take-over.

use std::collections::HashSet;
use std::sync::Mutex;

/// The keys this backend has seen a row of. Only a hint: a key forgotten is tried with an
/// `INSERT` first, and a key whose row went is found by the `INSERT` that follows a take-over
/// that took nothing. Bounded: forgotten all at once when full, so a service that locks
/// millions of distinct keys keeps a few hundred kilobytes at most.
#[derive(Default)]
pub(super) struct RowsSeen {
    keys: Mutex<HashSet<Vec<u8>>>,
}

impl RowsSeen {
    /// The most keys remembered.
    const MOST: usize = 4096;

    pub(super) fn contains(&self, key: &[u8]) -> bool {
        self.keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(key)
    }

    pub(super) fn insert(&self, key: &[u8]) {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if keys.contains(key) {
            return;
        }
        if keys.len() >= Self::MOST {
            keys.clear();
        }
        keys.insert(key.to_vec());
    }
}

#[cfg(test)]
mod tests {
    use super::RowsSeen;

    #[test]
    fn remembers_keys_up_to_a_bound() {
        let seen = RowsSeen::default();
        seen.insert(b"acct:1");
        assert!(seen.contains(b"acct:1") && !seen.contains(b"acct:2"));
        for i in 0..RowsSeen::MOST + 1 {
            seen.insert(format!("k{i}").as_bytes());
        }
        assert!(seen.keys.lock().unwrap().len() <= RowsSeen::MOST);
    }
}
