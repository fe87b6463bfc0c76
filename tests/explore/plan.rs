//! What one seed does, drawn up front from the seed alone: the workers ("processes", each a
//! `Locker` on a runtime of its own), the faults their stores suffer, the stalls of their
//! runtimes, and the calls each of their tasks makes.

use std::time::Duration;

use crate::calls::{OnLost, Variant, VARIANTS};
use crate::support::chaos::{Faults, SplitMix};

/// The two kinds of seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// Everything at random: faults, stalls, cancellations, nesting, joins.
    Chaos,
    /// One long lease held across many renewals while short leases on the same `Locker` come and
    /// go, every renewal answered late but well within the long lease's validity: the long
    /// lease must be kept. Nothing else goes wrong.
    RenewalPressure,
}

/// What a key is used as: every call on it is of a variant of that kind (a key is always used
/// with one `permits` value, mixing them does not exclude by design).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    Mutex,
    /// A semaphore of this many permits.
    Semaphore(u32),
    /// A mutex whose calls have a `hold_at_least`.
    Hold,
}

impl KeyKind {
    /// Whether calls of `variant` may be made on a key of this kind.
    pub fn admits(self, variant: &Variant) -> bool {
        match self {
            KeyKind::Mutex => variant.permits == 1 && variant.hold_ms == 0,
            KeyKind::Semaphore(permits) => variant.permits == permits,
            KeyKind::Hold => variant.permits == 1 && variant.hold_ms > 0,
        }
    }
}

#[derive(Clone, Debug)]
pub struct SeedPlan {
    pub seed: u64,
    pub scenario: Scenario,
    /// How many keys the calls share; a renewal-pressure seed has one more, of its long lease.
    pub keys: usize,
    /// The kind of each key.
    pub kinds: Vec<KeyKind>,
    pub workers: Vec<WorkerPlan>,
}

#[derive(Clone, Debug)]
pub struct WorkerPlan {
    /// The seed of this worker's chaos layer.
    pub chaos_seed: u64,
    /// Threads of the worker's runtime: 1 for a current-thread runtime, where one blocked thread
    /// stalls every task; 2 for a multi-thread one, where two tasks run at the same instant.
    pub threads: usize,
    pub faults: Faults,
    /// Times (from the start) at which a sibling task blocks the worker's thread, and for how
    /// long.
    pub stalls: Vec<(Duration, Duration)>,
    pub tasks: Vec<TaskPlan>,
}

#[derive(Clone, Debug)]
pub struct TaskPlan {
    pub ops: Vec<Op>,
    /// Repeats its ops until the seed's lease that must be kept is done.
    pub churn: bool,
    /// Starts every op at once, each as a task of its own, instead of one after another; the
    /// whole group this many times over (once for ops run one after another).
    pub together: bool,
    pub rounds: u64,
}

#[derive(Clone, Debug)]
pub struct Op {
    pub start_after: Duration,
    pub call: Call,
    pub cut: Cut,
    /// The call must not lose its lease (a renewal-pressure seed's long lease).
    pub must_keep_lease: bool,
}

/// How a call is cut short by its caller.
#[derive(Clone, Copy, Debug)]
pub enum Cut {
    None,
    /// Dropped when this time runs out: while acquiring, or in the body.
    Timeout(Duration),
    /// Run as a task of its own, aborted after this time.
    Abort(Duration),
}

/// One call of an annotated function.
#[derive(Clone, Debug)]
pub struct Call {
    pub key: usize,
    /// Index into [`VARIANTS`]: the attribute's ttl, wait, renew and on_lost.
    pub variant: usize,
    pub steps: Vec<Step>,
}

#[derive(Clone, Debug)]
pub enum Step {
    Sleep(Duration),
    Yield,
    /// Blocks the thread (a CPU-bound section), then yields.
    Block(Duration),
    /// Awaits another call: on the same key it re-enters the lease.
    Nested(Call),
    /// Joins two calls on the body's own key: siblings re-entering one lease.
    Joined(Call, Call),
}

impl SeedPlan {
    pub fn new(seed: u64) -> SeedPlan {
        let mut rng = SplitMix::new(seed);
        if rng.chance(100) {
            renewal_pressure(seed, &mut rng)
        } else {
            chaos(seed, &mut rng)
        }
    }

