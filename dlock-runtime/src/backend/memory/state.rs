//! One key of the in-process store: who holds it (one writer, or any number of readers) and
//! who waits for it, in one queue.

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::Notify;

use crate::backend::{AcquireRequest, Acquired};
use crate::inspect::bounded;
use crate::{Mode, Owner};

/// How long a key handed to a waiter stays its own before the waiter claims it (see
/// [`Shared::hand_off`](super::shared::Shared::hand_off)).
pub(super) const CLAIM_WINDOW: Duration = Duration::from_secs(1);

#[derive(Default)]
pub(super) struct KeyState {
    /// One writer, or readers only. A holder whose lease ran out stays listed until the next
    /// hand-off drops it, but counts for nothing: every look goes through [`Holder::is_live`].
    pub(super) holders: Vec<Holder>,
    /// Readers and writers together, in arrival order: a reader behind a waiting writer waits
    /// for it, which is what keeps a stream of readers from starving the writer.
    pub(super) queue: VecDeque<Arc<Waiter>>,
}

/// One holder of a key, with what [`Backend::inspect`](crate::backend::Backend::inspect) tells
/// of it (the host and process are this one's).
pub(super) struct Holder {
    pub(super) owner: Owner,
    pub(super) mode: Mode,
    pub(super) expires_at: Instant,
    pub(super) fence: u64,
    /// Cut by [`bounded`], as every store keeps it.
    pub(super) label: String,
    /// By the store's clock, which for this store is the system's.
    pub(super) acquired_at: SystemTime,
}

impl Holder {
    pub(super) fn is_live(&self, now: Instant) -> bool {
        self.expires_at > now
    }
}

pub(super) struct Waiter {
    pub(super) owner: Owner,
    pub(super) mode: Mode,
    pub(super) ttl: Duration,
    pub(super) label: String,
    /// Set once, by the hand-off that gives it the key.
    pub(super) granted: OnceLock<Acquired>,
    pub(super) wake: Notify,
}

impl Waiter {
    /// A place in the queue for `request`'s owner.
    pub(super) fn new(request: &AcquireRequest<'_>) -> Arc<Waiter> {
        Arc::new(Waiter {
            owner: request.owner,
            mode: request.mode,
            ttl: request.ttl,
            label: bounded(request.label).to_owned(),
            granted: OnceLock::new(),
            wake: Notify::new(),
        })
    }
}

impl KeyState {
    /// Whether a newcomer in `mode` could hold the key beside its live holders now: a writer
    /// where nobody holds it, a reader where only readers do. The queue is the caller's to
    /// consider.
    pub(super) fn admits(&self, mode: Mode, now: Instant) -> bool {
        self.live(now)
            .all(|holder| mode == Mode::Read && holder.mode == Mode::Read)
    }

    pub(super) fn is_free(&self, now: Instant) -> bool {
        self.live(now).next().is_none()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.holders.is_empty() && self.queue.is_empty()
    }

    pub(super) fn live(&self, now: Instant) -> impl Iterator<Item = &Holder> {
        self.holders
            .iter()
            .filter(move |holder| holder.is_live(now))
    }

    /// `owner`'s lease of the key, while it is live.
    pub(super) fn live_holder_mut(&mut self, owner: Owner, now: Instant) -> Option<&mut Holder> {
        self.holders
            .iter_mut()
            .find(|holder| holder.owner == owner && holder.is_live(now))
    }

    /// When the first live lease of the key runs out: a waiter must look again then, as an
    /// expired holder releases nothing.
    pub(super) fn next_expiry(&self, now: Instant) -> Option<Instant> {
        self.live(now).map(|holder| holder.expires_at).min()
    }

    /// Wakes the waiters, which watch the holders' expiries: call it whenever the head or a
    /// holder changes, or a waiter could sleep through an expiry nobody else sees.
    pub(super) fn wake_waiters(&self) {
        for waiter in &self.queue {
            waiter.wake.notify_one();
        }
    }
}
