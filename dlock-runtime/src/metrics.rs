//! Metrics for operators, through the [`metrics`](https://docs.rs/metrics) crate's facade. The
//! table below is repeated in the `dlock` crate's docs ("Metrics"), where users read it.
//!
//! dlock records through whatever recorder the program installs (an exporter such as
//! `metrics-exporter-prometheus`, `metrics-util`'s `DebuggingRecorder` in tests); without one,
//! nothing is recorded and a call pays one look at the facade's recorder per metric site, with no
//! clock read, allocation or lock.
//!
//! | name | kind | labels | what |
//! | --- | --- | --- | --- |
//! | `dlock_acquire_wait_seconds` | histogram | `label`, `store`, `outcome` | time from the call to the store's answer, for acquisitions that were granted (`outcome="granted"`) and for those that found the key busy for their whole wait (`outcome="busy"`); not for those that failed (a store error, a shutdown, an invalid key) |
//! | `dlock_hold_seconds` | histogram | `label`, `store` | time from the grant to the end of the lease: its release, or its loss, whichever comes first |
//! | `dlock_busy_total` | counter | `label`, `store` | acquisitions that found the key busy for their whole wait (`LockError::Busy`) |
//! | `dlock_lost_total` | counter | `label`, `store` | leases lost while held: a renewal refused, or none confirmed in time (a lease given up by a shutdown is not counted) |
//! | `dlock_renewal_failures_total` | counter | `label`, `store` | renewals of one lease that the store did not answer (an error, a time-out); each is tried again until the lease is renewed or lost; a refusal counts as a loss instead |
//! | `dlock_reentries_total` | counter | `label`, `store` | calls that re-entered a lease their task already holds, without asking the store |
//! | `dlock_leases_held` | gauge | `label`, `store` | leases held now: up at each grant, down at its release or loss |
//!
//! `label` is the holder's name: the attribute's `label = "…"`, by default the function's path
//! (`billing::submit`), or [`LockOptions::label`](crate::LockOptions::label) for
//! [`Locker::lock`](crate::Locker::lock) (default `"unlabelled"`). `store` is `memory`, `redis`,
//! `mysql`, `postgres`, `zookeeper`, `etcd`, or `custom` for a [`Backend`](crate::backend::Backend) of
//! your own. The key is never a label: keys are as many as the resources locked, and each label
//! value is a series of its own in a metrics store.
//!
//! A recorder is looked for the way the facade finds one, at the call: the one installed for
//! the thread (`metrics::with_local_recorder`), else the global one. A lease's end and its
//! renewals are reported from dlock's background threads, where only a global recorder is seen,
//! so install a global one to see every metric. dlock tells a recorder from none by its size:
//! the facade's no-op recorder, used when none is installed, has none, while every recorder that
//! records keeps some state; a zero-sized recorder of your own is taken for none (give it a
//! field).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex, Once};
use std::time::Instant;

use ::metrics::{Key, Label, Level, Metadata, Recorder, Unit};

const ACQUIRE_WAIT: &str = "dlock_acquire_wait_seconds";
const HOLD: &str = "dlock_hold_seconds";
const BUSY: &str = "dlock_busy_total";
const LOST: &str = "dlock_lost_total";
const RENEWAL_FAILURES: &str = "dlock_renewal_failures_total";
const REENTRIES: &str = "dlock_reentries_total";
const LEASES_HELD: &str = "dlock_leases_held";

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// When an acquisition starts, where something will report its wait: a recorder is installed,
/// or debug logs are on. `None` otherwise, so that without either an acquisition reads no clock
/// for them.
pub(crate) fn started() -> Option<Instant> {
    let mut recording = false;
    ::metrics::with_recorder(|recorder| recording = std::mem::size_of_val(recorder) != 0);
    // The logs that report the wait are the locker's, filtered by its module.
    let logged = tracing::enabled!(target: "dlock_runtime::locker", tracing::Level::DEBUG);
    (recording || logged).then(Instant::now)
}

/// Runs `record` with the installed recorder, if there is one. The facade hands out its no-op
/// recorder when none is installed, and that one is a zero-sized type: checking the size spares
/// the no-op case everything `record` would do (clock reads, label look-ups).
fn with_recorder(record: impl FnOnce(&dyn Recorder)) {
    ::metrics::with_recorder(|recorder| {
        if std::mem::size_of_val(recorder) != 0 {
            record(recorder);
        }
    });
}

/// The label sets of one (`label`, `store`) pair, made once and kept for the life of the
/// process, so that each metric's key is built from static parts: no allocation per call.
/// There is one per pair of values a program uses, a handful: labels are `&'static str`s
/// written into it.
struct Labels {
    plain: [Label; 2],
    granted: [Label; 3],
    busy: [Label; 3],
}

/// The label sets of every pair seen, made on first use.
static LABELS: LazyLock<Mutex<HashMap<(&'static str, &'static str), &'static Labels>>> =
    LazyLock::new(Mutex::default);

fn labels(label: &'static str, store: &'static str) -> &'static Labels {
    let mut all = LABELS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    all.entry((label, store)).or_insert_with(|| {
        let pair = [
            Label::from_static_parts("label", label),
            Label::from_static_parts("store", store),
        ];
        let with = |outcome| {
            [
                pair[0].clone(),
                pair[1].clone(),
                Label::from_static_parts("outcome", outcome),
            ]
        };
        Box::leak(Box::new(Labels {
            granted: with("granted"),
            busy: with("busy"),
            plain: pair,
        }))
    })
}