    /// How many calls the plan makes, nested ones included (churn counted once).
    pub fn calls(&self) -> usize {
        fn count(call: &Call) -> usize {
            1 + call
                .steps
                .iter()
                .map(|step| match step {
                    Step::Nested(inner) => count(inner),
                    Step::Joined(a, b) => count(a) + count(b),
                    _ => 0,
                })
                .sum::<usize>()
        }
        self.workers
            .iter()
            .flat_map(|w| &w.tasks)
            .flat_map(|t| &t.ops)
            .map(|op| count(&op.call))
            .sum()
    }
}

fn variants_where(keep: impl Fn(&Variant) -> bool) -> Vec<usize> {
    (0..VARIANTS.len())
        .filter(|&i| keep(&VARIANTS[i]))
        .collect()
}

fn chaos(seed: u64, rng: &mut SplitMix) -> SeedPlan {
    // 1–3 mutexes, in half the seeds a semaphore, in a third a key whose calls hold it: each
    // call picks one of them, so a seed makes as many calls as before.
    let mutexes = rng.between(1, 3) as usize;
    let mut kinds = vec![KeyKind::Mutex; mutexes];
    if rng.chance(500) {
        kinds.push(KeyKind::Semaphore(if rng.chance(500) { 2 } else { 3 }));
    }
    if rng.chance(330) {
        kinds.push(KeyKind::Hold);
    }
    let keys = kinds.len();
    let kinds = &kinds;
    let worker_count = rng.between(2, 4) as usize;
    let calm = rng.chance(150);
    let workers = (0..worker_count)
        .map(|_| {
            let faults = if calm {
                Faults::default()
            } else {
                chaos_faults(rng)
            };
            let stalls = if !calm && rng.chance(400) {
                (0..rng.between(1, 3))
                    .map(|_| (rng.millis(0, 150), rng.millis(20, 250)))
                    .collect()
            } else {
                Vec::new()
            };
            let threads = if rng.chance(350) { 2 } else { 1 };
            let mut tasks: Vec<TaskPlan> = (0..rng.between(1, 3))
                .map(|_| TaskPlan {
                    ops: (0..rng.between(1, 4))
                        .map(|_| chaos_op(rng, kinds))
                        .collect(),
                    churn: false,
                    together: false,
                    rounds: 1,
                })
                .collect();
            if threads > 1 && rng.chance(600) {
                tasks.extend((0..rng.between(1, 3)).map(|_| hand_off_race(rng, mutexes)));
            }
            WorkerPlan {
                chaos_seed: rng.next_u64(),
                threads,
                faults,
                stalls,
                tasks,
            }
        })
        .collect();
    SeedPlan {
        seed,
        scenario: Scenario::Chaos,
        keys,
        kinds: kinds.clone(),
        workers,
    }
}

/// A holder and a waiter started at the same instant on two threads, the holder's body as long
/// as the waiter's wait (or its caller's patience): the release and the giving up fall on the
/// same timer tick. The waiter's ttl is long, so a key left to it after it gave up is still
/// held when the seed ends.
fn hand_off_race(rng: &mut SplitMix, mutexes: usize) -> TaskPlan {
    let key = rng.below(mutexes as u64) as usize;
    let holder = variants_where(|v| v.wait_ms == 0 && KeyKind::Mutex.admits(v));
    let waiter = variants_where(|v| v.wait_ms > 0 && v.ttl_ms >= 2000 && KeyKind::Mutex.admits(v));
    let wait = Duration::from_millis(VARIANTS[waiter[0]].wait_ms);
    let holder = Op {
        start_after: Duration::ZERO,
        call: Call {
            key,
            variant: *rng.pick(&holder),
            steps: vec![Step::Sleep(wait)],
        },
        cut: Cut::None,
        must_keep_lease: false,
    };
    let waiter = Op {
        start_after: Duration::ZERO,
        call: Call {
            key,
            variant: *rng.pick(&waiter),
            steps: vec![Step::Yield],
        },
        cut: if rng.chance(500) {
            Cut::Timeout(wait)
        } else {
            Cut::None
        },
        must_keep_lease: false,
    };
    TaskPlan {
        ops: vec![holder, waiter],
        churn: false,
        together: true,
        rounds: rng.between(1, 4),
    }
}

fn chaos_faults(rng: &mut SplitMix) -> Faults {
    Faults {
        late_reply: rng.below(300) as u32,
        late_reply_max: rng.millis(0, 20),
        lost_reply: rng.below(80) as u32,
        duplicate: rng.below(100) as u32,
        grant_stall: rng.below(200) as u32,
        grant_stall_max: rng.millis(20, 300),
        renew_pause: rng.below(250) as u32,
        renew_pause_min: Duration::ZERO,
        renew_pause_max: rng.millis(10, 100),
        queued_release: rng.below(500) as u32,
    }
}

