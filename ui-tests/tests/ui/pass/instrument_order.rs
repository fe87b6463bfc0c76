//! `#[distributed_lock]` written above `#[tracing::instrument]` puts the lock's events (acquired,
//! released, and the warning of a skipped call) inside the function's span, for an `async fn` and
//! for a method under `#[async_trait]`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dlock::{distributed_lock, LockOptions, Locker};
use tracing::span::{Attributes, Id, Record};
use tracing::{field, Event, Metadata, Subscriber};

static LOCKS: LazyLock<Locker> = LazyLock::new(Locker::memory);

#[distributed_lock(key = "acct:<id>", locker = &LOCKS)]
#[tracing::instrument]
async fn submit(id: u32) {}

#[async_trait]
trait Accounts: Send + Sync {
    async fn touch(&self, id: u32);
}

struct Service;

#[async_trait]
impl Accounts for Service {
    #[distributed_lock(key = "touch:<id>", locker = &LOCKS)]
    #[tracing::instrument(skip(self))]
    async fn touch(&self, id: u32) {}
}

/// One event as seen: its message, its `function` field, and the names of the spans entered
/// on its thread when it was emitted, outermost first.
#[derive(Debug, Clone)]
struct Seen {
    message: String,
    function: Option<String>,
    spans: Vec<&'static str>,
}

/// A subscriber that records every event with the spans it was emitted in.
#[derive(Default)]
struct Capture {
    next_id: AtomicU64,
    names: Mutex<HashMap<u64, &'static str>>,
    events: Arc<Mutex<Vec<Seen>>>,
}

thread_local! {
    static ENTERED: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[derive(Default)]
struct Fields {
    message: String,
    function: Option<String>,
}

impl field::Visit for Fields {
    fn record_str(&mut self, field: &field::Field, value: &str) {
        if field.name() == "function" {
            self.function = Some(value.to_owned());
        }
    }
    fn record_debug(&mut self, field: &field::Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "function" => self.function = Some(format!("{value:?}")),
            _ => {}
        }
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        self.names.lock().unwrap().insert(id, span.metadata().name());
        Id::from_u64(id)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let names = self.names.lock().unwrap();
        let spans = ENTERED.with(|entered| entered.borrow().iter().map(|id| names[id]).collect());
        self.events.lock().unwrap().push(Seen {
            message: fields.message,
            function: fields.function,
            spans,
        });
    }
    fn enter(&self, span: &Id) {
        ENTERED.with(|entered| entered.borrow_mut().push(span.into_u64()));
    }
    fn exit(&self, _: &Id) {
        ENTERED.with(|entered| entered.borrow_mut().pop());
    }
}

fn seen(events: &Mutex<Vec<Seen>>, message: &str) -> Vec<Seen> {
    let events = events.lock().unwrap();
    events.iter().filter(|e| e.message.contains(message)).cloned().collect()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let capture = Capture::default();
    let events = capture.events.clone();
    tracing::subscriber::set_global_default(capture).unwrap();

    submit(1).await;
    Arc::new(Service).touch(1).await;
    for message in ["distributed_lock: acquired", "distributed_lock: released"] {
        let seen = seen(&events, message);
        assert_eq!(seen.len(), 2, "{message}: {seen:?}");
        assert_eq!(seen[0].spans, ["submit"], "{seen:?}");
        assert_eq!(seen[1].spans, ["touch"], "{seen:?}");
    }

    // A busy key skips the call: the warning names the function, inside its span.
    let held = LOCKS.lock("acct:2", LockOptions::new().ttl(Duration::from_secs(5))).await.unwrap();
    submit(2).await;
    held.release().await.unwrap();
    let skipped = seen(&events, "distributed_lock: call skipped");
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(skipped[0].function.as_deref(), Some("submit"));
    assert_eq!(skipped[0].spans, ["submit"]);
}
