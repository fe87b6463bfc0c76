//! Re-entrancy: the leases held by the annotated bodies a task is inside of, and the turns that
//! keep re-entered calls on one lease from running side by side.
//!
//! The stack lives in a `tokio::task_local!` scope around each body, never in a `thread_local!`
//! (a task moves between threads). A scope covers exactly one body's future, so a call awaited
//! inside the body sees the lease and re-enters, while a call joined beside it (`tokio::join!`)
//! or spawned from it does not: those are other owners.
//!
//! Re-entering is not the same as running alone: a body may join two calls on its own key
//! (`tokio::join!(withdraw(id), withdraw(id))`), and both find the lease on the stack. So each
//! lease has one *occupant*, the body that may run under it now: the acquiring body at first.
//! A re-entering call waits until the occupant is the body it was called from (its parent
//! frame), takes the turn, and gives it back when it ends, whichever way. Siblings therefore go
//! one at a time, while a call nested inside a re-entered call (whose parent is that call)
//! never waits on itself. A call waits for its turn at most its own `wait`, as it would for a
//! busy key: the occupant may be a future its caller has stopped polling until this call ends
//! (a `select!` loop that awaits this call in one branch while the other holds the turn), and
//! would otherwise wait for ever with its lease renewed all along.
//!
//! A call can outlive the call it was started in (started, then handed out to an outer body):
//! its parent then ends while it still holds the turn, or still waits for it. The parent gives
//! back nothing it does not hold; the call, when it ends, gives the turn to its nearest ancestor
//! still running, and a call still waiting waits for that ancestor's turn instead.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::lease::{LeaseInfo, LeaseState};
use crate::{LockError, LockOptions};

tokio::task_local! {
    /// The frame of the innermost body; each links to the frame around it.
    static HELD: Arc<Frame>;
}

/// One annotated body a task is inside of: the lease it runs under, and the body around it.
pub(crate) struct Frame {
    lease: Arc<LeaseState>,
    /// This body's identity in its lease's turns; [`Turns::ACQUIRER`] for the body that acquired.
    id: u64,
    outer: Option<Arc<Frame>>,
    /// The frame under the same lease this one re-entered from; `None` for the acquirer.
    parent: Option<Arc<Frame>>,
    /// Set, under the lease's turn lock, when this body has ended.
    ended: AtomicBool,
}

impl Frame {
    /// This frame if its body still runs, else its nearest ancestor under the same lease whose
    /// body does: at the latest the acquirer's, which is never marked ended. Read under the
    /// lease's turn lock, which `ended` is set under.
    fn running(self: &Arc<Frame>) -> &Arc<Frame> {
        let mut frame = self;
        while let Some(parent) = frame
            .parent
            .as_ref()
            .filter(|_| frame.ended.load(Ordering::Relaxed))
        {
            frame = parent;
        }
        frame
    }
}

/// Whose turn it is to run under one lease; kept in the lease.
pub(crate) struct Turns {
    /// The frame id of the occupant. A lock rather than an atomic: a hand-back reads the
    /// parents' `ended` flags and writes the occupant as one step.
    occupant: Mutex<u64>,
    handed_back: Notify,
}

impl Turns {
    /// The frame id of the body that acquired the lease, the first occupant.
    const ACQUIRER: u64 = 0;

    pub(crate) fn new() -> Self {
        Turns {
            occupant: Mutex::new(Self::ACQUIRER),
            handed_back: Notify::new(),
        }
    }

