//! Re-entrancy: the leases held by the annotated bodies a task is inside of, and the turns that
//! keep re-entered calls on one lease from running side by side.
//!
//! The stack lives in a `tokio::task_local!` scope around each body, never in a `thread_local!`
//! (a task moves between threads). A scope covers exactly one body's future, so a call awaited
//! inside the body sees the lease and re-enters, while a call joined beside it (`tokio::join!`)
//! or spawned from it does not: those are other owners.
//!
//! A scope is still a thread-local while the body is polled, and other tasks can be polled
//! inside that poll: a `LocalSet` the body drives with `run_until`, or a runtime of its own the
//! body drives with `block_on`, polls its tasks there, and those tasks run on later, on other
//! threads, beside the body. So each lease also records which tokio task polls its acquiring
//! body, and only that task's code is inside the body: another task finds no frame of its own,
//! and acquires like any other owner. A re-entered call moved to another task (started in the
//! body, then `tokio::spawn`ed) is stopped at its next poll with `LockError::Lost`, whatever its
//! `on_lost`: it had the lease, and no longer has it where it now runs.
//!
//! Re-entering is not the same as running alone: a body may join two calls on its own key
//! (`tokio::join!(withdraw(id), withdraw(id))`), and both find the lease on the stack. So each
//! lease has one *occupant*, the body that may run under it now: the acquiring body at first.
//! A re-entering call waits until the occupant is the body it was called from (its parent
//! frame), takes the turn, and gives it back when it ends, whichever way. Siblings therefore go
//! one at a time, while a call nested inside a re-entered call (whose parent is that call)
//! never waits on itself. A call waits for its turn for a bounded time (its own `wait` or
//! `ttl`, whichever is longer; see `locked`): the occupant may be a future its caller has stopped polling until this call ends
//! (a `select!` loop that awaits this call in one branch while the other holds the turn), and
//! would otherwise wait for ever with its lease renewed all along.
//!
//! A call can outlive the call it was started in (started, then handed out to an outer body):
//! its parent then ends while it still holds the turn, or still waits for it. The parent gives
//! back nothing it does not hold; the call, when it ends, gives the turn to its nearest ancestor
//! still running, and a call still waiting waits for that ancestor's turn instead.

use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
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
    /// The task ([`current_task`]) that polls the acquiring body, as of its latest poll: the
    /// only task whose code is inside the bodies under this lease. Written at every poll, so
    /// that an acquiring call moved to another task takes its lease along.
    polled_by: AtomicU64,
}

impl Turns {
    /// The frame id of the body that acquired the lease, the first occupant.
    const ACQUIRER: u64 = 0;

    pub(crate) fn new() -> Self {
        Turns {
            occupant: Mutex::new(Self::ACQUIRER),
            handed_back: Notify::new(),
            // Set at the acquiring body's first poll, before any frame of the lease is seen.
            polled_by: AtomicU64::new(0),
        }
    }

