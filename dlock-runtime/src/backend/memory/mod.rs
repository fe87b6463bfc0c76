//! The in-process store: the same semantics as the servers (expiry by its own clock, fences,
//! first-come first-served hand-off on release), for single-process programs, examples and tests,
//! and read-write locks (many readers or one writer per key).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::{AcquireRequest, Acquired, Backend, Renewal};
use crate::{LockError, Mode, Owner};

mod acquire;
mod shared;
mod state;

use shared::Shared;
use state::Holder;

/// An in-process lock store. Clones share one store.
///
/// Waiters on a key queue in arrival order; a release hands the key straight to the head of the
/// queue and wakes only that waiter, so nobody starves and nobody polls. Fences come from one
/// counter for the whole store, so they increase per key across releases and expiries.
///
/// It takes keys for readers as well ([`Mode::Read`]): any number of readers at once, each with
/// a lease and a fence of its own, or one writer. Readers and writers wait in the same queue, so
/// a reader that arrives behind a waiting writer waits for it; a release hands the key to the
/// writer at the head, or to every reader at the head up to the first writer.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use dlock::{backend::MemoryBackend, LockOptions, Locker};
///
/// let store = MemoryBackend::new();
/// let locker = Locker::with_backend(store.clone());
/// let lease = locker.lock("job:1", LockOptions::new()).await.unwrap();
/// assert!(store.is_held("job:1"));
/// lease.release().await.unwrap();
/// assert!(!store.is_held("job:1"));
/// # }
/// ```
#[derive(Clone, Default)]
pub struct MemoryBackend {
    shared: Arc<Shared>,
}

impl MemoryBackend {
    /// An empty store. [`Locker::memory`](crate::Locker::memory) makes one for you; make it
    /// yourself to keep a handle on the store, to look at it in a test.
    ///
    /// ```
    /// use dlock::{backend::MemoryBackend, Locker};
    ///
    /// let store = MemoryBackend::new();
    /// let locker = Locker::with_backend(store.clone()); // clones share the store
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    #[doc(hidden)] // A hook for tests, not part of the API.
    /// Makes `key`'s lease expire now, as if its holder had stopped renewing long ago. Returns
    /// whether the key was held.
    pub fn expire(&self, key: &str) -> bool {
        let mut keys = self.shared.lock();
        let now = Instant::now();
        match keys.get_mut(key).filter(|state| !state.holders.is_empty()) {
            Some(state) => {
                for holder in &mut state.holders {
                    holder.expires_at = holder.expires_at.min(now);
                }
                state.wake_waiters();
                true
            }
            None => false,
        }
    }

    #[doc(hidden)] // A hook for tests, not part of the API.
    /// Gives `key` to a stranger for an hour, as a split-brain takeover would. Returns whether
    /// the key was held.
    pub fn steal(&self, key: &str) -> bool {
        let mut keys = self.shared.lock();
        match keys.get_mut(key).filter(|state| !state.holders.is_empty()) {
            Some(state) => {
                state.holders = vec![Holder {
                    owner: Owner::random(),
                    mode: Mode::Write,
                    expires_at: Instant::now() + Duration::from_secs(3600),
                    fence: self.shared.next_fence(),
                    label: String::new(),
                    acquired_at: SystemTime::now(),
                }];
                true
            }
            None => false,
        }
    }

    #[doc(hidden)] // A hook for tests, not part of the API.
    /// How many acquisitions were asked of this store.
    pub fn acquire_calls(&self) -> u64 {
        self.shared.acquire_calls.load(Ordering::Relaxed)
    }

    /// Whether `key` is held by someone now, by any locker on this store.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::{backend::MemoryBackend, LockOptions, Locker};
    ///
    /// let store = MemoryBackend::new();
    /// let locker = Locker::with_backend(store.clone());
    /// let lease = locker.lock("job:1", LockOptions::new()).await?;
    /// assert!(store.is_held("job:1"));
    /// drop(lease); // released at once: the store is in this process
    /// assert!(!store.is_held("job:1"));
    /// # Ok(()) }
    /// ```
    pub fn is_held(&self, key: &str) -> bool {
        let keys = self.shared.lock();
        keys.get(key)
            .is_some_and(|state| !state.is_free(Instant::now()))
    }
}

impl Backend for MemoryBackend {
    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Option<Acquired>, LockError> {
        Ok(acquire::acquire(&self.shared, request).await)
    }

    async fn release(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
        Ok(self.shared.release(key, owner))
    }

    async fn renew(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
        let mut keys = self.shared.lock();
        let now = Instant::now();
        Ok(leases
            .iter()
            .map(|lease| Shared::renew_in(&mut keys, lease.key, lease.owner, lease.ttl, now))
            .collect())
    }

    fn release_now(&self, key: &str, owner: Owner) -> bool {
        self.shared.release(key, owner);
        true
    }

    /// Every live holder: the writer, or each reader.
    async fn inspect(&self, key: &str) -> Result<crate::KeyState, LockError> {
        let keys = self.shared.lock();
        let now = Instant::now();
        let Some(state) = keys.get(key) else {
            return Ok(crate::KeyState::new(key, Vec::new(), 0));
        };
        let host = crate::inspect::this_host();
        let holders = state
            .live(now)
            .map(|holder| {
                let mut shown = crate::Holder::new(holder.owner, holder.fence, holder.acquired_at)
                    .with_label(holder.label.as_str())
                    .with_pid(std::process::id())
                    .with_time_left(holder.expires_at - now)
                    .with_mode(holder.mode);
                if !host.is_empty() {
                    shown = shown.with_host(host);
                }
                shown
            })
            .collect();
        Ok(crate::KeyState::new(key, holders, state.queue.len()))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, LockError> {
        let keys = self.shared.lock();
        let now = Instant::now();
        Ok(keys
            .iter()
            .filter(|(key, state)| key.starts_with(prefix) && !state.is_free(now))
            .map(|(key, _)| key.clone())
            .collect())
    }

    /// Takes `owner`'s lease of the key (the writer's, or one reader's), and hands the key on as
    /// a release does. Fences come from one counter for the whole store, so the next grant's is
    /// above the evicted one.
    async fn force_release(&self, key: &str, owner: Owner) -> Result<Option<u64>, LockError> {
        Ok(self.shared.force_release(key, owner))
    }

    fn expires_at_a_set_time(&self) -> bool {
        true
    }

    async fn expire_after(
        &self,
        key: &str,
        owner: Owner,
        after: Duration,
    ) -> Result<bool, LockError> {
        Ok(self.shared.expire_after(key, owner, after))
    }

    fn shares_reads(&self) -> bool {
        true
    }
}
