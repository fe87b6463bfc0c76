//! A body's lease is its task's: another task never runs under it, whether it is polled inside
//! the body's poll (a `LocalSet` driven by the body) or is a started call moved out of the body
//! (`tokio::spawn` of a call polled once inside it). The call that acquired is the owner, and
//! takes its lease along wherever it is moved.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dlock::{distributed_lock, LockError, LockOptions, Locker};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::support::{unique_key, Gauge};

/// Enters, yields once, leaves; tries the key once.
#[distributed_lock(key = "acct:<id>", locker = &locker)]
async fn enter_once(locker: Locker, id: String, gauge: Arc<Gauge>) -> Result<(), LockError> {
    gauge.enter();
    tokio::task::yield_now().await;
    gauge.leave();
    Ok(())
}

/// Runs a local task that calls on the held key, driving it from inside the body.
#[distributed_lock(key = "acct:<id>", locker = locker)]
async fn drive_a_local_task(
    locker: &Locker,
    id: &str,
    gauge: &Arc<Gauge>,
) -> Result<Result<(), LockError>, LockError> {
    gauge.enter();
    let local = tokio::task::LocalSet::new();
    let task = local.spawn_local(enter_once(locker.clone(), id.to_owned(), gauge.clone()));
    let outcome = local
        .run_until(task)
        .await
        .expect("the local task panicked");
    gauge.leave();
    Ok(outcome)
}

#[tokio::test]
async fn a_task_polled_inside_a_body_is_another_owner() {
    let locker = Locker::memory();
    let id = unique_key("local-task");
    let gauge = Arc::new(Gauge::default());
    let outcome = drive_a_local_task(&locker, &id, &gauge).await.unwrap();
    assert!(
        matches!(outcome, Err(LockError::Busy { .. })),
        "a local task joined the lease of the body driving it: {outcome:?}"
    );
    assert_eq!(gauge.max(), 1, "two bodies were inside at once");
}

/// Takes a step, waits for `go`, takes another.
#[distributed_lock(key = "acct:<id>", locker = &locker)]
async fn step_twice(
    locker: Locker,
    id: String,
    steps: Arc<AtomicUsize>,
    go: oneshot::Receiver<()>,
) -> Result<(), LockError> {
    steps.fetch_add(1, Ordering::SeqCst);
    let _ = go.await;
    steps.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// `step_twice` under `on_lost = "continue"`.
#[distributed_lock(key = "acct:<id>", on_lost = "continue", locker = &locker)]
async fn step_twice_continuing(
    locker: Locker,
    id: String,
    steps: Arc<AtomicUsize>,
    go: oneshot::Receiver<()>,
) -> Result<(), LockError> {
    steps.fetch_add(1, Ordering::SeqCst);
    let _ = go.await;
    steps.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

type Call = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), LockError>> + Send>>;

/// Polls `call` once (it re-enters the held key and takes its first step), then moves it to a
/// task of its own.
async fn start_and_spawn(call: Call) -> JoinHandle<Result<(), LockError>> {
    tokio::spawn(start(call).await)
}

/// Starts a call on the held key, moves it to another task and lets it go on while the body
/// still holds the key.
#[distributed_lock(key = "acct:<id>", locker = locker)]
async fn move_out_and_await(
    locker: &Locker,
    id: &str,
    steps: &Arc<AtomicUsize>,
) -> Result<Result<(), LockError>, LockError> {
    let (go, wait) = oneshot::channel();
    let moved = start_and_spawn(Box::pin(step_twice(
        locker.clone(),
        id.to_owned(),
        steps.clone(),
        wait,
    )))
    .await;
    let _ = go.send(());
    Ok(moved.await.expect("the moved call panicked"))
}

#[tokio::test]
async fn a_reentered_call_moved_to_another_task_runs_no_further_there() {
    let locker = Locker::memory();
    let id = unique_key("moved");
    let steps = Arc::new(AtomicUsize::new(0));
    let outcome = move_out_and_await(&locker, &id, &steps).await.unwrap();
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "a call moved to another task ran on under the body's lease: {outcome:?}"
    );
    assert_eq!(steps.load(Ordering::SeqCst), 1);
}

/// Starts a call on the held key, moves it to another task and ends, releasing the key.
#[distributed_lock(key = "acct:<id>", locker = locker)]
async fn move_out_and_return(
    locker: &Locker,
    id: &str,
    steps: &Arc<AtomicUsize>,
    go: oneshot::Receiver<()>,
) -> Result<JoinHandle<Result<(), LockError>>, LockError> {
    let call = step_twice_continuing(locker.clone(), id.to_owned(), steps.clone(), go);
    Ok(start_and_spawn(Box::pin(call)).await)
}

#[tokio::test]
async fn a_reentered_call_moved_out_of_its_body_never_runs_beside_the_next_owner() {
    // `on_lost = "continue"` lets a body run on after its lease is lost, in the task that runs
    // it; a call moved away from the body it re-entered has no lease of its own to run on.
    let locker = Locker::memory();
    let id = unique_key("moved-out");
    let steps = Arc::new(AtomicUsize::new(0));
    let (go, wait) = oneshot::channel();
    let moved = move_out_and_return(&locker, &id, &steps, wait)
        .await
        .unwrap();
    let key = format!("acct:{id}");
    let next = locker
        .lock(&*key, LockOptions::new())
        .await
        .expect("the body that ended released its key");
    let _ = go.send(());
    let outcome = moved.await.expect("the moved call panicked");
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "a moved call ran on while the next owner held the key: {outcome:?}"
    );
    assert_eq!(steps.load(Ordering::SeqCst), 1);
    next.release().await.unwrap();
}