    fn occupant(&self) -> MutexGuard<'_, u64> {
        self.occupant.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Where a call on `key` by `locker_id` stands.
pub(crate) enum Entry {
    /// A body of this task holds the key: `parent` is the innermost frame under that lease, and
    /// `top` the innermost frame of all.
    Reenter { parent: Arc<Frame>, top: Arc<Frame> },
    /// The call must acquire; `outer` is the innermost enclosing frame, if any.
    Acquire { outer: Option<Arc<Frame>> },
}

/// Looks `key` up among the leases of the enclosing bodies, with one task-local access, as this
/// is on every call's path.
pub(crate) fn enter(locker_id: usize, key: &str) -> Entry {
    HELD.try_with(|top| {
        let mut frame = Some(top);
        while let Some(current) = frame {
            if current.lease.locker_id == locker_id && current.lease.key == key {
                return Entry::Reenter {
                    parent: current.clone(),
                    top: top.clone(),
                };
            }
            frame = current.outer.as_ref();
        }
        Entry::Acquire {
            outer: Some(top.clone()),
        }
    })
    .unwrap_or(Entry::Acquire { outer: None })
}

/// The ids of the leases the bodies this task is inside of run under, innermost first.
pub(crate) fn leases_of_this_task() -> Vec<u64> {
    HELD.try_with(|top| {
        let mut ids = Vec::new();
        let mut frame = Some(top);
        while let Some(current) = frame {
            ids.push(current.lease.id);
            frame = current.outer.as_ref();
        }
        ids
    })
    .unwrap_or_default()
}

/// Runs the body of the call that acquired `lease` with the lease on top of the held stack.
pub(crate) fn scope<F: Future>(
    lease: Arc<LeaseState>,
    outer: Option<Arc<Frame>>,
    body: F,
) -> impl Future<Output = F::Output> {
    let frame = Frame {
        lease,
        id: Turns::ACQUIRER,
        outer,
        parent: None,
        ended: AtomicBool::new(false),
    };
    HELD.scope(Arc::new(frame), body)
}

/// A re-entering call's turn under its parent's lease; handing it back on drop, so a body that
/// returns, panics or is dropped lets the next sibling in.
pub(crate) struct Turn {
    frame: Arc<Frame>,
}

static NEXT_FRAME: AtomicU64 = AtomicU64::new(Turns::ACQUIRER + 1);

impl Turn {
    /// Waits until `parent` is the lease's occupant, then takes the turn for a new frame above
    /// `top`. Waits at most `wait`, as a call waits for a busy key, and fails with
    /// [`LockError::Busy`] after it: the occupant may be a call its caller no longer polls (one
    /// branch of a `select!` whose other branch is this call), which then never hands the turn
    /// back. Fails with [`LockError::Lost`] when the lease is lost first.
    pub(crate) async fn take(
        parent: &Arc<Frame>,
        top: Arc<Frame>,
        wait: Duration,
    ) -> Result<Turn, LockError> {
        let lease = &parent.lease;
        let turns = &lease.turns;
        let id = NEXT_FRAME.fetch_add(1, Ordering::Relaxed);
        let mut top = Some(top);
        // Read only once the turn is found taken: a free turn costs no clock read.
        let mut deadline = None;
        loop {
            let handed_back = turns.handed_back.notified();
            tokio::pin!(handed_back);
            handed_back.as_mut().enable();
            {
                let mut occupant = turns.occupant();
                // A parent that has ended handed its turn on to its nearest running ancestor,
                // which is the body this call now answers to.
                if *occupant == parent.running().id {
                    *occupant = id;
                    let frame = Frame {
                        lease: lease.clone(),
                        id,
                        outer: top.take(),
                        parent: Some(parent.clone()),
                        ended: AtomicBool::new(false),
                    };
                    return Ok(Turn {
                        frame: Arc::new(frame),
                    });
                }
            }
            let deadline =
                *deadline.get_or_insert_with(|| Instant::now() + wait.min(LockOptions::MAX_WAIT));
            if Instant::now() >= deadline {
                return Err(LockError::Busy {
                    key: lease.key.clone(),
                });
            }
            tokio::select! {
                () = handed_back => {}
                () = lease.wait_lost() => {
                    return Err(LockError::Lost {
                        key: lease.key.clone(),
                    })
                }
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// The lease this turn runs under.
    pub(crate) fn lease(&self) -> &Arc<LeaseState> {
        &self.frame.lease
    }

    /// Runs `body` with this turn's frame on top of the held stack.
    pub(crate) fn scope<F: Future>(&self, body: F) -> impl Future<Output = F::Output> {
        HELD.scope(self.frame.clone(), body)
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let turns = &self.frame.lease.turns;
        let mut occupant = turns.occupant();
        self.frame.ended.store(true, Ordering::Relaxed);
        if *occupant != self.frame.id {
            // A call started in this body still runs (it was handed out): it hands the turn on
            // when it ends.
            return;
        }
        let heir = self.frame.parent.as_ref().map(|parent| parent.running());
        *occupant = heir.map_or(Turns::ACQUIRER, |f| f.id);
        drop(occupant);
        turns.handed_back.notify_waiters();
    }
}

/// The lease of the innermost `#[distributed_lock]` body this code runs in, or `None` outside
/// any.
///
/// ```
/// use std::sync::LazyLock;
/// use dlock::{distributed_lock, Locker};
///
/// static LOCKS: LazyLock<Locker> = LazyLock::new(Locker::memory);
///
/// #[derive(Debug)]
/// struct Stale;
/// impl From<dlock::LockError> for Stale {
///     fn from(_: dlock::LockError) -> Self { Stale }
/// }
///
/// #[distributed_lock(key = "stock:<sku>", locker = &LOCKS)]
/// async fn deduct(sku: &str) -> Result<u64, Stale> {
///     let lease = dlock::current_lease().expect("inside a locked body");
///     assert_eq!(lease.key(), "stock:apple");
///     Ok(lease.fence()) // send it along with the write it protects
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// assert!(deduct("apple").await.unwrap() > 0);
/// assert!(dlock::current_lease().is_none());
/// # }
/// ```
pub fn current_lease() -> Option<LeaseInfo> {
    HELD.try_with(|top| LeaseInfo {
        state: top.lease.clone(),
    })
    .ok()
}
