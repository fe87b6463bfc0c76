//! Re-entrancy: the leases held by the annotated bodies a task is inside of, and the turns that
//! keep re-entered calls on one lease from running side by side.
//!
//! A call is inside the bodies its poll is inside of *now*. A started call is a future that can
//! be awaited anywhere: started in one body, it may be handed out and awaited beside that body,
//! or after it ended, or it may be started outside any body and awaited inside one. So nothing
//! about where a call was first polled is kept. Each body has a frame, put on top of the held
//! stack (a `tokio::task_local!` scope, never a `thread_local!`: a task moves between threads)
//! for each poll of the body, and for the length of each poll only, the frame records which
//! task polls it and the frame of the body that poll comes from. The frames reachable that way
//! from the top are exactly the bodies being polled now, each inside the next. A call awaited
//! inside a body sees its lease and re-enters; a call joined beside it (`tokio::join!`),
//! spawned from it, or awaited after it ended does not: those are other owners.
//!
//! A scope is still a thread-local while the body is polled, and other tasks can be polled
//! inside that poll: a `LocalSet` the body drives with `run_until`, or a runtime of its own the
//! body drives with `block_on`, polls its tasks there, and those tasks run on later, on other
//! threads, beside the body. So the walk down the stack stops at a frame another task polls:
//! only that task's code is inside the body, and another task acquires like any other owner.
//!
//! Re-entering is not the same as running alone: a body may join two calls on its own key
//! (`tokio::join!(withdraw(id), withdraw(id))`), and both find the lease on the stack. So each
//! lease has one *occupant*, the body that may run under it now: the acquiring body at first.
//! A re-entering call waits until the occupant is the body it was called from (its parent
//! frame), takes the turn, and gives it back when it ends, whichever way. Siblings therefore go
//! one at a time, while a call nested inside a re-entered call (whose parent is that call)
//! never waits on itself. A call waits for its turn for a bounded time (its own `wait` or
//! `ttl`, whichever is longer; see `locked`): the occupant may be a future its caller has
//! stopped polling until this call ends (a `select!` loop that awaits this call in one branch
//! while the other holds the turn), and would otherwise wait for ever with its lease renewed
//! all along.
//!
//! A re-entered call runs only while its poll is inside the body it answers to: it has the
//! lease there and nowhere else. Polled anywhere else (awaited beside the body, after it, or in
//! another task), it is stopped with `LockError::Lost`, whatever its `on_lost`.
//!
//! A call can outlive the call it was started in (started, then handed out to an outer body):
//! its parent then ends while it still holds the turn, or still waits for it. The parent gives
//! back nothing it does not hold; the call answers to its nearest ancestor still running: it
//! runs inside that body, waits for that body's turn, and, when it ends, gives the turn to it.

use std::future::Future;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::lease::{LeaseInfo, LeaseState};
use crate::{LockError, LockOptions};

tokio::task_local! {
    /// The frame of the innermost body being polled.
    static HELD: Arc<Frame>;
}

/// One annotated body: the lease it runs under, and where it is being polled.
pub(crate) struct Frame {
    lease: Arc<LeaseState>,
    /// This body's identity in its lease's turns; [`Turns::ACQUIRER`] for the body that acquired.
    id: u64,
    /// The frame under the same lease this one re-entered from; `None` for the acquirer.
    parent: Option<Arc<Frame>>,
    /// Set, under the lease's turn lock, when this body has ended.
    ended: AtomicBool,
    /// While the body is being polled, by whom and inside which body; `None` between polls.
    polled: Mutex<Option<Polled>>,
}

/// One poll of a body.
struct Polled {
    /// The task that polls it ([`current_task`]).
    task: u64,
    /// The frame of the body this poll is inside of: the top of the held stack when it began.
    outer: Option<Arc<Frame>>,
}

impl Frame {
    /// Whether a call asking for `permits` can re-enter this frame's lease: a permit for a
    /// semaphore's call, the mutex for a mutex's. A call of the other kind on the same key would
    /// run beside the other holders of the kind it did not ask for. And a permit only where it
    /// is one of the call's own, numbered below `permits`: callers giving a key fewer permits
    /// share the first of them, and a call re-entering a permit beyond those would run beside
    /// as many bodies of its kind as it admits.
    pub(crate) fn takes(&self, permits: u32) -> bool {
        if !self.lease.is_permit() {
            return permits <= 1;
        }
        permits > 1
            && self
                .lease
                .permit_number()
                .is_some_and(|number| number < permits)
    }

    /// The number of the semaphore's permit this frame's lease is, where it is one.
    pub(crate) fn permit_number(&self) -> Option<u32> {
        self.lease.permit_number()
    }

    /// Whether this frame's lease is a reader's: a nested write call may not re-enter it (an
    /// upgrade), while a nested read call re-enters a writer's lease as well as a reader's.
    pub(crate) fn is_read(&self) -> bool {
        self.lease.mode == crate::Mode::Read
    }

    fn new(lease: Arc<LeaseState>, id: u64, parent: Option<Arc<Frame>>) -> Arc<Frame> {
        Arc::new(Frame {
            lease,
            id,
            parent,
            ended: AtomicBool::new(false),
            polled: Mutex::new(None),
        })
    }

    fn polled(&self) -> MutexGuard<'_, Option<Polled>> {
        self.polled.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `task` polls this body now.
    fn is_polled_by(&self, task: u64) -> bool {
        self.polled()
            .as_ref()
            .is_some_and(|polled| polled.task == task)
    }

