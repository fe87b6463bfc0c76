//! The backend's one pub/sub connection, on which it hears the hand-offs to its waiters.
//!
//! Each backend subscribes to a channel of its own, `<prefix>waiters:<instance>` (under its key
//! prefix, with its random id, which its waiters write into their waiter keys), once per
//! connection: a release that hands a
//! lock to one of its waiters publishes there, so a message reaches the one process that waits
//! for it, and waiting on a key costs no SUBSCRIBE of its own. The message names the owner the
//! lock was handed to, with the grant's fence and the waiter's call it came after
//! (`<owner> <fence> <call>`), and only that waiter is woken, with the grant. A release made
//! through this backend wakes a waiter of the same backend directly
//! ([`Subscriber::wake_local`]) and publishes nothing. When the connection drops, every waiter
//! is woken, without a grant, to look at the lock again (a message may have been missed), and
//! the next one to wait reconnects and subscribes again. A connection that carried no message
//! for five timeouts is pinged, and counts as dropped unless it answers in time: it only
//! receives, and could otherwise go silent (a NAT that forgot it) without anyone noticing.
//!
//! Connecting and subscribing never hold up a waiter's polls for more than a moment (the
//! `grace` of [`Subscription::ensure`]): the attempt runs on the background runtime, and a
//! waiter that finds it still under way polls meanwhile — the polls keep its waiter key alive,
//! and its claim of a key handed to it is one of them — then polls again once it subscribed, to
//! catch a message sent before. An attempt that fails (the server refuses the SUBSCRIBE, as for
//! an ACL user without the channel; a connection that cannot be made) makes every waiter of the
//! backend wait a pause before the next, 100 ms doubling up to 2 s, and polls on its timer
//! meanwhile: a waiter never loops on a failing SUBSCRIBE, nor opens a connection each time.
//!
//! (An older dlock subscribed to a channel per lock, `<lock>:ch`, and its releases publish
//! `<owner>` there. A waiter of this backend does not hear those: during an upgrade, a lock an
//! older dlock hands to it is found by its fallback poll, within the claim window.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redis::aio::PubSubSink;
use redis::RedisError;
use tokio::sync::Notify;
use tokio::task::{AbortHandle, JoinHandle};

use super::scripts::{Grant, HandOff};
use crate::background;

/// How long after its last waiter of this backend left a key still counts as waited for (see
/// [`Subscriber::has_waiters`]). A waiter of this backend handed the key by a release made here
/// leaves at once, often just before the releasing caller queues again: that caller had better
/// queue at once too than try first.
const LINGER: Duration = Duration::from_secs(1);

/// The channel of the backend whose id is `instance`, under its key `prefix` (see `hand_to` in
/// common.lua): an ACL user granted the channels of the prefix (`&<prefix>*`) may use it.
pub(super) fn channel_of(prefix: &str, instance: &str) -> String {
    format!("{prefix}waiters:{instance}")
}

pub(super) struct Subscriber {
    shared: Arc<Shared>,
}

struct Shared {
    /// Servers to subscribe on, tried in turn (one for a single node; the nodes a cluster's URL
    /// names, where a PUBLISH reaches every node).
    clients: Vec<redis::Client>,
    timeout: Duration,
    /// This backend's channel.
    channel: String,
    state: Mutex<State>,
    /// Serialises connecting and SUBSCRIBE.
    ops: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    /// owner → that waiter's wake-up. Owners are random and never reused: the owner alone names
    /// the waiter, whatever its key.
    waiters: HashMap<String, Arc<Wake>>,
    /// Per key (its channel name), how many of this backend's waiters wait for it, and when the
    /// last one left.
    keys: HashMap<String, KeyWaiters>,
    /// The current connection's sink and generation.
    sink: Option<(u64, PubSubSink)>,
    generation: u64,
    /// The generation of the connection the channel was subscribed on.
    subscribed: Option<u64>,
    /// The task reading the current connection.
    reader: Option<AbortHandle>,
    /// Which server to try first.
    next_client: usize,
    /// After an attempt to connect or subscribe failed: when the next may start, and the pause
    /// that was waited, which doubles with each failure in a row.
    retry: Option<(Instant, Duration)>,
}

/// How many timeouts (the longer of the connect and response timeouts) of silence on the
/// pub/sub connection pass before it is pinged: 15 s by default.
const PING_AFTER_TIMEOUTS: u32 = 5;

/// The pause after a first failed attempt to connect or subscribe, and the longest.
const FIRST_RETRY: Duration = Duration::from_millis(100);
const LAST_RETRY: Duration = Duration::from_secs(2);

