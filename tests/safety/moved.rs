//! A started call is inside the bodies it is polled in now, not the ones it was first polled in.
//! A call started inside a body and then awaited beside it, or after it ended, is not inside it
//! any more; one started outside any body and then awaited inside one is.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use dlock::backend::MemoryBackend;
use dlock::{distributed_lock, LockError, LockOptions, Locker};
use tokio::sync::oneshot;

use crate::support::{unique_key, Gauge};

type Job<'a> = Pin<Box<dyn Future<Output = Result<(), LockError>> + Send + 'a>>;

/// Works on the account for 20 ms; tries its key once.
#[distributed_lock(key = "acct:<id>", locker = locker)]
async fn withdraw(locker: &Locker, id: &str, gauge: &Gauge) -> Result<(), LockError> {
    gauge.enter();
    tokio::time::sleep(Duration::from_millis(20)).await;
    gauge.leave();
    Ok(())
}

/// Takes the audit key, waits for `go`, then withdraws from the account.
#[distributed_lock(key = "audit:<id>", locker = locker)]
async fn audit<'a>(
    locker: &'a Locker,
    id: &'a str,
    go: oneshot::Receiver<()>,
    gauge: &'a Gauge,
) -> Result<(), LockError> {
    let _ = go.await;
    withdraw(locker, id, gauge).await
}

/// Waits for `go`, then works on the account for 20 ms.
#[distributed_lock(key = "acct:<id>", locker = locker)]
async fn withdraw_on_go<'a>(
    locker: &'a Locker,
    id: &'a str,
    go: oneshot::Receiver<()>,
    gauge: &'a Gauge,
) -> Result<(), LockError> {
    let _ = go.await;
    withdraw(locker, id, gauge).await
}

/// Polls `job` once (it starts, and waits), then hands it back to be awaited wherever its caller
/// likes.
async fn start(mut job: Job<'_>) -> Job<'_> {
    std::future::poll_fn(|cx| {
        assert!(job.as_mut().poll(cx).is_pending());
        std::task::Poll::Ready(())
    })
    .await;
    job
}

/// Starts `job` inside the body, puts it in `slot` for a caller beside the body to await, then
/// works on the account for 100 ms.
#[distributed_lock(key = "acct:<id>", locker = locker)]
async fn hand_out_beside<'a>(
    locker: &'a Locker,
    id: &'a str,
    job: Job<'a>,
    slot: &Mutex<Option<Job<'a>>>,
    gauge: &'a Gauge,
) -> Result<(), LockError> {
    let started = start(job).await;
    *slot.lock().unwrap() = Some(started);
    gauge.enter();
    tokio::time::sleep(Duration::from_millis(100)).await;
    gauge.leave();
    Ok(())
}

/// Joins `hand_out_beside` with a caller beside it that takes the started job from the body,
/// lets it go on, and awaits it there. Returns what the job returned.
async fn await_beside_the_body<'a>(
    locker: &'a Locker,
    id: &'a str,
    job: Job<'a>,
    go: oneshot::Sender<()>,
    gauge: &'a Gauge,
) -> Result<(), LockError> {
    let slot = Mutex::new(None);
    let beside = async {
        let job = loop {
            if let Some(job) = slot.lock().unwrap().take() {
                break job;
            }
            tokio::task::yield_now().await;
        };
        let _ = go.send(());
        job.await
    };
    let (body, beside) = tokio::join!(hand_out_beside(locker, id, job, &slot, gauge), beside);
    body.unwrap();
    beside
}

#[tokio::test]
async fn a_call_started_in_a_body_and_awaited_beside_it_is_another_owner() {
    // The audit holds a key of its own; the withdrawal inside it, made once the audit is
    // awaited beside the account's body, is not inside that body and must ask the store.
    let locker = Locker::memory();
    let id = unique_key("beside");
    let gauge = Gauge::default();
    let (go, wait) = oneshot::channel();
    let job = Box::pin(audit(&locker, &id, wait, &gauge));
    let outcome = await_beside_the_body(&locker, &id, job, go, &gauge).await;
    assert!(
        matches!(outcome, Err(LockError::Busy { .. })),
        "a call awaited beside the body ran under its lease: {outcome:?}"
    );
    assert_eq!(gauge.max(), 1, "two bodies were inside at once");
    assert_eq!(gauge.entered(), 1, "the withdrawal ran");
}

