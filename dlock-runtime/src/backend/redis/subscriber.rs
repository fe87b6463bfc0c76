//! The backend's one pub/sub connection, carrying the channels of all its waiters.
//!
//! A waiter registers under its lock's channel and its owner; a message on the channel names the
//! owner the lock was handed to, with the grant's fence and the waiter's call it came after
//! (`<owner> <fence> <call>`; an older dlock's release publishes `<owner>` or `<owner> <fence>`),
//! and only that waiter is woken, with the grant where the message carries it. A release made
//! through this backend wakes a waiter of the same backend directly
//! ([`Subscriber::wake_local`]) and publishes nothing. A channel is
//! subscribed while at least one waiter of this backend needs it. When the connection drops,
//! every waiter is woken, without a fence, to look at the lock again (a message may have been
//! missed), and the next one to wait reconnects and subscribes again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::PubSubSink;
use redis::RedisError;
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use super::scripts::{Grant, HandOff};
use crate::background;

pub(super) struct Subscriber {
    shared: Arc<Shared>,
}

struct Shared {
    /// Servers to subscribe on, tried in turn (one for a single node; the nodes a cluster's URL
    /// names, where a PUBLISH reaches every node).
    clients: Vec<redis::Client>,
    timeout: Duration,
    state: Mutex<State>,
    /// Serialises connecting, SUBSCRIBE and UNSUBSCRIBE, so that an UNSUBSCRIBE for a channel
    /// that lost its last waiter cannot overtake the SUBSCRIBE of a new one.
    ops: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    /// The channels some waiter of this backend needs.
    channels: HashMap<String, Channel>,
    /// The current connection's sink and generation.
    sink: Option<(u64, PubSubSink)>,
    generation: u64,
    /// The task reading the current connection.
    reader: Option<AbortHandle>,
    /// Which server to try first.
    next_client: usize,
}

#[derive(Default)]
struct Channel {
    /// owner → that waiter's wake-up.
    waiters: HashMap<String, Arc<Wake>>,
    /// The generation of the connection the channel was subscribed on.
    subscribed: Option<u64>,
}

/// One waiter's wake-up, and the grant that came with it.
#[derive(Default)]
struct Wake {
    notify: Notify,
    grant: Mutex<Option<Grant>>,
}

impl Wake {
    /// Wakes the waiter; with `grant`, leaves it the grant to find (replacing any earlier one:
    /// only the latest grant can still be in force).
    fn wake(&self, grant: Option<Grant>) {
        if grant.is_some() {
            *self.grant.lock().unwrap_or_else(|p| p.into_inner()) = grant;
        }
        self.notify.notify_one();
    }
}

impl State {
    /// Wakes `owner`'s waiter on `channel`, if this backend has one, leaving it `grant`; says
    /// whether it has.
    fn wake(&self, channel: &str, owner: &str, grant: Option<Grant>) -> bool {
        match self
            .channels
            .get(channel)
            .and_then(|channel| channel.waiters.get(owner))
        {
            Some(wake) => {
                wake.wake(grant);
                true
            }
            None => false,
        }
    }

    /// Whether `channel` is subscribed on the current connection.
    fn is_subscribed(&self, channel: &str) -> bool {
        let current = self.sink.as_ref().map(|(generation, _)| *generation);
        current.is_some() && self.channels.get(channel).and_then(|c| c.subscribed) == current
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(reader) = self.state().reader.take() {
            reader.abort();
        }
    }
}