/// Describes every metric (unit and help text) to the first recorder seen: an exporter shows
/// them as Prometheus `# HELP` and `# TYPE` lines.
fn describe(recorder: &dyn Recorder) {
    static DESCRIBED: Once = Once::new();
    DESCRIBED.call_once(|| {
        let histograms = [
            (
                ACQUIRE_WAIT,
                "Time from an acquisition's call to the store's answer, granted or busy.",
            ),
            (HOLD, "Time from a lease's grant to its release or loss."),
        ];
        for (name, help) in histograms {
            recorder.describe_histogram(name.into(), Some(Unit::Seconds), help.into());
        }
        let counters = [
            (
                BUSY,
                "Acquisitions that found the key busy for their whole wait.",
            ),
            (
                LOST,
                "Leases lost while held: a renewal refused or not confirmed in time.",
            ),
            (
                RENEWAL_FAILURES,
                "Renewals of a lease the store did not answer (retried).",
            ),
            (
                REENTRIES,
                "Calls that re-entered a lease their task already held.",
            ),
        ];
        for (name, help) in counters {
            recorder.describe_counter(name.into(), Some(Unit::Count), help.into());
        }
        recorder.describe_gauge(
            LEASES_HELD.into(),
            Some(Unit::Count),
            "Leases held now.".into(),
        );
    });
}

fn key(name: &'static str, labels: &'static [Label]) -> Key {
    Key::from_static_parts(name, labels)
}

fn count(name: &'static str, label: &'static str, store: &'static str) {
    with_recorder(|recorder| {
        describe(recorder);
        let labels = &labels(label, store).plain;
        recorder
            .register_counter(&key(name, labels), &METADATA)
            .increment(1);
    });
}

/// An acquisition started at `started` ([`started`], so `None` where no recorder was installed
/// then, whose wait is not known) found the key busy for its whole wait.
pub(crate) fn busy(label: &'static str, store: &'static str, started: Option<Instant>) {
    with_recorder(|recorder| {
        describe(recorder);
        let labels = labels(label, store);
        if let Some(started) = started {
            recorder
                .register_histogram(&key(ACQUIRE_WAIT, &labels.busy), &METADATA)
                .record(started.elapsed().as_secs_f64());
        }
        recorder
            .register_counter(&key(BUSY, &labels.plain), &METADATA)
            .increment(1);
    });
}

/// A call re-entered a lease its task holds.
pub(crate) fn reentered(label: &'static str, store: &'static str) {
    count(REENTRIES, label, store);
}

/// What a lease's metrics need to know of it: its labels, and when it was granted where a
/// recorder was installed then (its end is recorded only then, so that the gauge of held
/// leases goes down once for each time it went up).
pub(crate) struct Held {
    label: &'static str,
    store: &'static str,
    granted_at: Option<Instant>,
    ended: AtomicBool,
    /// Whether the lease is one its caller asked for, rather than one dlock takes for itself
    /// (a semaphore's turnstile): only those count, and only their loss is news.
    pub(crate) asked_for: bool,
}

impl Held {
    /// A lease no metric counted as held, until its acquisition sets it: one made outside an
    /// acquisition (a unit test's) stays so.
    pub(crate) const fn uncounted() -> Held {
        Held {
            label: crate::LockOptions::UNLABELLED,
            store: "custom",
            granted_at: None,
            ended: AtomicBool::new(true),
            asked_for: false,
        }
    }

    /// A lease granted to an acquisition started at `started` (see [`busy`]): records the wait
    /// and counts the lease as held.
    pub(crate) fn granted(
        label: &'static str,
        store: &'static str,
        started: Option<Instant>,
    ) -> Held {
        let mut held = Held {
            label,
            store,
            granted_at: None,
            ended: AtomicBool::new(false),
            asked_for: true,
        };
        with_recorder(|recorder| {
            describe(recorder);
            let now = Instant::now();
            let labels = labels(label, store);
            if let Some(started) = started {
                recorder
                    .register_histogram(&key(ACQUIRE_WAIT, &labels.granted), &METADATA)
                    .record(now.saturating_duration_since(started).as_secs_f64());
            }
            recorder
                .register_gauge(&key(LEASES_HELD, &labels.plain), &METADATA)
                .increment(1.0);
            held.granted_at = Some(now);
        });
        held
    }

    /// The lease ended (released, or lost): records how long it was held and counts it out, once
    /// whichever way it ended, and only if it was counted in.
    pub(crate) fn end(&self) {
        let Some(granted_at) = self.granted_at else {
            return;
        };
        if self.ended.swap(true, Ordering::AcqRel) {
            return;
        }
        with_recorder(|recorder| {
            let labels = &labels(self.label, self.store).plain;
            recorder
                .register_histogram(&key(HOLD, labels), &METADATA)
                .record(granted_at.elapsed().as_secs_f64());
            recorder
                .register_gauge(&key(LEASES_HELD, labels), &METADATA)
                .decrement(1.0);
        });
    }

    /// The lease was lost while held.
    pub(crate) fn lost(&self) {
        if self.asked_for {
            count(LOST, self.label, self.store);
        }
    }

    /// A renewal of the lease went unanswered.
    pub(crate) fn renewal_failed(&self) {
        if self.asked_for {
            count(RENEWAL_FAILURES, self.label, self.store);
        }
    }
}

/// The `store` label of a backend, from its type's name: each of dlock's stores by its name,
/// and `custom` for any other.
pub(crate) fn store_of(type_name: &str) -> &'static str {
    match type_name.rsplit("::").next().unwrap_or(type_name) {
        "MemoryBackend" => "memory",
        "RedisBackend" => "redis",
        "MysqlBackend" => "mysql",
        "PostgresBackend" => "postgres",
        "ZookeeperBackend" => "zookeeper",
        "EtcdBackend" => "etcd",
        _ => "custom",
    }
}
