//! What the clones of a [`MemoryBackend`](super::MemoryBackend) share: the keys, the fence
//! counter, and every change made to a key under the one lock of the map.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use super::state::{Holder, KeyState, Waiter, CLAIM_WINDOW};
use crate::backend::Acquired;
use crate::inspect::bounded;
use crate::{Mode, Owner};

#[derive(Default)]
pub(super) struct Shared {
    keys: Mutex<HashMap<String, KeyState>>,
    /// One counter for the whole store: every grant of a key, to a reader or a writer, gets a
    /// fence above every earlier one of that key, across releases and expiries.
    fences: AtomicU64,
    pub(super) acquire_calls: AtomicU64,
}

/// One lease to grant: who, how, and for how long.
pub(super) struct Grant<'a> {
    pub(super) owner: Owner,
    pub(super) mode: Mode,
    pub(super) label: &'a str,
    pub(super) ttl: Duration,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, HashMap<String, KeyState>> {
        // Nothing panics while the map is locked, but a poisoned lock must not take every later
        // lock down with it: the map is consistent between statements.
        self.keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn next_fence(&self) -> u64 {
        self.fences.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Adds a holder to `state`; the caller checked that [`KeyState::admits`] it.
    pub(super) fn grant(&self, state: &mut KeyState, grant: Grant<'_>, now: Instant) -> Acquired {
        let fence = self.next_fence();
        state.holders.push(Holder {
            owner: grant.owner,
            mode: grant.mode,
            expires_at: now + grant.ttl,
            fence,
            label: bounded(grant.label).to_owned(),
            acquired_at: SystemTime::now(),
        });
        Acquired {
            fence,
            valid_from: now,
        }
    }

    /// Drops the holders whose leases ran out, then hands the key to the head of its queue as
    /// far as it admits them: the head writer alone, or every reader up to the first writer.
    ///
    /// Each waiter gets the key for the claim window only, and its ttl once it claims it: a
    /// waiter whose future is kept but no longer polled holds the key for a window, not a ttl.
    pub(super) fn hand_off(&self, state: &mut KeyState, now: Instant) {
        let before = state.holders.len();
        state.holders.retain(|holder| holder.is_live(now));
        let mut changed = state.holders.len() != before;
        while let Some(next) = state.queue.front() {
            if !state.admits(next.mode, now) {
                break;
            }
            let next = state.queue.pop_front().expect("just looked at");
            let grant = Grant {
                owner: next.owner,
                mode: next.mode,
                label: &next.label,
                ttl: next.ttl.min(CLAIM_WINDOW),
            };
            let acquired = self.grant(state, grant, now);
            let _ = next.granted.set(acquired);
            next.wake.notify_one();
            changed = true;
        }
        if changed {
            state.wake_waiters();
        }
    }

    pub(super) fn release(&self, key: &str, owner: Owner) -> bool {
        self.release_in(&mut self.lock(), key, owner)
    }

    /// [`release`](Self::release) on the already locked map. Only `owner`'s lease: the other
    /// readers of the key keep theirs.
    pub(super) fn release_in(
        &self,
        keys: &mut HashMap<String, KeyState>,
        key: &str,
        owner: Owner,
    ) -> bool {
        let Some(state) = keys.get_mut(key) else {
            return false;
        };
        let Some(position) = state.holders.iter().position(|h| h.owner == owner) else {
            return false;
        };
        state.holders.swap_remove(position);
        self.hand_off(state, Instant::now());
        if state.is_empty() {
            keys.remove(key);
        }
        true
    }

    /// [`Backend::renew`](crate::backend::Backend::renew) of one lease on the locked map.
    pub(super) fn renew_in(
        keys: &mut HashMap<String, KeyState>,
        key: &str,
        owner: Owner,
        ttl: Duration,
        now: Instant,
    ) -> bool {
        match keys
            .get_mut(key)
            .and_then(|state| state.live_holder_mut(owner, now))
        {
            Some(holder) => {
                // Never shortens: a renewal that lands after the lease's hold set a later
                // expiry (`expire_after`) must not cut the hold short.
                holder.expires_at = holder.expires_at.max(now + ttl);
                true
            }
            None => false,
        }
    }

    /// [`Backend::expire_after`](crate::backend::Backend::expire_after): `owner`'s lease of
    /// `key` expires `after` from now; the waiters are woken to wait for that expiry rather
    /// than the one before.
    pub(super) fn expire_after(&self, key: &str, owner: Owner, after: Duration) -> bool {
        let mut keys = self.lock();
        let now = Instant::now();
        let Some(state) = keys.get_mut(key) else {
            return false;
        };
        match state.live_holder_mut(owner, now) {
            Some(holder) => {
                holder.expires_at = now.checked_add(after).unwrap_or(holder.expires_at);
                state.wake_waiters();
                true
            }
            None => false,
        }
    }

    /// [`Backend::force_release`](crate::backend::Backend::force_release): evicts `owner`'s
    /// lease of `key`, and hands the key on as far as it is free.
    pub(super) fn force_release(&self, key: &str, owner: Owner) -> Option<u64> {
        let mut keys = self.lock();
        let state = keys.get_mut(key)?;
        let now = Instant::now();
        // Only `owner`'s lease: a key that changed hands since the operator read it keeps its
        // new holder, and a call made twice leaves the waiter the first one handed it to.
        let position = state
            .holders
            .iter()
            .position(|holder| holder.owner == owner && holder.is_live(now));
        let evicted = position.map(|position| state.holders.swap_remove(position).fence);
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
    pub(super) fn leave_queue(&self, key: &str, waiter: &Arc<Waiter>) {
        let mut keys = self.lock();
        if waiter.granted.get().is_some() {
            self.release_in(&mut keys, key, waiter.owner);
            return;
        }
        if let Some(state) = keys.get_mut(key) {
            state.queue.retain(|w| !Arc::ptr_eq(w, waiter));
            // A writer that leaves may let the readers behind it in at once; either way the head
            // may be new.
            self.hand_off(state, Instant::now());
            state.wake_waiters();
            if state.is_empty() {
                keys.remove(key);
            }
        }
    }
}