    fn is_polled_by(&self, task: u64) -> bool {
        self.polled_by.load(Ordering::Relaxed) == task
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

/// Looks `key` up among the leases of the enclosing bodies, with one task-local access (and,
/// inside a body, one read of the current task), as this is on every call's path.
pub(crate) fn enter(locker_id: usize, key: &str) -> Entry {
    HELD.try_with(|top| {
        let mut frames = frames_of(top, current_task()).peekable();
        if frames.peek().is_none() {
            // Polled inside another task's body: none of its frames are this task's.
            return Entry::Acquire { outer: None };
        }
        for frame in frames {
            if frame.lease.locker_id == locker_id && frame.lease.key == key {
                return Entry::Reenter {
                    parent: frame.clone(),
                    top: top.clone(),
                };
            }
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
        frames_of(top, current_task())
            .map(|frame| frame.lease.id)
            .collect()
    })
    .unwrap_or_default()
}

/// The frames of the stack under `top` that `task` is inside of, innermost first: up to the
/// first whose lease's body another task polls. A frame's outer frames were the stack of the
/// task that entered it; one that has since moved to another task (a call started inside a
/// body, then spawned) leaves those behind.
fn frames_of(top: &Arc<Frame>, task: u64) -> impl Iterator<Item = &Arc<Frame>> {
    std::iter::successors(Some(top), |frame| frame.outer.as_ref())
        .take_while(move |frame| frame.lease.turns.is_polled_by(task))
}

/// The tokio task being polled now, as a number. Outside any task (a future that a runtime's
/// `block_on` drives itself, on whichever thread calls it), the thread's own number instead, its
/// top bit set so it is never a task's: such a future never moves to another thread, and two
/// threads' `block_on`s are two owners, as two tasks are. Thread-local reads.
///
/// Tokio's task `Id` can be compared and hashed but not turned into a number, and a number is
/// what fits in an atomic: hashing the `Id` into a hasher that keeps what it is given reads the
/// number tokio counts its tasks with.
fn current_task() -> u64 {
    struct Number(u64);
    impl Hasher for Number {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            for &byte in bytes {
                self.0 = self.0.rotate_left(8) ^ u64::from(byte);
            }
        }
        fn write_u64(&mut self, number: u64) {
            self.0 = number;
        }
    }
    static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static THREAD: u64 = NEXT_THREAD.fetch_add(1, Ordering::Relaxed) | 1 << 63;
    }
    match tokio::task::try_id() {
        Some(id) => {
            let mut number = Number(0);
            id.hash(&mut number);
            number.finish()
        }
        None => THREAD.with(|thread| *thread),
    }
}

/// Runs the body of the call that acquired `lease` with the lease on top of the held stack,
/// recording at each poll which task polls it.
pub(crate) fn scope<F: Future>(
    lease: Arc<LeaseState>,
    outer: Option<Arc<Frame>>,
    body: F,
) -> impl Future<Output = F::Output> {
    let frame = Frame {
        lease: lease.clone(),
        id: Turns::ACQUIRER,
        outer,
        parent: None,
        ended: AtomicBool::new(false),
    };
    let body = HELD.scope(Arc::new(frame), body);
    async move {
        let mut body = std::pin::pin!(body);
        std::future::poll_fn(|cx| {
            lease
                .turns
                .polled_by
                .store(current_task(), Ordering::Relaxed);
            body.as_mut().poll(cx)
        })
        .await
    }
}

/// A re-entering call's turn under its parent's lease; handing it back on drop, so a body that
/// returns, panics or is dropped lets the next sibling in.
pub(crate) struct Turn {
    frame: Arc<Frame>,
}

static NEXT_FRAME: AtomicU64 = AtomicU64::new(Turns::ACQUIRER + 1);

impl Turn {
    /// Waits until `parent` is the lease's occupant, then takes the turn for a new frame above
    /// `top`. Waits at most `wait`, and fails with
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

    /// Runs `body` with this turn's frame on top of the held stack. `None`, without polling
    /// `body` again, once a poll comes from a task other than the one polling the acquiring
    /// body (the call was moved out of the body it re-entered, and runs under no lease there),
    /// or once the acquiring call released the lease (the call outlived that body, and whatever
    /// its `on_lost`, the key may be another owner's now).
    pub(crate) fn scope<F: Future>(&self, body: F) -> impl Future<Output = Option<F::Output>> {
        let lease = self.frame.lease.clone();
        let body = HELD.scope(self.frame.clone(), body);
        async move {
            let mut body = std::pin::pin!(body);
            std::future::poll_fn(|cx| {
                if lease.is_released() || !lease.turns.is_polled_by(current_task()) {
                    return Poll::Ready(None);
                }
                body.as_mut().poll(cx).map(Some)
            })
            .await
        }
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
    HELD.try_with(|top| {
        // A task polled inside another task's body is not inside it.
        top.lease
            .turns
            .is_polled_by(current_task())
            .then(|| LeaseInfo {
                state: top.lease.clone(),
            })
    })
    .ok()
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::current_task;

    #[tokio::test]
    async fn a_task_is_numbered_as_tokio_numbers_it() {
        // A future driven by block_on is in no task: it has its thread's number, which no
        // task has, and another thread's block_on has another.
        let here = current_task();
        assert!(here >> 63 == 1, "{here}");
        let elsewhere = std::thread::spawn(current_task).join().unwrap();
        assert!(
            elsewhere >> 63 == 1 && elsewhere != here,
            "{elsewhere} {here}"
        );
        let (first, second) = tokio::join!(
            tokio::spawn(async { (current_task(), tokio::task::id()) }),
            tokio::spawn(async { (current_task(), tokio::task::id()) })
        );
        let (first, second) = (first.unwrap(), second.unwrap());
        assert_eq!(first.0.to_string(), first.1.to_string());
        assert_eq!(second.0.to_string(), second.1.to_string());
        assert_ne!(first.0, second.0);
    }
}
