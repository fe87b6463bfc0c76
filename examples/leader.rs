//! One instance of a service owns a background loop; another takes over when it stops or dies.
//!
//! The outbox relay of the account story: rows written to an outbox table must be published to
//! the message queue, once each and in order, by one relay. Every replica of the service runs
//! the relay's code; [`Locker::campaign`] elects one, and [`Leadership::run`] runs its loop for
//! as long as it leads. Each batch carries the leader's fence, so the queue can refuse a batch
//! from a relay that was paused past its term. When the leader is stopped for a deploy it
//! resigns and the next replica leads at once; when it is killed, the next leads once its lease
//! has run out (the ttl; on ZooKeeper, the session timeout), not before.
//!
//! Elects on the in-memory store by default; `DLOCK_URL` (`redis://…`, `mysql://…`,
//! `postgres://…`, `zk://…`, with the store's feature enabled) runs it on a real one, where the
//! killed leader is a process of its own. (A process's in-memory store dies with it: the kill is
//! only shown on a shared store.)
//!
//! ```text
//! cargo run --example leader
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{Leadership, LockError, LockOptions, Locker};
use tokio::sync::oneshot;

const KEY: &str = "outbox-relay";

/// How long the key outlives a leader that dies without resigning: the fail-over time.
const TTL: Duration = Duration::from_secs(2);

/// Set in the environment of the process this example starts, to be killed while it leads.
const CHILD: &str = "LEADER_EXAMPLE_CHILD";

/// The message queue's side: it publishes a batch unless a newer term already published.
#[derive(Default)]
struct Queue {
    published: AtomicU64,
    refused: AtomicU64,
    newest_term: AtomicU64,
}

impl Queue {
    fn publish(&self, term: u64) {
        if self.newest_term.fetch_max(term, Ordering::SeqCst) > term {
            self.refused.fetch_add(1, Ordering::SeqCst);
        } else {
            self.published.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The relay loop the leader runs: a batch every 50 ms, each with the term's fence.
async fn relay(queue: &Queue, term: u64) {
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        queue.publish(term);
    }
}

fn options(name: &'static str) -> LockOptions {
    LockOptions::new().ttl(TTL).label(name)
}

/// One replica: campaigns, then relays until it loses the lead or is told to stop, when it
/// resigns so the next replica leads at once.
async fn replica(
    locker: Locker,
    name: &'static str,
    queue: Arc<Queue>,
    stop: oneshot::Receiver<()>,
) -> Result<(), LockError> {
    let mut stop = stop;
    let leadership: Leadership = tokio::select! {
        elected = locker.campaign(KEY, options(name)) => elected?,
        _ = &mut stop => return Ok(()), // stopped before it was elected
    };
    println!("{name} leads (term {})", leadership.fence());
    tokio::select! {
        result = leadership.run(relay(&queue, leadership.fence())) => {
            if let Err(LockError::Lost { .. }) = result {
                println!("{name} lost the lead and stopped relaying");
            }
        }
        _ = &mut stop => {
            leadership.resign().await?;
            println!("{name} resigned");
        }
    }
    Ok(())
}

async fn connect(memory: &dlock::backend::MemoryBackend) -> Result<Locker, LockError> {
    match std::env::var("DLOCK_URL") {
        Ok(url) if !url.is_empty() => Locker::connect(&url).await,
        // In memory, the replicas share one store, as processes share a server.
        _ => Ok(Locker::with_backend(memory.clone())),
    }
}

/// The process started to be killed: it leads, says so, and relays until it is killed.
async fn run_child() -> Result<(), LockError> {
    let locker = Locker::from_env().await?;
    let leadership = locker.campaign(KEY, options("instance-d")).await?;
    println!("leading (term {})", leadership.fence());
    let queue = Queue::default();
    let _ = leadership.run(relay(&queue, leadership.fence())).await;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    if std::env::var_os(CHILD).is_some() {
        return run_child().await;
    }
    let memory = dlock::backend::MemoryBackend::new();
    let queue = Arc::new(Queue::default());
    let mut stops = Vec::new();
    let mut replicas = Vec::new();
    for name in ["instance-a", "instance-b", "instance-c"] {
        let (stop, stopped) = oneshot::channel();
        let locker = connect(&memory).await?;
        replicas.push(tokio::spawn(replica(locker, name, queue.clone(), stopped)));
        stops.push(stop);
        // Started one after the other, as a deploy rolls out: the first leads.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let observer = connect(&memory).await?;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let leader = observer.leader(KEY).await?.expect("a replica leads");
    println!("the leader is {}", leader.label());

    // A deploy stops the leader: it resigns, and the next replica leads at once.
    let stopped_at = Instant::now();
    let _ = stops.remove(0).send(());
    replicas.remove(0).await.expect("the replica panicked")?;
    while observer
        .leader(KEY)
        .await?
        .is_none_or(|l| l.label() == "instance-a")
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let leader = observer.leader(KEY).await?.expect("a replica leads");
    println!(
        "{} took over {} ms after the resignation",
        leader.label(),
        stopped_at.elapsed().as_millis().max(1)
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (stop, replica) in stops.into_iter().zip(replicas) {
        let _ = stop.send(());
        replica.await.expect("the replica panicked")?;
    }
    println!(
        "batches published: {}, refused as stale: {}",
        queue.published.load(Ordering::SeqCst),
        queue.refused.load(Ordering::SeqCst)
    );

    match std::env::var("DLOCK_URL") {
        Ok(url) if !url.is_empty() => killed_leader(&observer).await?,
        _ => println!(
            "a killed leader's hand-over needs a store shared between processes: set DLOCK_URL"
        ),
    }
    observer.shutdown().await?;
    Ok(())
}

/// A leader in a process of its own is killed (SIGKILL: no resignation): a replica here is
/// elected once the dead leader's lease runs out, and not before.
async fn killed_leader(observer: &Locker) -> Result<(), LockError> {
    use tokio::io::{AsyncBufReadExt, BufReader};

    let mut child = tokio::process::Command::new(std::env::current_exe().expect("this program"))
        .env(CHILD, "1")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("starting a second process");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let line = lines
        .next_line()
        .await
        .expect("its output")
        .unwrap_or_default();
    assert!(line.starts_with("leading"), "the child said {line:?}");
    println!("instance-d, a process of its own, leads");

    let (_stop, stopped) = oneshot::channel();
    let queue = Arc::new(Queue::default());
    let successor = tokio::spawn(replica(observer.clone(), "instance-e", queue, stopped));
    tokio::time::sleep(Duration::from_millis(500)).await;
    child.kill().await.expect("killing it");
    let killed_at = Instant::now();
    println!("instance-d killed");
    while observer
        .leader(KEY)
        .await?
        .is_none_or(|l| l.label() != "instance-e")
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let after = killed_at.elapsed();
    // Not before the dead leader's lease ran out: its ttl, or on ZooKeeper its session's
    // timeout (its lock node goes with the session).
    println!(
        "instance-e took over {:.1} s after the kill, once the dead leader's lease ran out",
        after.as_secs_f64()
    );
    successor.abort();
    Ok(())
}
