//! The checker: every body reports itself here as it starts, at each later poll and as it ends;
//! the checker judges each report against what the store told the caller (the chaos layer's
//! [`LeaseBook`]) and against the other bodies inside the same key.
//!
//! A finding is only recorded when it cannot be the thread's own bad luck. The runtime checks a
//! lease's validity a moment before the body's own check, and the operating system may pause a
//! thread between the two: so a body polled on an invalid lease counts only when the lease was
//! invalid for sure more than [`GRACE`] earlier, and only when the thread was not preempted
//! during that poll (every task of a worker runs [`marked`], which notes the thread's count of
//! involuntary context switches as each poll starts). Blocking the thread on purpose (a sleep)
//! is a voluntary switch and does not count.

use std::cell::Cell;
use std::collections::HashMap;
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use dlock::{current_lease, LeaseInfo};

use crate::calls::{OnLost, Variant};
use crate::support::chaos::LeaseBook;

/// How long after a lease was invalid for sure a poll of its body still counts as a race of
/// threads, not a finding.
pub const GRACE: Duration = Duration::from_millis(20);

thread_local! {
    /// The thread's involuntary context switches when the poll of the current task began.
    static POLL_MARK: Cell<Option<i64>> = const { Cell::new(None) };
}

/// How many times the operating system has preempted the calling thread.
#[cfg(target_os = "linux")]
fn preemptions() -> i64 {
    // SAFETY: getrusage writes one plain struct, which is zeroed first.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut usage);
        usage.ru_nivcsw
    }
}

#[cfg(not(target_os = "linux"))]
fn preemptions() -> i64 {
    0
}

/// Runs `task`, noting at the start of each of its polls how often the thread has been preempted.
pub async fn marked<F: Future>(task: F) -> F::Output {
    let mut task = std::pin::pin!(task);
    std::future::poll_fn(|cx| {
        let outer = POLL_MARK.replace(Some(preemptions()));
        let poll = task.as_mut().poll(cx);
        POLL_MARK.set(outer);
        poll
    })
    .await
}

/// Whether the thread was preempted since the current task's poll began (true outside
/// [`marked`]: nobody can say).
fn preempted_in_this_poll() -> bool {
    POLL_MARK.get().is_none_or(|mark| preemptions() != mark)
}

/// How late a tick of the starvation monitor must be for the process to count as starved.
const STARVED: Duration = Duration::from_millis(50);

type Spans = Arc<Mutex<VecDeque<(Instant, Instant)>>>;

/// The spans of time (start, end) in which the monitor's ticks came late, newest last: when the
/// whole process was starved of CPU by the machine, and whether a lease was kept in time cannot
/// be judged. A thread of its own sleeps in 5 ms ticks and notes each that ends `STARVED` late.
static STARVATION: LazyLock<Spans> = LazyLock::new(|| {
    let spans = Spans::default();
    let record = spans.clone();
    std::thread::Builder::new()
        .name("explore-starvation".into())
        .spawn(move || loop {
            let tick = Duration::from_millis(5);
            let before = Instant::now();
            std::thread::sleep(tick);
            let after = Instant::now();
            if after - before > tick + STARVED {
                let mut spans = record.lock().unwrap();
                spans.push_back((before, after));
                while spans.len() > 10_000 {
                    spans.pop_front();
                }
            }
        })
        .expect("cannot start the starvation monitor");
    spans
});

/// Starts the starvation monitor, if it is not running yet.
pub fn watch_starvation() {
    LazyLock::force(&STARVATION);
}

/// Whether the process was starved of CPU at some time between `from` and `to`.
pub fn starved_between(from: Instant, to: Instant) -> bool {
    STARVATION
        .lock()
        .unwrap()
        .iter()
        .any(|&(start, end)| start < to && end > from)
}

