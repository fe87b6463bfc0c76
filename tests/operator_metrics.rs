//! The metrics dlock records through the `metrics` facade, read back from a `DebuggingRecorder`
//! installed as the global recorder of this test binary (a lease's end and its renewals are
//! recorded from dlock's background threads, which only a global recorder sees).
//!
//! Each test reads its own labels' series only; they take turns (`SERIAL`) all the same, so that
//! a reading never comes between another test's grant and release.

#[cfg(feature = "redis")]
mod support;

use std::sync::OnceLock;
use std::time::Duration;

use dlock::backend::{AcquireRequest, Acquired, Backend, MemoryBackend, Renewal};
use dlock::{distributed_lock, LockError, LockOptions, Locker, Owner};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// This test's turn, with the recorder installed.
async fn turn() -> tokio::sync::MutexGuard<'static, ()> {
    let turn = SERIAL.lock().await;
    snapshotter();
    turn
}

fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this binary");
        snapshotter
    })
}

/// A series' labels, as (name, value) pairs.
type Labels = Vec<(String, String)>;

/// What one label's series recorded so far: name, labels, value.
#[derive(Debug, Default)]
struct Readings(Vec<(String, Labels, DebugValue)>);

/// A series: its name and labels.
type Series = (String, Labels);

/// Every series recorded so far. A snapshot of the `DebuggingRecorder` hands out what was
/// recorded since the one before (counters and gauges as changes, which is all dlock makes of a
/// gauge), so readings are added up here.
static TOTALS: std::sync::Mutex<Vec<(Series, DebugValue)>> = std::sync::Mutex::new(Vec::new());

/// `DebugValue` is not `Clone`.
fn copy(value: &DebugValue) -> DebugValue {
    match value {
        DebugValue::Counter(n) => DebugValue::Counter(*n),
        DebugValue::Gauge(value) => DebugValue::Gauge(*value),
        DebugValue::Histogram(values) => DebugValue::Histogram(values.clone()),
    }
}

impl Readings {
    /// The series of `label`, as totals since the binary started.
    fn of(label: &str) -> Readings {
        let mut totals = TOTALS.lock().unwrap();
        for (key, _unit, _help, value) in snapshotter().snapshot().into_vec() {
            let (_kind, key) = key.into_parts();
            let labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            let series = (key.name().to_owned(), labels);
            match totals.iter_mut().find(|(s, _)| *s == series) {
                None => totals.push((series, value)),
                Some((_, total)) => match (total, value) {
                    (DebugValue::Counter(total), DebugValue::Counter(n)) => *total += n,
                    (DebugValue::Gauge(total), DebugValue::Gauge(change)) => {
                        *total = (total.into_inner() + change.into_inner()).into()
                    }
                    (DebugValue::Histogram(total), DebugValue::Histogram(values)) => {
                        total.extend(values)
                    }
                    (total, value) => panic!("{series:?} changed kind: {total:?}, {value:?}"),
                },
            }
        }
        Readings(
            totals
                .iter()
                .filter(|((_, labels), _)| labels.iter().any(|(k, v)| k == "label" && v == label))
                .map(|((name, labels), value)| (name.clone(), labels.clone(), copy(value)))
                .collect(),
        )
    }

    fn find(&self, name: &str, extra: &[(&str, &str)]) -> Option<&DebugValue> {
        self.0
            .iter()
            .find(|(n, labels, _)| {
                n == name
                    && extra
                        .iter()
                        .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, _, value)| value)
    }

    fn counter(&self, name: &str) -> u64 {
        match self.find(name, &[]) {
            Some(DebugValue::Counter(n)) => *n,
            None => 0,
            Some(other) => panic!("{name} is no counter: {other:?}"),
        }
    }

    fn gauge(&self, name: &str) -> Option<f64> {
        match self.find(name, &[]) {
            Some(DebugValue::Gauge(value)) => Some(value.into_inner()),
            None => None,
            Some(other) => panic!("{name} is no gauge: {other:?}"),
        }
    }

    fn observations(&self, name: &str, extra: &[(&str, &str)]) -> Vec<f64> {
        match self.find(name, extra) {
            Some(DebugValue::Histogram(values)) => values.iter().map(|v| v.into_inner()).collect(),
            None => Vec::new(),
            Some(other) => panic!("{name} is no histogram: {other:?}"),
        }
    }

    /// Every series carries `store`, none the key.
    fn assert_labels(&self, store: &str) {
        assert!(!self.0.is_empty(), "nothing recorded");
        for (name, labels, _) in &self.0 {
            assert!(
                labels.iter().any(|(k, v)| k == "store" && v == store),
                "{name} {labels:?}: no store=\"{store}\""
            );
            assert!(
                labels
                    .iter()
                    .all(|(k, _)| ["label", "store", "outcome"].contains(&k.as_str())),
                "{name} {labels:?}: a label other than label, store and outcome"
            );
        }
    }
}