    /// Polls `body`, this frame's body in its scope, once, recording for that poll that `task`
    /// polls it inside `outer`.
    fn poll<F: Future>(
        &self,
        task: u64,
        outer: Option<Arc<Frame>>,
        body: Pin<&mut F>,
        cx: &mut Context<'_>,
    ) -> Poll<F::Output> {
        /// Forgets the poll when it ends, a panic included: between polls a body is inside no
        /// other, and its frame keeps no other alive (a frame polled inside one it was once
        /// polled around would otherwise hold it in a cycle).
        struct Forget<'a>(&'a Frame);
        impl Drop for Forget<'_> {
            fn drop(&mut self) {
                *self.0.polled() = None;
            }
        }
        *self.polled() = Some(Polled { task, outer });
        let _forget = Forget(self);
        body.poll(cx)
    }

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

/// The frame of the innermost body this call's poll is inside of that holds `key` on locker
/// `locker_id`, if any: the body the call re-enters. One task-local access (and, inside a body,
/// one read of the current task), as this is on every call's path.
pub(crate) fn holder(locker_id: usize, key: &str) -> Option<Arc<Frame>> {
    HELD.try_with(|top| {
        frames_of(top, current_task())
            .find(|frame| frame.lease.locker_id == locker_id && frame.lease.shown_key() == key)
    })
    .ok()
    .flatten()
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

/// The frames of the bodies `task` is inside of now, innermost first: from `top`, each frame
/// being polled by `task`, then the one its poll is inside of, up to the first that another
/// task polls (or none does).
fn frames_of(top: &Arc<Frame>, task: u64) -> impl Iterator<Item = Arc<Frame>> {
    let mut next = Some(top.clone());
    std::iter::from_fn(move || {
        let frame = next.take()?;
        next = match &*frame.polled() {
            Some(polled) if polled.task == task => polled.outer.clone(),
            _ => return None,
        };
        Some(frame)
    })
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

/// Runs the body of the call that acquired `lease`, with its frame on top of the held stack
/// at each poll.
pub(crate) fn scope<F: Future>(lease: Arc<LeaseState>, body: F) -> impl Future<Output = F::Output> {
    let frame = Frame::new(lease, Turns::ACQUIRER, None);
    let body = HELD.scope(frame.clone(), body);
    async move {
        let mut body = std::pin::pin!(body);
        std::future::poll_fn(|cx| {
            // Read outside the body's own scope: the body this poll is inside of.
            let outer = HELD.try_with(Arc::clone).ok();
            frame.poll(current_task(), outer, body.as_mut(), cx)
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
    /// Waits until `parent` is the lease's occupant, then takes the turn for a new frame under
    /// it. Waits at most `wait`, and fails with
    /// [`LockError::Busy`] after it: the occupant may be a call its caller no longer polls (one
    /// branch of a `select!` whose other branch is this call), which then never hands the turn
    /// back. Fails with [`LockError::Lost`] when the lease is lost first.
    pub(crate) async fn take(parent: &Arc<Frame>, wait: Duration) -> Result<Turn, LockError> {
        let lease = &parent.lease;
        let turns = &lease.turns;
        let id = NEXT_FRAME.fetch_add(1, Ordering::Relaxed);
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
                    return Ok(Turn {
                        frame: Frame::new(lease.clone(), id, Some(parent.clone())),
                    });
                }
            }
            let deadline =
                *deadline.get_or_insert_with(|| Instant::now() + wait.min(LockOptions::MAX_WAIT));
            if Instant::now() >= deadline {
                return Err(LockError::Busy {
                    key: lease.shown_key().to_owned(),
                });
            }
            tokio::select! {
                () = handed_back => {}
                () = lease.wait_lost() => {
                    return Err(LockError::Lost {
                        key: lease.shown_key().to_owned(),
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

    /// Runs `body` with this turn's frame on top of the held stack at each poll. `None`,
    /// without polling `body` again, once a poll is not inside the body this call answers to
    /// ([`Turn::is_inside_its_body`]): the call was moved out of it (awaited beside it, after
    /// it, or in another task), has no lease there, and whatever its `on_lost`, the key may be
    /// another owner's.
    pub(crate) fn scope<F: Future>(&self, body: F) -> impl Future<Output = Option<F::Output>> {
        let frame = self.frame.clone();
        let body = HELD.scope(frame.clone(), body);
        async move {
            let mut body = std::pin::pin!(body);
            std::future::poll_fn(|cx| {
                let task = current_task();
                // Read outside the body's own scope: the body this poll is inside of.
                let outer = HELD.try_with(Arc::clone).ok();
                if !Turn::is_inside_its_body(&frame, task, outer.as_ref()) {
                    return Poll::Ready(None);
                }
                frame.poll(task, outer, body.as_mut(), cx).map(Some)
            })
            .await
        }
    }

    /// Whether a poll of re-entered `frame` by `task` inside `outer` is inside the body the call
    /// answers to: the one it was called from, or, once that one ended, its nearest ancestor
    /// still running.
    fn is_inside_its_body(frame: &Arc<Frame>, task: u64, outer: Option<&Arc<Frame>>) -> bool {
        let Some(outer) = outer else {
            return false;
        };
        let parent = frame
            .parent
            .as_ref()
            .expect("a re-entered frame has a parent");
        let is_around = |body: &Arc<Frame>| frames_of(outer, task).any(|f| Arc::ptr_eq(&f, body));
        // A parent being polled has not ended: the turn lock is only needed when it is not.
        is_around(parent) || {
            let running = {
                let _turns = frame.lease.turns.occupant();
                parent.running().clone()
            };
            !Arc::ptr_eq(&running, parent) && is_around(&running)
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
        top.is_polled_by(current_task()).then(|| LeaseInfo {
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