/// The kinds of finding, each the property it breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// A body was first polled on a lease that was invalid for sure: a grant that reached a
    /// stalled caller after it expired.
    StartedOnExpiredLease,
    /// A body under `on_lost = "cancel"` was polled again after its lease was invalid for sure.
    ResumedAfterExpiry,
    /// A re-entered body under `on_lost = "cancel"`, inside bodies that all continue, was polled
    /// after the lease was invalid for sure: its own on_lost was ignored.
    ReenteredCancelIgnored,
    /// Two bodies of one key ran at once, each on a lease the client held (for a semaphore of N
    /// permits: N + 1 bodies).
    TwoHoldersAtOnce,
    /// Two sibling calls re-entering one lease ran at once.
    SiblingsAtOnce,
    /// A body entered after another of its key, with a fence no greater than that one's.
    FenceOutOfOrder,
    /// A body entered a key before the hold (`hold_at_least`) of an earlier body, released on
    /// a lease still valid, had run out.
    EnteredDuringHold,
    /// A key stayed held after every worker had finished and released.
    HeldByNobody,
    /// A lease whose every renewal was answered within a tenth of its ttl was lost.
    KeptLeaseLost,
    /// A worker panicked, hung or got an error no fault explains.
    Broken,
}

impl Kind {
    /// The class of bug a finding of this kind points at.
    pub fn meaning(self) -> &'static str {
        match self {
            Kind::StartedOnExpiredLease => "a body started on a lease that had already expired",
            Kind::ResumedAfterExpiry => "a body resumed after its lease ran out",
            Kind::ReenteredCancelIgnored => "a re-entered call ignored its own on_lost = cancel",
            Kind::TwoHoldersAtOnce => "two bodies ran at once on one key",
            Kind::SiblingsAtOnce => "two siblings joined inside a body ran at once",
            Kind::FenceOutOfOrder => "fences did not rise in order of entry",
            Kind::EnteredDuringHold => "a body entered a key before an earlier body's hold ended",
            Kind::HeldByNobody => "a key was held by nobody",
            Kind::KeptLeaseLost => "a lease renewed in time was lost",
            Kind::Broken => "a worker panicked, hung or failed unexpectedly",
        }
    }
}

/// One finding.
#[derive(Clone, Debug)]
pub struct Finding {
    pub kind: Kind,
    pub detail: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.detail)
    }
}

/// One body a task is inside of, as its nested calls see it.
#[derive(Clone, Debug)]
pub struct Frame {
    pub id: u64,
    pub key: String,
    pub fence: u64,
    pub on_lost: OnLost,
}

struct Active {
    id: u64,
    worker: usize,
    fence: u64,
    lease: LeaseInfo,
}

/// A hold (`hold_at_least`) that keeps a key from every other body until `until`.
struct Hold {
    until: Instant,
    fence: u64,
    worker: usize,
    /// When its body ended.
    ended: Instant,
}

struct KeyState {
    /// The key's permits: 1 for a mutex.
    permits: usize,
    active: Vec<Active>,
    /// Per store key (the key itself for a mutex, the permit's for a semaphore, whose fences
    /// are counted per permit): the greatest fence of an outermost body that entered, and when.
    last_entry: HashMap<String, (u64, Instant)>,
    /// The holds of the bodies that ended on a lease still valid.
    holds: Vec<Hold>,
    /// No hold of a body of this key lasts past this instant.
    holds_end: Option<Instant>,
}

/// How much earlier than a hold's end by the book another body may enter: the store's expiry is
/// set from the hold's end by a clock read a moment later (on Redis, as a time to live).
const HOLD_TOLERANCE: Duration = Duration::from_millis(10);

/// How long a lease must stay valid (by the book) after its body ended for its hold to be
/// judged: the time its release takes to reach the store.
const RELEASE_MARGIN: Duration = Duration::from_millis(30);