#[distributed_lock(key = "settle:<id>", locker = locker)]
async fn settle(locker: &Locker, id: u32) -> Result<u32, LockError> {
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(id)
}

#[tokio::test]
async fn a_grant_and_release_record_one_wait_and_one_hold_under_the_functions_path() {
    let _turn = turn().await;
    let label = "operator_metrics::settle";
    let locker = Locker::memory();
    assert_eq!(settle(&locker, 7).await.unwrap(), 7);

    let readings = Readings::of(label);
    readings.assert_labels("memory");
    let waits = readings.observations("dlock_acquire_wait_seconds", &[("outcome", "granted")]);
    assert_eq!(waits.len(), 1, "{readings:?}");
    let holds = readings.observations("dlock_hold_seconds", &[]);
    assert_eq!(holds.len(), 1, "{readings:?}");
    assert!(
        holds[0] >= 0.020,
        "held for {}s, the body slept 20 ms",
        holds[0]
    );
    assert_eq!(
        readings.gauge("dlock_leases_held"),
        Some(0.0),
        "{readings:?}"
    );
    assert_eq!(readings.counter("dlock_busy_total"), 0);
    locker.shutdown().await.unwrap();
}

#[distributed_lock(key = "report", locker = locker, label = "reports::nightly")]
async fn nightly_report(locker: &Locker) -> Result<(), LockError> {
    Ok(())
}

#[tokio::test]
async fn a_busy_try_counts_busy_and_its_wait() {
    let _turn = turn().await;
    let label = "reports::nightly";
    let locker = Locker::memory();
    let holder = locker
        .lock("report", LockOptions::new().label("reports::holder"))
        .await
        .unwrap();
    assert!(matches!(
        nightly_report(&locker).await,
        Err(LockError::Busy { .. })
    ));

    let readings = Readings::of(label);
    readings.assert_labels("memory");
    assert_eq!(readings.counter("dlock_busy_total"), 1, "{readings:?}");
    let waits = readings.observations("dlock_acquire_wait_seconds", &[("outcome", "busy")]);
    assert_eq!(waits.len(), 1, "{readings:?}");
    // A busy try held nothing.
    assert_eq!(readings.gauge("dlock_leases_held"), None, "{readings:?}");
    let holder_readings = Readings::of("reports::holder");
    assert_eq!(holder_readings.gauge("dlock_leases_held"), Some(1.0));
    holder.release().await.unwrap();
    assert_eq!(
        Readings::of("reports::holder").gauge("dlock_leases_held"),
        Some(0.0)
    );
    locker.shutdown().await.unwrap();
}

#[distributed_lock(key = "acct:<id>", locker = locker, label = "accounts::transfer")]
async fn transfer(locker: &Locker, id: u32) -> Result<(), LockError> {
    withdraw(locker, id).await
}

#[distributed_lock(key = "acct:<id>", locker = locker, label = "accounts::withdraw")]
async fn withdraw(locker: &Locker, id: u32) -> Result<(), LockError> {
    Ok(())
}