fn chaos_op(rng: &mut SplitMix, kinds: &[KeyKind]) -> Op {
    let cut = match rng.below(100) {
        0..70 => Cut::None,
        70..85 => Cut::Timeout(rng.millis(0, 60)),
        _ => Cut::Abort(rng.millis(0, 60)),
    };
    let key = rng.below(kinds.len() as u64) as usize;
    Op {
        start_after: rng.millis(0, 20),
        call: chaos_call(rng, kinds, key, 0),
        cut,
        must_keep_lease: false,
    }
}

fn chaos_call(rng: &mut SplitMix, kinds: &[KeyKind], key: usize, depth: u32) -> Call {
    let steps = (0..rng.between(1, 4))
        .map(|_| {
            let roll = rng.below(100);
            match roll {
                0..45 => Step::Sleep(rng.millis(0, 12)),
                45..60 => Step::Yield,
                60..68 => Step::Block(rng.millis(5, 100)),
                68..83 if depth < 2 => Step::Nested(chaos_call(rng, kinds, key, depth + 1)),
                83..93 if depth < 2 => Step::Joined(
                    chaos_call(rng, kinds, key, depth + 1),
                    chaos_call(rng, kinds, key, depth + 1),
                ),
                93..100 if depth < 2 => {
                    let other = rng.below(kinds.len() as u64) as usize;
                    Step::Nested(chaos_call(rng, kinds, other, depth + 1))
                }
                _ => Step::Sleep(rng.millis(0, 5)),
            }
        })
        .collect();
    let variants = variants_where(|v| kinds[key].admits(v));
    Call {
        key,
        variant: *rng.pick(&variants),
        steps,
    }
}

/// The long lease's ttl, and the shortest lease's: every renewal is answered 80–86 % of a short
/// ttl late — too late for a short lease, a twentieth of the long one's validity.
const LONG_TTL_MS: u64 = 600;
const SHORT_TTL_MS: u64 = 30;

fn renewal_pressure(seed: u64, rng: &mut SplitMix) -> SeedPlan {
    let keys = rng.between(1, 2) as usize;
    let faults = Faults {
        renew_pause: 1000,
        renew_pause_min: Duration::from_micros(SHORT_TTL_MS * 800),
        renew_pause_max: Duration::from_micros(SHORT_TTL_MS * 860),
        ..Faults::default()
    };
    let long = variants_where(|v| {
        v.ttl_ms == LONG_TTL_MS
            && v.wait_ms == 0
            && v.renew
            && v.on_lost == OnLost::Cancel
            && KeyKind::Mutex.admits(v)
    })[0];
    let short = variants_where(|v| v.ttl_ms == SHORT_TTL_MS && v.renew && KeyKind::Mutex.admits(v));
    let churn = |rng: &mut SplitMix| TaskPlan {
        ops: (0..rng.between(2, 4))
            .map(|_| Op {
                start_after: rng.millis(0, 3),
                call: Call {
                    key: rng.below(keys as u64) as usize,
                    variant: *rng.pick(&short),
                    steps: vec![Step::Sleep(rng.millis(8, 25))],
                },
                cut: Cut::None,
                must_keep_lease: false,
            })
            .collect(),
        churn: true,
        together: false,
        rounds: 1,
    };
    let holder = WorkerPlan {
        chaos_seed: rng.next_u64(),
        threads: 1,
        faults,
        stalls: Vec::new(),
        tasks: std::iter::once(TaskPlan {
            ops: vec![Op {
                start_after: Duration::ZERO,
                call: Call {
                    // A key of its own, so that nobody else's turn delays it.
                    key: keys,
                    variant: long,
                    steps: (0..8)
                        .map(|_| Step::Sleep(Duration::from_millis(LONG_TTL_MS / 6)))
                        .collect(),
                },
                cut: Cut::None,
                must_keep_lease: true,
            }],
            churn: false,
            together: false,
            rounds: 1,
        })
        .chain((0..rng.between(1, 3)).map(|_| churn(rng)))
        .collect(),
    };
    let neighbour = WorkerPlan {
        chaos_seed: rng.next_u64(),
        threads: 1,
        faults,
        stalls: Vec::new(),
        tasks: (0..rng.between(1, 2)).map(|_| churn(rng)).collect(),
    };
    SeedPlan {
        seed,
        scenario: Scenario::RenewalPressure,
        keys: keys + 1,
        kinds: vec![KeyKind::Mutex; keys + 1],
        workers: vec![holder, neighbour],
    }
}