/// What happened in one seed, besides the findings.
#[derive(Default, Debug, Clone, Copy)]
pub struct Tally {
    pub bodies: u64,
    pub lost: u64,
    pub busy: u64,
    pub store_errors: u64,
    pub cut: u64,
    /// Suspects left unjudged: a poll during which the thread was preempted, a kept lease lost
    /// while the process was starved of CPU.
    pub unjudged: u64,
    /// Bodies on a semaphore's permit, and how many of them could not be told which permit
    /// they hold (two permits granted with the same fence), for which neither the lease's
    /// validity nor the fence order is judged.
    pub permit_bodies: u64,
    pub permit_unknown: u64,
    /// Bodies with a hold that ended on a lease still valid, whose hold is judged.
    pub holds: u64,
}

impl std::ops::AddAssign for Tally {
    fn add_assign(&mut self, other: Tally) {
        self.bodies += other.bodies;
        self.lost += other.lost;
        self.busy += other.busy;
        self.store_errors += other.store_errors;
        self.cut += other.cut;
        self.unjudged += other.unjudged;
        self.permit_bodies += other.permit_bodies;
        self.permit_unknown += other.permit_unknown;
        self.holds += other.holds;
    }
}

/// The checker of one seed.
pub struct Checker {
    book: Arc<LeaseBook>,
    keys: Mutex<HashMap<String, KeyState>>,
    findings: Mutex<Vec<Finding>>,
    tally: Mutex<Tally>,
    next_id: AtomicU64,
}

/// A body inside its key, from its first poll until it ends (returns, or is dropped).
pub struct Inside<'a> {
    checker: &'a Checker,
    pub frame: Frame,
    worker: usize,
    lease: LeaseInfo,
    /// The key the store holds the lease under: the key for a mutex, a permit's key for a
    /// semaphore (`None` where the permit could not be told).
    store_key: Option<String>,
    hold: Duration,
    /// The frames of the same lease around this body: it re-entered if there are any.
    same_lease_outer: Vec<OnLost>,
    /// The ids of every body around this one.
    outer_ids: Vec<u64>,
    reported: bool,
}

impl Checker {
    pub fn new(book: Arc<LeaseBook>) -> Self {
        Checker {
            book,
            keys: Mutex::default(),
            findings: Mutex::default(),
            tally: Mutex::default(),
            next_id: AtomicU64::new(1),
        }
    }

    pub fn report(&self, kind: Kind, detail: String) {
        self.findings.lock().unwrap().push(Finding { kind, detail });
    }

    pub fn findings(&self) -> Vec<Finding> {
        self.findings.lock().unwrap().clone()
    }

    pub fn count(&self, add: impl FnOnce(&mut Tally)) {
        add(&mut self.tally.lock().unwrap());
    }

    pub fn tally(&self) -> Tally {
        *self.tally.lock().unwrap()
    }

