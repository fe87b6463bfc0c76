//! The in-process store: the same semantics as the servers (expiry by its own clock, fences,
//! first-come first-served hand-off on release), for single-process programs, examples and tests.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::Notify;

use super::{AcquireRequest, Acquired, Backend, Renewal};
use crate::inspect::bounded;
use crate::{LockError, Owner};

/// An in-process lock store. Clones share one store.
///
/// Waiters on a key queue in arrival order; a release hands the key straight to the head of the
/// queue and wakes only that waiter, so nobody starves and nobody polls. Fences come from one
/// counter for the whole store, so they increase per key across releases and expiries.
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

#[derive(Default)]
struct Shared {
    keys: Mutex<HashMap<String, KeyState>>,
    fences: AtomicU64,
    acquire_calls: AtomicU64,
}

#[derive(Default)]
struct KeyState {
    holder: Option<Holder>,
    queue: VecDeque<Arc<Waiter>>,
}

/// The key's holder, with what [`Backend::inspect`] tells of it (the host and process are this
/// one's).
struct Holder {
    owner: Owner,
    expires_at: Instant,
    fence: u64,
    /// Cut by [`bounded`], as every store keeps it.
    label: String,
    /// By the store's clock, which for this store is the system's.
    acquired_at: SystemTime,
}

struct Waiter {
    owner: Owner,
    ttl: Duration,
    label: String,
    /// Set once, by the release that hands the key over.
    granted: OnceLock<Acquired>,
    wake: Notify,
}

impl Waiter {
    /// A place in the queue for `request`'s owner.
    fn new(request: &AcquireRequest<'_>) -> Arc<Waiter> {
        Arc::new(Waiter {
            owner: request.owner,
            ttl: request.ttl,
            label: bounded(request.label).to_owned(),
            granted: OnceLock::new(),
            wake: Notify::new(),
        })
    }
}

impl KeyState {
    fn is_free(&self, now: Instant) -> bool {
        self.holder.as_ref().is_none_or(|h| h.expires_at <= now)
    }

    fn is_empty(&self) -> bool {
        self.holder.is_none() && self.queue.is_empty()
    }

    /// Wakes the waiters, which watch the holder's expiry: call it whenever the head or the
    /// holder changes, or a waiter could sleep through an expiry nobody else sees.
    fn wake_waiters(&self) {
        for waiter in &self.queue {
            waiter.wake.notify_one();
        }
    }
}