impl Subscriber {
    pub(super) fn new(clients: Vec<redis::Client>, timeout: Duration) -> Self {
        Subscriber {
            shared: Arc::new(Shared {
                clients,
                timeout,
                state: Mutex::default(),
                ops: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// Registers a waiter for `owner` on `channel`. Call [`Subscription::ensure`] before the
    /// waiter enqueues, so the message that hands it the lock cannot come before the SUBSCRIBE.
    pub(super) fn register(&self, channel: String, owner: String) -> Subscription {
        let wake = Arc::new(Wake::default());
        self.shared
            .state()
            .channels
            .entry(channel.clone())
            .or_default()
            .waiters
            .insert(owner.clone(), wake.clone());
        Subscription {
            shared: self.shared.clone(),
            channel,
            owner,
            wake,
        }
    }

    /// Whether `channel` is subscribed on a live connection (for another waiter), so that a new
    /// waiter on it may queue at once.
    pub(super) fn is_subscribed(&self, channel: &str) -> bool {
        self.shared.state().is_subscribed(channel)
    }

    /// Wakes the waiter of `handed`, where it is one of this backend's, with the grant a
    /// release made here handed it: no message is published for it. Returns whether the waiter
    /// is this backend's.
    pub(super) fn wake_local(&self, channel: &str, handed: &HandOff) -> bool {
        self.shared
            .state()
            .wake(channel, &handed.owner, handed.grant())
    }
}

/// One waiter's registration; dropping it unregisters it, and unsubscribes the channel when no
/// other waiter of the backend needs it.
pub(super) struct Subscription {
    shared: Arc<Shared>,
    channel: String,
    owner: String,
    wake: Arc<Wake>,
}

impl Subscription {
    /// Makes sure the channel is subscribed on a live connection, connecting if need be. Cheap
    /// (no I/O) when it already is, for this waiter or another of the same channel.
    pub(super) async fn ensure(&mut self) -> Result<(), RedisError> {
        if self.shared.state().is_subscribed(&self.channel) {
            return Ok(());
        }
        let _ops = self.shared.ops.lock().await;
        if self.shared.state().is_subscribed(&self.channel) {
            return Ok(());
        }
        let current = self.shared.state().sink.clone();
        let (generation, mut sink) = match current {
            Some(current) => current,
            None => connect(&self.shared).await?,
        };
        let subscribed =
            tokio::time::timeout(self.shared.timeout, sink.subscribe(&self.channel)).await;
        match subscribed {
            Ok(Ok(())) => {
                if let Some(channel) = self.shared.state().channels.get_mut(&self.channel) {
                    channel.subscribed = Some(generation);
                }
                Ok(())
            }
            Ok(Err(error)) => {
                drop_connection(&self.shared, generation);
                Err(error)
            }
            Err(_) => {
                drop_connection(&self.shared, generation);
                Err(RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "SUBSCRIBE timed out",
                )))
            }
        }
    }

    /// Resolves when a message hands the lock to this waiter, or the connection dropped (a
    /// message may have been missed). A wake-up that came before this call is not lost.
    pub(super) async fn woken(&self) {
        self.wake.notify.notified().await;
    }

    /// The grant a hand-off left this waiter, if one did since the last call: taken, so that
    /// each is looked at once.
    pub(super) fn take_grant(&self) -> Option<Grant> {
        self.wake
            .grant
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let unused = {
            let mut state = self.shared.state();
            match state.channels.get_mut(&self.channel) {
                Some(channel) => {
                    channel.waiters.remove(&self.owner);
                    let unused = channel.waiters.is_empty();
                    if unused {
                        state.channels.remove(&self.channel);
                    }
                    unused
                }
                None => false,
            }
        };
        if !unused {
            return;
        }
        let shared = Arc::downgrade(&self.shared);
        let channel = std::mem::take(&mut self.channel);
        background::spawn(async move {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            let _ops = shared.ops.lock().await;
            let sink = {
                let state = shared.state();
                if state.channels.contains_key(&channel) {
                    // A new waiter came meanwhile; it is subscribed already.
                    return;
                }
                state.sink.clone()
            };
            if let Some((generation, mut sink)) = sink {
                match tokio::time::timeout(shared.timeout, sink.unsubscribe(&channel)).await {
                    Ok(Ok(())) => {}
                    _ => drop_connection(&shared, generation),
                }
            }
        });
    }
}

/// Connects (on the background runtime, where the connection's driver task then lives) and
/// starts the task that reads it. Called with `ops` held.
async fn connect(shared: &Arc<Shared>) -> Result<(u64, PubSubSink), RedisError> {
    let first = shared.state().next_client;
    let mut last_error = None;
    for attempt in 0..shared.clients.len() {
        let index = (first + attempt) % shared.clients.len();
        let client = shared.clients[index].clone();
        let timeout = shared.timeout;
        let connecting = background::handle().spawn(async move {
            match tokio::time::timeout(timeout, client.get_async_pubsub()).await {
                Ok(result) => result,
                Err(_) => Err(RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "timed out connecting",
                ))),
            }
        });
        let pubsub = match connecting.await {
            Ok(Ok(pubsub)) => pubsub,
            Ok(Err(error)) => {
                last_error = Some(error);
                continue;
            }
            Err(join) => {
                last_error = Some(RedisError::from(std::io::Error::other(join.to_string())));
                continue;
            }
        };
        let (sink, mut stream) = pubsub.split();
        let mut state = shared.state();
        state.generation += 1;
        state.next_client = index;
        let generation = state.generation;
        let weak: Weak<Shared> = Arc::downgrade(shared);
        let reader = background::handle().spawn(async move {
            while let Some(message) = stream.next().await {
                let Some(shared) = weak.upgrade() else { return };
                let payload = String::from_utf8_lossy(message.get_payload_bytes());
                let (owner, grant) = HandOff::parse(&payload);
                shared
                    .state()
                    .wake(message.get_channel_name(), owner, grant);
            }
            if let Some(shared) = weak.upgrade() {
                drop_connection(&shared, generation);
            }
        });
        if let Some(previous) = state.reader.replace(reader.abort_handle()) {
            previous.abort();
        }
        state.sink = Some((generation, sink.clone()));
        return Ok((generation, sink));
    }
    Err(last_error
        .unwrap_or_else(|| RedisError::from(std::io::Error::other("no server to subscribe on"))))
}

/// Forgets connection `generation` if it is still the current one, and wakes every waiter: a
/// message may have been lost with it.
fn drop_connection(shared: &Shared, generation: u64) {
    let mut state = shared.state();
    if state.sink.as_ref().is_none_or(|(g, _)| *g != generation) {
        return;
    }
    tracing::debug!("distributed_lock: redis pub/sub connection lost; waiters look again");
    state.sink = None;
    if let Some(reader) = state.reader.take() {
        reader.abort();
    }
    // Move to the next server for the next attempt (the nodes a cluster's URL names).
    state.next_client = (state.next_client + 1) % shared.clients.len().max(1);
    for channel in state.channels.values() {
        for wake in channel.waiters.values() {
            wake.wake(None);
        }
    }
}