    /// Called by a body as its first statement, inside the annotated function; `outer` are the
    /// frames of the bodies it runs inside, innermost last.
    pub fn enter(
        &self,
        worker: usize,
        outer: &[Frame],
        on_lost: OnLost,
        variant: &Variant,
    ) -> Inside<'_> {
        let now = Instant::now();
        let lease = current_lease().expect("a body runs inside its lease");
        let store_key = if variant.permits > 1 {
            self.book.permit_of(lease.key(), lease.fence())
        } else {
            Some(lease.key().to_owned())
        };
        let frame = Frame {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            key: lease.key().to_owned(),
            fence: lease.fence(),
            on_lost,
        };
        let same_lease_outer = outer
            .iter()
            .filter(|f| f.key == frame.key && f.fence == frame.fence)
            .map(|f| f.on_lost)
            .collect();
        let mut inside = Inside {
            checker: self,
            frame,
            worker,
            lease,
            store_key,
            hold: Duration::from_millis(variant.hold_ms),
            same_lease_outer,
            outer_ids: outer.iter().map(|f| f.id).collect(),
            reported: false,
        };
        // Under either on_lost, a body must never start on an invalid lease. First, before
        // anything here that takes a lock.
        inside.check_poll(true);
        let permit_unknown = inside.store_key.is_none();
        self.count(|t| {
            t.bodies += 1;
            if variant.permits > 1 {
                t.permit_bodies += 1;
                t.permit_unknown += u64::from(permit_unknown);
            }
        });
        let mut keys = self.keys.lock().unwrap();
        let state = keys
            .entry(inside.frame.key.clone())
            .or_insert_with(|| KeyState {
                permits: variant.permits as usize,
                active: Vec::new(),
                last_entry: HashMap::new(),
                holds: Vec::new(),
                holds_end: None,
            });
        if inside.lease.is_held() {
            // The other leases held inside the key, one entry per lease (bodies re-entering
            // one lease share its fence).
            let mut others: Vec<&Active> = Vec::new();
            for other in &state.active {
                if outer.iter().any(|f| f.id == other.id) || !other.lease.is_held() {
                    continue;
                }
                if other.fence == inside.frame.fence {
                    self.report(
                        Kind::SiblingsAtOnce,
                        format!(
                            "`{}`: worker {} entered with fence {} while worker {} was inside with the same fence, both leases held",
                            inside.frame.key, worker, inside.frame.fence, other.worker
                        ),
                    );
                } else if others.iter().all(|o| o.fence != other.fence) {
                    others.push(other);
                }
            }
            if others.len() >= state.permits {
                let inside_now: Vec<String> = others
                    .iter()
                    .map(|o| format!("worker {} with fence {}", o.worker, o.fence))
                    .collect();
                self.report(
                    Kind::TwoHoldersAtOnce,
                    format!(
                        "`{}` ({} permits): worker {} entered with fence {} while {} were inside, every lease held",
                        inside.frame.key,
                        state.permits,
                        worker,
                        inside.frame.fence,
                        inside_now.join(", ")
                    ),
                );
            }
        }
        if inside.same_lease_outer.is_empty() {
            // A hold keeps everyone else out until its end, held or not.
            state.holds.retain(|h| h.until > now);
            for hold in &state.holds {
                if hold.fence == inside.frame.fence {
                    continue;
                }
                if starved_between(hold.ended, now) {
                    self.count(|t| t.unjudged += 1);
                    continue;
                }
                self.report(
                    Kind::EnteredDuringHold,
                    format!(
                        "`{}`: worker {} entered with fence {} {:?} before the hold of worker {}'s body with fence {} ran out ({:?} after that body ended)",
                        inside.frame.key,
                        worker,
                        inside.frame.fence,
                        hold.until - now,
                        hold.worker,
                        hold.fence,
                        now - hold.ended
                    ),
                );
            }
        }
        if let (true, Some(order_key)) = (inside.same_lease_outer.is_empty(), &inside.store_key) {
            match state.last_entry.get(order_key).copied() {
                Some((last, at)) if inside.frame.fence <= last => {
                    if preempted_in_this_poll() {
                        self.count(|t| t.unjudged += 1);
                    } else if now > at + GRACE {
                        self.report(
                            Kind::FenceOutOfOrder,
                            format!(
                                "`{}`: worker {} entered with fence {}, {:?} after a body with fence {} entered",
                                order_key,
                                worker,
                                inside.frame.fence,
                                now - at,
                                last
                            ),
                        );
                    }
                }
                _ => {
                    state
                        .last_entry
                        .insert(order_key.clone(), (inside.frame.fence, now));
                }
            }
        }
        state.active.push(Active {
            id: inside.frame.id,
            worker,
            fence: inside.frame.fence,
            lease: inside.lease.clone(),
        });
        inside
    }

    /// The bodies inside `key` on a lease their client holds, other than `id` and the bodies
    /// around it: (worker, fence) of each, one per lease; and the key's permits.
    fn holders_besides(&self, key: &str, id: u64, outer_ids: &[u64]) -> (Vec<(usize, u64)>, usize) {
        let keys = self.keys.lock().unwrap();
        keys.get(key).map_or_else(
            || (Vec::new(), 1),
            |state| {
                let mut holders: Vec<(usize, u64)> = Vec::new();
                for a in &state.active {
                    if a.id != id
                        && !outer_ids.contains(&a.id)
                        && a.lease.is_held()
                        && holders.iter().all(|&(_, fence)| fence != a.fence)
                    {
                        holders.push((a.worker, a.fence));
                    }
                }
                (holders, state.permits)
            },
        )
    }

    /// Until when the holds of `key`'s bodies may keep it held, if any had one.
    pub fn holds_end(&self, key: &str) -> Option<Instant> {
        self.keys.lock().unwrap().get(key).and_then(|s| s.holds_end)
    }

    fn leave(&self, inside: &Inside<'_>) {
        let now = Instant::now();
        // The hold of an outermost body (a re-entered one ends before its lease is released),
        // judged where the lease was still valid for a while after the body ended, by the
        // client and by the book (a refused renewal, or a validity about to run out, may let
        // the key go before its release sets the hold's expiry).
        let hold = (!inside.hold.is_zero() && inside.same_lease_outer.is_empty())
            .then(|| {
                let booked = self
                    .book
                    .lease(inside.store_key.as_deref()?, inside.frame.fence)?;
                Some((booked, inside.lease.is_held()))
            })
            .flatten();
        let mut keys = self.keys.lock().unwrap();
        let Some(state) = keys.get_mut(&inside.frame.key) else {
            return;
        };
        state.active.retain(|a| a.id != inside.frame.id);
        if !inside.hold.is_zero() {
            let end = now + inside.hold;
            state.holds_end = Some(state.holds_end.map_or(end, |e| e.max(end)));
        }
        if let Some((booked, held)) = hold {
            if held
                && booked.refused_at.is_none()
                && booked.valid_at_most_until > now + RELEASE_MARGIN
            {
                self.count(|t| t.holds += 1);
                state.holds.push(Hold {
                    until: booked.granted_at + inside.hold - HOLD_TOLERANCE,
                    fence: inside.frame.fence,
                    worker: inside.worker,
                    ended: now,
                });
            }
        }
    }
}

