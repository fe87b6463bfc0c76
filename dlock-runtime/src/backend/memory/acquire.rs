//! An acquisition of the in-process store: granted at once where the key admits it and nobody
//! waits, else a place in the key's queue until a hand-off gives it the key.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::shared::{Grant, Shared};
use super::state::Waiter;
use crate::backend::{wait_deadline, AcquireRequest, Acquired};

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

fn grant_of<'a>(request: &AcquireRequest<'a>) -> Grant<'a> {
    Grant {
        owner: request.owner,
        mode: request.mode,
        label: request.label,
        ttl: request.ttl,
    }
}

pub(super) async fn acquire(shared: &Shared, request: &AcquireRequest<'_>) -> Option<Acquired> {
    shared.acquire_calls.fetch_add(1, Ordering::Relaxed);
    let deadline = wait_deadline(request.wait);
    let waiter = {
        let mut keys = shared.lock();
        let now = Instant::now();
        let state = keys.entry(request.key.to_owned()).or_default();
        // A holder that expired releases nothing: if its waiters are not being polled (a
        // future kept but parked), nobody else would hand the key on.
        shared.hand_off(state, now);
        // Only where nobody waits: a reader that arrives behind a waiting writer queues, even
        // where readers hold the key, or a stream of readers would keep the writer out.
        if state.queue.is_empty() && state.admits(request.mode, now) {
            return Some(shared.grant(state, grant_of(request), now));
        }
        if request.wait.is_zero() {
            return None;
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
        // Every waiter watches the holders' expiries: an expired holder releases nothing, and
        // the head may be a future nobody polls any more, so any waiter hands the key on.
        let next_expiry = {
            let mut keys = shared.lock();
            let now = Instant::now();
            let state = keys.entry(request.key.to_owned()).or_default();
            // To the head of the queue, as far as the key admits it, for a claim window: if the
            // head is polled it claims the key, and if not, the window runs out and the key goes
            // on. This waiter may be among those it goes to.
            shared.hand_off(state, now);
            if let Some(&acquired) = waiter.granted.get() {
                match state.live_holder_mut(request.owner, now) {
                    Some(holder) => {
                        // Claimed: the lease runs its ttl from now.
                        holder.expires_at = now + request.ttl;
                        guard.done = true;
                        return Some(Acquired {
                            fence: acquired.fence,
                            valid_from: now,
                        });
                    }
                    None => {
                        // The claim window ran out before this waiter was polled again, and the
                        // key went on: wait again, at the back.
                        let waiter = Waiter::new(request);
                        state.queue.push_back(waiter.clone());
                        guard.waiter = waiter;
                        continue;
                    }
                }
            }
            if now >= deadline {
                // The guard leaves the queue, or gives back a key handed over meanwhile.
                return None;
            }
            state.next_expiry(now)
        };
        let until = next_expiry.map_or(deadline, |expiry| expiry.min(deadline));
        tokio::select! {
            () = woken => {}
            () = crate::clock::sleep_until(until) => {}
        }
    }
}