#[tokio::test]
async fn a_reentered_call_counts_a_reentry_and_no_second_lease() {
    let _turn = turn().await;
    let locker = Locker::memory();
    transfer(&locker, 1).await.unwrap();

    let inner = Readings::of("accounts::withdraw");
    assert_eq!(inner.counter("dlock_reentries_total"), 1, "{inner:?}");
    inner.assert_labels("memory");
    // The re-entered call asked the store for nothing.
    assert!(inner
        .observations("dlock_acquire_wait_seconds", &[])
        .is_empty());
    let outer = Readings::of("accounts::transfer");
    assert_eq!(outer.counter("dlock_reentries_total"), 0, "{outer:?}");
    assert_eq!(outer.observations("dlock_hold_seconds", &[]).len(), 1);
    locker.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_lost_lease_counts_lost_and_leaves_the_held_gauge() {
    let _turn = turn().await;
    let label = "jobs::rebuild_index";
    let store = MemoryBackend::new();
    let locker = Locker::with_backend(store.clone());
    let options = LockOptions::new()
        .ttl(Duration::from_millis(300))
        .label(label);
    let lease = locker.lock("rebuild-index", options).await.unwrap();
    assert_eq!(Readings::of(label).gauge("dlock_leases_held"), Some(1.0));
    // A stranger takes the key: the next renewal is refused.
    assert!(store.steal("rebuild-index"));
    tokio::time::timeout(Duration::from_secs(2), lease.lost())
        .await
        .expect("the loss was never seen");

    let readings = Readings::of(label);
    assert_eq!(readings.counter("dlock_lost_total"), 1, "{readings:?}");
    assert_eq!(
        readings.gauge("dlock_leases_held"),
        Some(0.0),
        "{readings:?}"
    );
    assert_eq!(readings.observations("dlock_hold_seconds", &[]).len(), 1);
    // Releasing the lost lease ends nothing twice.
    lease.release().await.unwrap();
    let readings = Readings::of(label);
    assert_eq!(
        readings.gauge("dlock_leases_held"),
        Some(0.0),
        "{readings:?}"
    );
    assert_eq!(readings.observations("dlock_hold_seconds", &[]).len(), 1);
    locker.shutdown().await.unwrap();
}

/// The in-process store, whose renewals go unanswered: a store that cannot be reached.
struct Unreachable(MemoryBackend);

impl Backend for Unreachable {
    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Option<Acquired>, LockError> {
        self.0.acquire(request).await
    }

    async fn release(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
        self.0.release(key, owner).await
    }

    async fn renew(&self, _leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
        Err(LockError::backend("connection refused"))
    }
}

#[tokio::test]
async fn renewals_the_store_does_not_answer_count_as_failures_then_a_loss() {
    let _turn = turn().await;
    let label = "jobs::unreachable";
    let locker = Locker::with_backend(Unreachable(MemoryBackend::new()));
    let options = LockOptions::new()
        .ttl(Duration::from_millis(600))
        .label(label);
    let lease = locker.lock("far-away", options).await.unwrap();
    tokio::time::timeout(Duration::from_secs(3), lease.lost())
        .await
        .expect("the loss was never seen");

    let readings = Readings::of(label);
    readings.assert_labels("custom");
    assert!(
        readings.counter("dlock_renewal_failures_total") >= 1,
        "{readings:?}"
    );
    assert_eq!(readings.counter("dlock_lost_total"), 1, "{readings:?}");
    assert_eq!(
        readings.gauge("dlock_leases_held"),
        Some(0.0),
        "{readings:?}"
    );
    drop(lease);
    locker.shutdown().await.unwrap();
}

/// The same story on a real Redis server (a private one, as the other Redis tests start: a
/// fresh machine runs none on 6379): the store label says so.
#[cfg(feature = "redis")]
#[tokio::test]
async fn on_redis_a_grant_a_busy_try_and_a_release_are_recorded() {
    let _turn = turn().await;
    let label = "redis::settle";
    let server = support::redis_server::RedisServer::start();
    let locker = Locker::connect(&server.url()).await.unwrap();
    let key = format!("dlock-test:metrics:{}", std::process::id());
    let options = LockOptions::new().label(label);
    let lease = locker.lock(key.as_str(), options).await.unwrap();
    assert!(matches!(
        locker.lock(key.as_str(), options).await,
        Err(LockError::Busy { .. })
    ));
    lease.release().await.unwrap();

    let readings = Readings::of(label);
    readings.assert_labels("redis");
    let granted = readings.observations("dlock_acquire_wait_seconds", &[("outcome", "granted")]);
    let busy = readings.observations("dlock_acquire_wait_seconds", &[("outcome", "busy")]);
    assert_eq!((granted.len(), busy.len()), (1, 1), "{readings:?}");
    assert_eq!(readings.counter("dlock_busy_total"), 1);
    assert_eq!(readings.observations("dlock_hold_seconds", &[]).len(), 1);
    assert_eq!(readings.gauge("dlock_leases_held"), Some(0.0));
    locker.shutdown().await.unwrap();
}

#[test]
fn the_kind_of_every_series_is_as_documented() {
    // Kinds are part of what an exporter shows (`# TYPE`): a counter must stay a counter.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _turn = runtime.block_on(turn());
    let label = "kinds::check";
    runtime.block_on(async {
        let locker = Locker::memory();
        let options = LockOptions::new().label(label);
        let lease = locker.lock("kinds", options).await.unwrap();
        let _ = locker.lock("kinds", options).await;
        lease.release().await.unwrap();
        locker.shutdown().await.unwrap();
    });
    let kinds: Vec<(String, MetricKind)> = Readings::of(label)
        .0
        .into_iter()
        .map(|(name, _, value)| {
            let kind = match value {
                DebugValue::Counter(_) => MetricKind::Counter,
                DebugValue::Gauge(_) => MetricKind::Gauge,
                DebugValue::Histogram(_) => MetricKind::Histogram,
            };
            (name, kind)
        })
        .collect();
    for (name, kind) in [
        ("dlock_acquire_wait_seconds", MetricKind::Histogram),
        ("dlock_hold_seconds", MetricKind::Histogram),
        ("dlock_busy_total", MetricKind::Counter),
        ("dlock_leases_held", MetricKind::Gauge),
    ] {
        assert!(
            kinds.iter().any(|(n, k)| n == name && *k == kind),
            "{name} as a {kind:?} not among {kinds:?}"
        );
    }
}