impl Inside<'_> {
    /// Judges one poll of the body: `first` for its first.
    pub fn check_poll(&mut self, first: bool) {
        // Read before anything that may block (the book's lock): a thread waiting for a lock
        // is not preempted, and its wait is not the runtime's.
        let now = Instant::now();
        if self.reported || self.lease.is_held() {
            return;
        }
        let preempted = preempted_in_this_poll();
        let Some(since) = self
            .store_key
            .as_deref()
            .and_then(|key| self.checker.book.invalid_since(key, self.frame.fence))
        else {
            return;
        };
        if now <= since + GRACE {
            return;
        }
        if preempted {
            self.checker.count(|t| t.unjudged += 1);
            return;
        }
        let reentered = !self.same_lease_outer.is_empty();
        let kind = if reentered
            && !first
            && self.same_lease_outer.iter().all(|m| *m == OnLost::Continue)
        {
            Kind::ReenteredCancelIgnored
        } else if first {
            Kind::StartedOnExpiredLease
        } else {
            Kind::ResumedAfterExpiry
        };
        self.reported = true;
        self.checker.report(
            kind,
            format!(
                "`{}` fence {}: worker {}'s {}body (on_lost {:?}) {} {:?} after its lease was invalid for sure",
                self.frame.key,
                self.frame.fence,
                self.worker,
                if reentered { "re-entered " } else { "" },
                self.frame.on_lost,
                if first { "started" } else { "was polled again" },
                now - since
            ),
        );
        // A body the runtime must not poll runs all the same: it is inside beside whoever holds
        // the key now.
        let (holders, permits) =
            self.checker
                .holders_besides(&self.frame.key, self.frame.id, &self.outer_ids);
        if holders.len() < permits {
            return;
        }
        for (worker, fence) in holders {
            self.checker.report(
                Kind::TwoHoldersAtOnce,
                format!(
                    "`{}`: worker {}'s body with fence {} ran on its invalid lease while worker {worker} was inside with fence {fence}",
                    self.frame.key, self.worker, self.frame.fence
                ),
            );
        }
    }
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.checker.leave(self);
    }
}