#[tokio::test]
async fn a_reentered_call_awaited_beside_its_body_runs_no_further_there() {
    // The withdrawal re-entered inside the body and took its turn there; beside the body it has
    // no lease, as a call moved to another task has none.
    let locker = Locker::memory();
    let id = unique_key("reentered-beside");
    let gauge = Gauge::default();
    let (go, wait) = oneshot::channel();
    let job = Box::pin(withdraw_on_go(&locker, &id, wait, &gauge));
    let outcome = await_beside_the_body(&locker, &id, job, go, &gauge).await;
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "a re-entered call awaited beside the body ran on: {outcome:?}"
    );
    assert_eq!(gauge.max(), 1, "two bodies were inside at once");
    assert_eq!(gauge.entered(), 1, "the withdrawal ran");
}

/// Starts an audit and gives it 10 ms inside the body, then returns it, still waiting, and
/// releases the account.
#[distributed_lock(key = "acct:<id>", locker = locker)]
async fn start_an_audit_and_return<'a>(
    locker: &'a Locker,
    id: &'a str,
    go: oneshot::Receiver<()>,
    gauge: &'a Gauge,
) -> Result<Job<'a>, LockError> {
    let mut job: Job<'a> = Box::pin(audit(locker, id, go, gauge));
    let waited = tokio::time::timeout(Duration::from_millis(10), &mut job).await;
    assert!(
        waited.is_err(),
        "the audit ended without its go: {waited:?}"
    );
    Ok(job)
}

#[tokio::test]
async fn a_call_started_in_a_body_and_awaited_after_it_takes_its_key_from_the_store() {
    let locker = Locker::memory();
    let id = unique_key("after");
    let gauge = Gauge::default();
    let (go, wait) = oneshot::channel();
    let job = start_an_audit_and_return(&locker, &id, wait, &gauge)
        .await
        .unwrap();
    let _ = go.send(());
    let outcome = job.await;
    assert!(
        outcome.is_ok(),
        "the withdrawal, made after the account's body ended, found no key: {outcome:?}"
    );
    assert_eq!(gauge.entered(), 1);
    let key = format!("acct:{id}");
    let free = locker.lock(&*key, LockOptions::new()).await;
    assert!(free.is_ok(), "the account is still held: {free:?}");
}

/// Lets `job` go on, and awaits it inside the body.
#[distributed_lock(key = "acct:<id>", locker = locker)]
async fn await_inside<'a>(
    locker: &'a Locker,
    id: &'a str,
    job: Job<'a>,
    go: oneshot::Sender<()>,
) -> Result<(), LockError> {
    let _ = go.send(());
    job.await
}

#[tokio::test]
async fn a_call_started_outside_any_body_and_awaited_inside_one_reenters_it() {
    let store = MemoryBackend::new();
    let locker = Locker::with_backend(store.clone());
    let id = unique_key("inside");
    let gauge = Gauge::default();
    let (go, wait) = oneshot::channel();
    let job = start(Box::pin(audit(&locker, &id, wait, &gauge))).await;
    let outcome = tokio::time::timeout(Duration::from_secs(5), await_inside(&locker, &id, job, go))
        .await
        .expect("the withdrawal waited for the key its own caller holds");
    assert!(
        outcome.is_ok(),
        "the withdrawal inside the account's body did not re-enter it: {outcome:?}"
    );
    assert_eq!(gauge.entered(), 1);
    assert_eq!(
        store.acquire_calls(),
        2,
        "one acquisition for the audit, one for the account, none for the withdrawal"
    );
}
