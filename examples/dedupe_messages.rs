//! A message delivered more than once takes effect more than once.
//!
//! The broker delivers at least once: on a time-out or a rebalance it hands the same message to
//! another consumer of the group, sometimes while the first is still working on it. Each message
//! credits an account; a "processed" marker is checked before and written after the work, but two
//! consumers that check at the same moment both see "not processed" and both credit. The
//! fix: a lock keyed by the message id (`SET key owner NX EX …`, or a ZooKeeper node) around the
//! check-work-mark sequence, so the marker check and the work are one step per message.
//!
//! Locks on the in-memory store by default; `DLOCK_URL` (`redis://…`, `mysql://…`,
//! `postgres://…`, `zk://…`, with the store's feature enabled) runs it on a real one:
//!
//! ```text
//! cargo run --example dedupe_messages
//! ```

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock::{distributed_lock, LockError, Locker};

const MESSAGES: u64 = 200;
const DELIVERIES_PER_MESSAGE: u64 = 3;
const CONSUMERS: usize = 4;

#[derive(Clone, Debug)]
struct Message {
    id: String,
    account: u64,
    amount: u64,
}

/// What the consumers share: the account balances and the processed markers, each access a
/// round trip away.
#[derive(Default)]
struct Ledger {
    balances: Mutex<HashMap<u64, u64>>,
    processed: Mutex<HashSet<String>>,
    effects: AtomicU64,
}

impl Ledger {
    async fn is_processed(&self, id: &str) -> bool {
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.processed.lock().unwrap().contains(id)
    }

    async fn credit(&self, account: u64, amount: u64) {
        tokio::time::sleep(Duration::from_millis(2)).await;
        *self.balances.lock().unwrap().entry(account).or_default() += amount;
        self.effects.fetch_add(1, Ordering::SeqCst);
    }

    async fn mark_processed(&self, id: &str) {
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.processed.lock().unwrap().insert(id.to_owned());
    }
}

/// What a consumer did with one delivery.
#[derive(Debug, PartialEq)]
enum Handled {
    Applied,
    AlreadyProcessed,
}

/// Check, work, mark — correct for one delivery at a time.
async fn handle_unlocked(ledger: &Ledger, message: &Message) -> Handled {
    if ledger.is_processed(&message.id).await {
        return Handled::AlreadyProcessed;
    }
    ledger.credit(message.account, message.amount).await;
    ledger.mark_processed(&message.id).await;
    Handled::Applied
}

/// The same under a lock per message id. A redelivery that finds the message locked returns
/// `None` at once: another consumer is handling it, and the broker will not need it again.
#[distributed_lock(key = "msg:<message.id>", ttl = "10s")]
async fn handle(ledger: &Ledger, message: &Message) -> Option<Handled> {
    Some(handle_unlocked(ledger, message).await)
}

/// Every message, each delivered several times; the copies of a message arrive together, as a
/// redelivery after a consumer's time-out does, so they reach different consumers at once.
fn deliveries() -> Vec<Message> {
    let mut out = Vec::new();
    for n in 0..MESSAGES {
        for _ in 0..DELIVERIES_PER_MESSAGE {
            out.push(Message {
                id: format!("order-paid-{n:04}"),
                account: n % 10,
                amount: 100 + n,
            });
        }
    }
    out
}

struct Outcome {
    effects: u64,
    skipped_busy: u64,
    already_processed: u64,
    total_credited: u64,
}

async fn consume(locked: bool) -> Outcome {
    let ledger = Arc::new(Ledger::default());
    let queue = Arc::new(Mutex::new(deliveries()));
    let (skipped_busy, already_processed) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut consumers = Vec::new();
    for _ in 0..CONSUMERS {
        let (ledger, queue) = (ledger.clone(), queue.clone());
        let (skipped_busy, already_processed) = (skipped_busy.clone(), already_processed.clone());
        consumers.push(tokio::spawn(async move {
            loop {
                let Some(message) = queue.lock().unwrap().pop() else {
                    break;
                };
                let handled = if locked {
                    handle(&ledger, &message).await
                } else {
                    Some(handle_unlocked(&ledger, &message).await)
                };
                match handled {
                    None => skipped_busy.fetch_add(1, Ordering::SeqCst),
                    Some(Handled::AlreadyProcessed) => {
                        already_processed.fetch_add(1, Ordering::SeqCst)
                    }
                    Some(Handled::Applied) => 0,
                };
            }
        }));
    }
    for consumer in consumers {
        consumer.await.expect("a consumer panicked");
    }
    let total_credited = ledger.balances.lock().unwrap().values().sum();
    Outcome {
        effects: ledger.effects.load(Ordering::SeqCst),
        skipped_busy: skipped_busy.load(Ordering::SeqCst),
        already_processed: already_processed.load(Ordering::SeqCst),
        total_credited,
    }
}

fn report(title: &str, outcome: &Outcome) {
    let expected: u64 = (0..MESSAGES).map(|n| 100 + n).sum();
    println!("{title}");
    println!(
        "  {} effects for {MESSAGES} messages ({} duplicates); {} redeliveries saw the marker, {} found the message locked",
        outcome.effects,
        outcome.effects.saturating_sub(MESSAGES),
        outcome.already_processed,
        outcome.skipped_busy
    );
    println!(
        "  credited {} (expected {expected})",
        outcome.total_credited
    );
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let locker = match std::env::var("DLOCK_URL") {
        Ok(url) if !url.is_empty() => Locker::connect(&url).await?,
        _ => Locker::memory(),
    };
    println!(
        "locker: {locker:?}; {MESSAGES} messages x {DELIVERIES_PER_MESSAGE} deliveries, {CONSUMERS} consumers\n"
    );
    dlock::set_default_locker(locker);
    report("marker only (check, work, mark)", &consume(false).await);
    report(
        "\nmarker + #[distributed_lock(key = \"msg:<message.id>\")]",
        &consume(true).await,
    );
    Ok(())
}