/// How long a key handed to a waiter stays its own before the waiter claims it (see
/// [`Shared::hand_off`]).
const CLAIM_WINDOW: Duration = Duration::from_secs(1);

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
        match keys.get_mut(key).and_then(|state| state.holder.as_mut()) {
            Some(holder) => {
                holder.expires_at = now;
                keys.get(key).expect("just found").wake_waiters();
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
        match keys.get_mut(key).and_then(|state| state.holder.as_mut()) {
            Some(holder) => {
                *holder = Holder {
                    owner: Owner::random(),
                    expires_at: Instant::now() + Duration::from_secs(3600),
                    fence: self.shared.fences.fetch_add(1, Ordering::Relaxed) + 1,
                    label: String::new(),
                    acquired_at: SystemTime::now(),
                };
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

impl Shared {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, KeyState>> {
        // Nothing panics while the map is locked, but a poisoned lock must not take every later
        // lock down with it: the map is consistent between statements.
        self.keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn grant(
        &self,
        state: &mut KeyState,
        owner: Owner,
        label: &str,
        ttl: Duration,
        now: Instant,
    ) -> Acquired {
        let fence = self.fences.fetch_add(1, Ordering::Relaxed) + 1;
        state.holder = Some(Holder {
            owner,
            expires_at: now + ttl,
            fence,
            label: bounded(label).to_owned(),
            acquired_at: SystemTime::now(),
        });
        Acquired {
            fence,
            valid_from: now,
        }
    }

    /// Hands a free key to the head of its queue, if any.
    ///
    /// The waiter gets the key for the claim window only, and its ttl once it claims it: a
    /// waiter whose future is kept but no longer polled holds the key for a window, not a ttl.
    fn hand_off(&self, state: &mut KeyState, now: Instant) {
        if !state.is_free(now) {
            return;
        }
        state.holder = None;
        if let Some(next) = state.queue.pop_front() {
            let acquired = self.grant(
                state,
                next.owner,
                &next.label,
                next.ttl.min(CLAIM_WINDOW),
                now,
            );
            let _ = next.granted.set(acquired);
            next.wake.notify_one();
        }
        state.wake_waiters();
    }

    fn release(&self, key: &str, owner: Owner) -> bool {
        self.release_in(&mut self.lock(), key, owner)
    }

    /// [`release`](Self::release) on the already locked map.
    fn release_in(&self, keys: &mut HashMap<String, KeyState>, key: &str, owner: Owner) -> bool {
        let Some(state) = keys.get_mut(key) else {
            return false;
        };
        if state.holder.as_ref().is_none_or(|h| h.owner != owner) {
            return false;
        }
        state.holder = None;
        self.hand_off(state, Instant::now());
        if state.is_empty() {
            keys.remove(key);
        }
        true
    }

    /// [`Backend::expire_after`]: `key`'s holder, where it is `owner`, expires `after` from
    /// now; its waiters are woken to wait for that expiry rather than the one before.
    fn expire_after(&self, key: &str, owner: Owner, after: Duration) -> bool {
        let mut keys = self.lock();
        let now = Instant::now();
        let Some(state) = keys.get_mut(key) else {
            return false;
        };
        match state.holder.as_mut() {
            Some(holder) if holder.owner == owner && holder.expires_at > now => {
                holder.expires_at = now.checked_add(after).unwrap_or(holder.expires_at);
                state.wake_waiters();
                true
            }
            _ => false,
        }
    }

    /// [`Backend::force_release`]: evicts `key`'s holder where it is `owner`, and hands the key
    /// on.
    fn force_release(&self, key: &str, owner: Owner) -> Option<u64> {
        let mut keys = self.lock();
        let state = keys.get_mut(key)?;
        let now = Instant::now();
        // Only `owner`'s lease: a key that changed hands since the operator read it keeps its
        // new holder, and a call made twice leaves the waiter the first one handed it to.
        let evicted = state
            .holder
            .as_ref()
            .filter(|holder| holder.expires_at > now && holder.owner == owner)
            .map(|holder| holder.fence);
        if evicted.is_some() {
            state.holder = None;
        }
        // Even where the holder had expired: nobody else may be about to hand the key on.
        self.hand_off(state, now);
        if state.is_empty() {
            keys.remove(key);
        }
        evicted
    }

    /// Takes `waiter` out of `key`'s queue, or releases the key if it was handed to the waiter
    /// already. One critical section for both, since a hand-off sets `granted` under the lock:
    /// looking at `granted` outside it could miss a hand-off that lands just after.
    fn leave_queue(&self, key: &str, waiter: &Arc<Waiter>) {
        let mut keys = self.lock();
        if waiter.granted.get().is_some() {
            self.release_in(&mut keys, key, waiter.owner);
            return;
        }
        if let Some(state) = keys.get_mut(key) {
            state.queue.retain(|w| !Arc::ptr_eq(w, waiter));
            // If it was this waiter's turn, pass the turn on; either way the head may be new.
            self.hand_off(state, Instant::now());
            state.wake_waiters();
            if state.is_empty() {
                keys.remove(key);
            }
        }
    }
}

/// Leaves the queue when a waiter gives up or its future is dropped; releases a key that was
/// handed over after the waiter stopped listening.
struct QueueGuard<'a> {
    shared: &'a Shared,
    key: &'a str,
    waiter: Arc<Waiter>,
    done: bool,
}

impl Drop for QueueGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.shared.leave_queue(self.key, &self.waiter);
        }
    }
}

impl Backend for MemoryBackend {
    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Option<Acquired>, LockError> {
        let shared = &*self.shared;
        shared.acquire_calls.fetch_add(1, Ordering::Relaxed);
        let deadline = super::wait_deadline(request.wait);
        let waiter = {
            let mut keys = shared.lock();
            let now = Instant::now();
            let state = keys.entry(request.key.to_owned()).or_default();
            // A holder that expired releases nothing: if its waiters are not being polled (a
            // future kept but parked), nobody else would hand the key on.
            shared.hand_off(state, now);
            if state.queue.is_empty() && state.is_free(now) {
                return Ok(Some(shared.grant(
                    state,
                    request.owner,
                    request.label,
                    request.ttl,
                    now,
                )));
            }
            if request.wait.is_zero() {
                return Ok(None);
            }
            let waiter = Waiter::new(request);
            state.queue.push_back(waiter.clone());
            waiter
        };
        let mut guard = QueueGuard {
            shared,
            key: request.key,
            waiter,
            done: false,
        };
        loop {
            // From a handle of its own: a waiter whose claim ran out is replaced mid-iteration.
            let waiter = guard.waiter.clone();
            let woken = waiter.wake.notified();
            // Every waiter watches the holder's expiry: an expired holder releases nothing, and
            // the head may be a future nobody polls any more, so any waiter hands the key on.
            let holder_expiry = {
                let mut keys = shared.lock();
                let now = Instant::now();
                if let Some(&acquired) = guard.waiter.granted.get() {
                    let state = keys.entry(request.key.to_owned()).or_default();
                    match state.holder.as_mut() {
                        Some(holder)
                            if holder.owner == request.owner && holder.expires_at > now =>
                        {
                            // Claimed: the lease runs its ttl from now.
                            holder.expires_at = now + request.ttl;
                            guard.done = true;
                            return Ok(Some(Acquired {
                                fence: acquired.fence,
                                valid_from: now,
                            }));
                        }
                        _ => {
                            // The claim window ran out before this waiter was polled again, and
                            // the key went on: wait again, at the back.
                            let waiter = Waiter::new(request);
                            state.queue.push_back(waiter.clone());
                            guard.waiter = waiter;
                            continue;
                        }
                    }
                }
                let state = keys
                    .get_mut(request.key)
                    .expect("a queued waiter keeps its key's entry");
                let is_head = state
                    .queue
                    .front()
                    .is_some_and(|w| Arc::ptr_eq(w, &guard.waiter));
                if is_head && state.is_free(now) {
                    state.queue.pop_front();
                    guard.done = true;
                    return Ok(Some(shared.grant(
                        state,
                        request.owner,
                        request.label,
                        request.ttl,
                        now,
                    )));
                }
                if !is_head && state.is_free(now) {
                    // To the head, for a claim window: if it is polled it claims the key, and if
                    // not, the window runs out and the key goes on.
                    shared.hand_off(state, now);
                    continue;
                }
                if now >= deadline {
                    // The guard leaves the queue, or gives back a key handed over meanwhile.
                    return Ok(None);
                }
                state.holder.as_ref().map(|h| h.expires_at)
            };
            let until = holder_expiry.map_or(deadline, |expiry| expiry.min(deadline));
            tokio::select! {
                () = woken => {}
                () = crate::clock::sleep_until(until) => {}
            }
        }
    }

    async fn release(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
        Ok(self.shared.release(key, owner))
    }

    async fn renew(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
        let mut keys = self.shared.lock();
        let now = Instant::now();
        Ok(leases
            .iter()
            .map(
                |lease| match keys.get_mut(lease.key).and_then(|s| s.holder.as_mut()) {
                    Some(holder) if holder.owner == lease.owner && holder.expires_at > now => {
                        // Never shortens: a renewal that lands after the lease's hold set a
                        // later expiry (`expire_after`) must not cut the hold short.
                        holder.expires_at = holder.expires_at.max(now + lease.ttl);
                        true
                    }
                    _ => false,
                },
            )
            .collect())
    }

    fn release_now(&self, key: &str, owner: Owner) -> bool {
        self.shared.release(key, owner);
        true
    }

    async fn inspect(&self, key: &str) -> Result<crate::KeyState, LockError> {
        let keys = self.shared.lock();
        let now = Instant::now();
        let Some(state) = keys.get(key) else {
            return Ok(crate::KeyState::new(key, Vec::new(), 0));
        };
        let holders = state
            .holder
            .as_ref()
            .filter(|holder| holder.expires_at > now)
            .map(|holder| {
                let mut shown = crate::Holder::new(holder.owner, holder.fence, holder.acquired_at)
                    .with_label(holder.label.as_str())
                    .with_pid(std::process::id())
                    .with_time_left(holder.expires_at - now);
                let host = crate::inspect::this_host();
                if !host.is_empty() {
                    shown = shown.with_host(host);
                }
                shown
            });
        Ok(crate::KeyState::new(
            key,
            holders.into_iter().collect(),
            state.queue.len(),
        ))
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

    /// Takes the key from its holder where it is `owner`, and hands it to the head of its queue,
    /// as a release does.
    /// Fences come from one counter for the whole store, so the next grant's is above the
    /// evicted one.
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
}