struct KeyWaiters {
    count: usize,
    last_left: Instant,
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
    /// Wakes `owner`'s waiter, if this backend has one, leaving it `grant`; says whether it has.
    fn wake(&self, owner: &str, grant: Option<Grant>) -> bool {
        match self.waiters.get(owner) {
            Some(wake) => {
                wake.wake(grant);
                true
            }
            None => false,
        }
    }

    /// Whether the channel is subscribed on the current connection.
    fn is_subscribed(&self) -> bool {
        let current = self.sink.as_ref().map(|(generation, _)| *generation);
        current.is_some() && self.subscribed == current
    }

    /// An error while the pause after a failed attempt lasts.
    fn pausing(&self) -> Result<(), RedisError> {
        match self.retry {
            Some((not_before, _)) if Instant::now() < not_before => Err(RedisError::from(
                std::io::Error::other("pub/sub failed a moment ago; trying again after a pause"),
            )),
            _ => Ok(()),
        }
    }

    /// Counts a failed attempt: the next waits a pause twice the last one's.
    fn failed(&mut self) {
        let pause = self
            .retry
            .map_or(FIRST_RETRY, |(_, last)| (last * 2).min(LAST_RETRY));
        self.retry = Some((Instant::now() + pause, pause));
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
    /// A subscriber that will listen on `channel`, this backend's.
    pub(super) fn new(clients: Vec<redis::Client>, timeout: Duration, channel: String) -> Self {
        Subscriber {
            shared: Arc::new(Shared {
                clients,
                timeout,
                channel,
                state: Mutex::default(),
                ops: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// This backend's channel.
    pub(super) fn channel(&self) -> &str {
        &self.shared.channel
    }

    /// Registers a waiter for `owner` on the key whose channel name is `key`. Call
    /// [`Subscription::ensure`] before each of the waiter's polls, and wait with
    /// [`Subscription::wait`], so that a message that hands it the lock is either received or
    /// came before a poll that finds the lock its owner's.
    pub(super) fn register(&self, key: String, owner: String) -> Subscription {
        let wake = Arc::new(Wake::default());
        let mut state = self.shared.state();
        state.waiters.insert(owner.clone(), wake.clone());
        if state.keys.len() >= 1024 {
            // Keys no longer waited for, kept a moment for `has_waiters`.
            state
                .keys
                .retain(|_, waiters| waiters.count > 0 || waiters.last_left.elapsed() < LINGER);
        }
        state
            .keys
            .entry(key.clone())
            .or_insert(KeyWaiters {
                count: 0,
                last_left: Instant::now(),
            })
            .count += 1;
        Subscription {
            shared: self.shared.clone(),
            key,
            owner,
            wake,
            attempt: None,
        }
    }

    /// Whether other waiters of this backend wait for `key` (or did less than [`LINGER`] ago),
    /// with the channel subscribed on a live connection: a new waiter on it may queue at once.
    pub(super) fn has_waiters(&self, key: &str) -> bool {
        let state = self.shared.state();
        state.is_subscribed()
            && state
                .keys
                .get(key)
                .is_some_and(|waiters| waiters.count > 0 || waiters.last_left.elapsed() < LINGER)
    }

    /// Wakes the waiter of `handed`, where it is one of this backend's, with the grant a
    /// release made here handed it: no message is published for it. Returns whether the waiter
    /// is this backend's.
    pub(super) fn wake_local(&self, handed: &HandOff) -> bool {
        self.shared.state().wake(&handed.owner, handed.grant())
    }
}

/// One waiter's registration; dropping it unregisters it.
pub(super) struct Subscription {
    shared: Arc<Shared>,
    key: String,
    owner: String,
    wake: Arc<Wake>,
    /// An attempt to subscribe still under way when this waiter last polled.
    attempt: Option<JoinHandle<Result<(), RedisError>>>,
}

impl Subscription {
    /// Makes sure the backend's channel is subscribed on a live connection, connecting if need
    /// be. Cheap (no I/O) when it already is, and while the pause after a failed attempt lasts
    /// (the error says so).
    ///
    /// The attempt runs on the background runtime; this waits for it for `grace` at most, then
    /// answers `Ok` with the attempt still under way: the waiter polls now (queueing before it
    /// is subscribed), and [`wait`](Self::wait) returns once the attempt subscribed, so that the
    /// poll after it finds a hand-off whose message came before the SUBSCRIBE.
    pub(super) async fn ensure(&mut self, grace: Duration) -> Result<(), RedisError> {
        if self.shared.state().is_subscribed() {
            self.attempt = None;
            return Ok(());
        }
        if self.attempt.as_ref().is_some_and(|a| !a.is_finished()) {
            return Ok(());
        }
        self.attempt = None;
        self.shared.state().pausing()?;
        let mut attempt = background::handle().spawn(subscribe(self.shared.clone()));
        match tokio::time::timeout(grace, &mut attempt).await {
            Ok(Ok(result)) => result,
            Ok(Err(join)) => Err(RedisError::from(std::io::Error::other(join.to_string()))),
            Err(_) => {
                self.attempt = Some(attempt);
                Ok(())
            }
        }
    }

    /// Resolves when a message hands the lock to this waiter, the connection dropped (a message
    /// may have been missed), the attempt to subscribe that was under way when it last polled
    /// subscribed (a message may have come before), or `until`. A wake-up that came before this
    /// call is not lost.
    pub(super) async fn wait(&mut self, until: Instant) {
        let sleep = tokio::time::sleep_until(until.into());
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                () = self.wake.notify.notified() => return,
                () = &mut sleep => return,
                subscribed = settled(&mut self.attempt) => if subscribed { return },
            }
        }
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

/// Resolves when `attempt` ends, saying whether it subscribed, and clears it; pends where there
/// is none.
async fn settled(attempt: &mut Option<JoinHandle<Result<(), RedisError>>>) -> bool {
    let Some(running) = attempt else {
        return std::future::pending().await;
    };
    let result = running.await;
    *attempt = None;
    matches!(result, Ok(Ok(())))
}

/// One attempt to subscribe the backend's channel, connecting first if need be, made on the
/// background runtime so that no waiter waits for it longer than it chooses to. Attempts queue
/// on `ops`; each one looks again, once its turn comes, whether it is still needed, and whether
/// the pause after a failure lasts.
async fn subscribe(shared: Arc<Shared>) -> Result<(), RedisError> {
    let _ops = shared.ops.lock().await;
    let current = {
        let state = shared.state();
        if state.is_subscribed() || state.waiters.is_empty() {
            // Subscribed meanwhile for another waiter, or no waiter needs it any more.
            return Ok(());
        }
        state.pausing()?;
        state.sink.clone()
    };
    let (generation, mut sink) = match current {
        Some(current) => current,
        None => match connect(&shared).await {
            Ok(connected) => connected,
            Err(error) => {
                shared.state().failed();
                return Err(error);
            }
        },
    };
    let subscribed = tokio::time::timeout(shared.timeout, sink.subscribe(&shared.channel)).await;
    let error = match subscribed {
        Ok(Ok(())) => {
            let mut state = shared.state();
            if state.sink.as_ref().map(|(g, _)| *g) == Some(generation) {
                state.subscribed = Some(generation);
            }
            state.retry = None;
            return Ok(());
        }
        // The server refused it (a user without the channel, say): the connection is sound, and
        // no message was lost with it, so it stays, and nobody is woken.
        Ok(Err(error)) if error.code().is_some() => error,
        Ok(Err(error)) => {
            drop_connection(&shared, generation);
            error
        }
        Err(_) => {
            drop_connection(&shared, generation);
            RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "SUBSCRIBE timed out",
            ))
        }
    };
    shared.state().failed();
    Err(error)
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut state = self.shared.state();
        state.waiters.remove(&self.owner);
        if let Some(waiters) = state.keys.get_mut(&self.key) {
            waiters.count = waiters.count.saturating_sub(1);
            waiters.last_left = Instant::now();
        }
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
        let mut pinger = sink.clone();
        let reader = background::handle().spawn(async move {
            // The connection only receives, so one that went silent without closing (a NAT
            // that forgot it, a peer gone without a word) would never be noticed: after a
            // while without a message it is pinged, and dropped unless it answers in time.
            let silence = timeout * PING_AFTER_TIMEOUTS;
            let mut heard = tokio::time::Instant::now();
            loop {
                let pinged = async {
                    tokio::time::sleep_until(heard + silence).await;
                    tokio::time::timeout(timeout, pinger.ping::<redis::Value>()).await
                };
                tokio::select! {
                    message = stream.next() => {
                        let Some(message) = message else { break };
                        let Some(shared) = weak.upgrade() else { return };
                        let payload = String::from_utf8_lossy(message.get_payload_bytes());
                        let (owner, grant) = HandOff::parse(&payload);
                        shared.state().wake(owner, grant);
                    }
                    answer = pinged => {
                        if !matches!(answer, Ok(Ok(_))) {
                            tracing::debug!("distributed_lock: redis pub/sub connection did not answer a PING");
                            break;
                        }
                    }
                }
                heard = tokio::time::Instant::now();
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
    state.subscribed = None;
    for wake in state.waiters.values() {
        wake.wake(None);
    }
}