/// Acquires the key and re-enters it in a call that waits for `go`, then once more.
#[distributed_lock(key = "acct:<id>", locker = &locker)]
async fn reenter_around_a_wait(
    locker: Locker,
    id: String,
    steps: Arc<AtomicUsize>,
    go: oneshot::Receiver<()>,
) -> Result<(), LockError> {
    step_twice(locker.clone(), id.clone(), steps, go).await?;
    enter_once(locker.clone(), id, Arc::new(Gauge::default())).await
}

#[tokio::test]
async fn a_call_that_acquired_takes_its_lease_along_to_another_task() {
    let locker = Locker::memory();
    let id = unique_key("moved-owner");
    let steps = Arc::new(AtomicUsize::new(0));
    let (go, wait) = oneshot::channel();
    let call = reenter_around_a_wait(locker.clone(), id, steps.clone(), wait);
    let moved = start_and_spawn(Box::pin(call)).await;
    let _ = go.send(());
    let outcome = moved.await.expect("the moved call panicked");
    assert!(outcome.is_ok(), "{outcome:?}");
    assert_eq!(steps.load(Ordering::SeqCst), 2);
}

/// Polls `call` once, then hands it back to be awaited wherever its caller likes.
async fn start(mut call: Call) -> Call {
    std::future::poll_fn(|cx| {
        assert!(call.as_mut().poll(cx).is_pending());
        std::task::Poll::Ready(())
    })
    .await;
    call
}

/// Starts a call on the held key and returns it, unfinished, as the body's own result: the
/// body ends and its key is released while the call still has a step to take.
#[distributed_lock(key = "acct:<id>", locker = locker)]
async fn start_and_return(
    locker: &Locker,
    id: &str,
    steps: &Arc<AtomicUsize>,
    go: oneshot::Receiver<()>,
) -> Result<Call, LockError> {
    let call = step_twice_continuing(locker.clone(), id.to_owned(), steps.clone(), go);
    Ok(start(Box::pin(call)).await)
}

#[tokio::test]
async fn a_reentered_call_returned_out_of_its_body_never_runs_beside_the_next_owner() {
    // The same task awaits it, after the body that released the key: it still has no lease.
    let locker = Locker::memory();
    let id = unique_key("returned");
    let steps = Arc::new(AtomicUsize::new(0));
    let (go, wait) = oneshot::channel();
    let returned = start_and_return(&locker, &id, &steps, wait).await.unwrap();
    let key = format!("acct:{id}");
    let next = locker
        .lock(&*key, LockOptions::new())
        .await
        .expect("the body that ended released its key");
    let _ = go.send(());
    let outcome = returned.await;
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "a returned call ran on while the next owner held the key: {outcome:?}"
    );
    assert_eq!(steps.load(Ordering::SeqCst), 1);
    next.release().await.unwrap();
}

/// Starts a call on the held key, then has another thread's `block_on` drive it (no tokio task
/// on either side) while the body still holds the key.
#[distributed_lock(key = "acct:<id>", locker = locker)]
async fn move_to_another_thread(
    locker: &Locker,
    id: &str,
    steps: &Arc<AtomicUsize>,
) -> Result<Result<(), LockError>, LockError> {
    let (go, wait) = oneshot::channel();
    let call = start(Box::pin(step_twice(
        locker.clone(),
        id.to_owned(),
        steps.clone(),
        wait,
    )))
    .await;
    let handle = tokio::runtime::Handle::current();
    let (done, outcome) = oneshot::channel();
    std::thread::spawn(move || {
        let _ = done.send(handle.block_on(call));
    });
    let _ = go.send(());
    Ok(outcome.await.expect("the moved call panicked"))
}

#[test]
fn a_reentered_call_moved_to_another_thread_s_block_on_runs_no_further_there() {
    // Driven by `block_on` on both sides: neither the body nor the moved call is a tokio task.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let locker = Locker::memory();
    let id = unique_key("moved-thread");
    let steps = Arc::new(AtomicUsize::new(0));
    let outcome = runtime
        .block_on(move_to_another_thread(&locker, &id, &steps))
        .unwrap();
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "a call moved to another thread's block_on ran on under the body's lease: {outcome:?}"
    );
    assert_eq!(steps.load(Ordering::SeqCst), 1);
}

/// Spawns a helper that works under the body's lease until [`LeaseInfo::lost`] resolves, and
/// returns at once: the helper outlives the body. `stopped` is sent when it stops.
#[distributed_lock(key = "acct:<id>", ttl = "30s", locker = locker)]
async fn spawn_a_helper_and_return(
    locker: &Locker,
    id: &str,
    stopped: oneshot::Sender<()>,
) -> Result<(), LockError> {
    let lease = dlock::current_lease().expect("inside a locked body");
    tokio::spawn(async move {
        lease.lost().await;
        let _ = stopped.send(());
    });
    Ok(())
}

/// A helper task the body spawned, told to stop when the lease is lost, stops when the body ends
/// and its lease is released: the key goes to the next holder then, and a helper that went on
/// (up to the ttl, 30 s here) would work beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helper_waiting_for_the_loss_stops_when_the_lease_is_released() {
    let locker = Locker::memory();
    let id = unique_key("helper");
    let (stopped, helper_stopped) = oneshot::channel();
    spawn_a_helper_and_return(&locker, &id, stopped)
        .await
        .unwrap();
    let next = locker
        .lock(format!("acct:{id}"), LockOptions::new())
        .await
        .expect("the key was released");
    // Told as the lease was released, before the next holder got the key; 5 s is patience for
    // the helper's task to run, well short of the 30 s its lease would have lasted.
    tokio::time::timeout(std::time::Duration::from_secs(5), helper_stopped)
        .await
        .expect("the helper still works under a released lease, beside the next holder")
        .unwrap();
    next.release().await.unwrap();
}
