//! The backend's one pub/sub connection, carrying the channels of all its waiters.
//!
//! A waiter registers under its lock's channel and its owner; a message on the channel names the
//! owner the lock was handed to (`<owner>`; an older dlock adds ` <fence>`), and only that waiter
//! is woken, to claim the lock. A release made through this backend wakes a waiter of the same
//! backend directly ([`Subscriber::wake_local`]) and publishes nothing. A channel is
//! subscribed while at least one waiter of this backend needs it. When the connection drops,
//! every waiter is woken, without a fence, to look at the lock again (a message may have been
//! missed), and the next one to wait reconnects and subscribes again. A connection that carried
//! no message for five timeouts is pinged, and counts as dropped unless it answers in time: it
//! only receives, and could otherwise go silent (a NAT that forgot it) without anyone noticing.
//!
//! Connecting and subscribing never hold up a waiter's polls for more than a moment (the
//! `grace` of [`Subscription::ensure`]): the attempt runs on the background runtime, and a
//! waiter that finds it still under way polls meanwhile — the polls keep its waiter key alive,
//! and its claim of a key handed to it is one of them — then polls again once it subscribed, to
//! catch a message sent before. An attempt that fails (the server refuses the SUBSCRIBE, as for
//! an ACL user without the channel; a connection that cannot be made) makes every waiter of the
//! backend wait a pause before the next, 100 ms doubling up to 2 s, and polls on its timer
//! meanwhile: a waiter never loops on a failing SUBSCRIBE, nor opens a connection each time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redis::aio::PubSubSink;
use redis::RedisError;
use tokio::sync::Notify;
use tokio::task::{AbortHandle, JoinHandle};

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

#[derive(Default)]
struct Channel {
    /// owner → that waiter's wake-up.
    waiters: HashMap<String, Arc<Notify>>,
    /// The generation of the connection the channel was subscribed on.
    subscribed: Option<u64>,
}

impl State {
    /// Wakes `owner`'s waiter on `channel`, if this backend has one; says whether it has.
    fn wake(&self, channel: &str, owner: &str) -> bool {
        match self
            .channels
            .get(channel)
            .and_then(|channel| channel.waiters.get(owner))
        {
            Some(wake) => {
                wake.notify_one();
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

    /// Registers a waiter for `owner` on `channel`. Call [`Subscription::ensure`] before each of
    /// the waiter's polls, and wait with [`Subscription::wait`], so that a message that hands it
    /// the lock is either received or came before a poll that finds the lock its owner's.
    pub(super) fn register(&self, channel: String, owner: String) -> Subscription {
        let wake = Arc::new(Notify::new());
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
            attempt: None,
        }
    }

    /// Whether `channel` is subscribed on a live connection (for another waiter), so that a new
    /// waiter on it may queue at once.
    pub(super) fn is_subscribed(&self, channel: &str) -> bool {
        self.shared.state().is_subscribed(channel)
    }

    /// Wakes `owner`'s waiter on `channel`, where it is one of this backend's, to claim the
    /// lock a release made here handed it: no message is published for it. Returns whether the
    /// waiter is this backend's.
    pub(super) fn wake_local(&self, channel: &str, owner: &str) -> bool {
        self.shared.state().wake(channel, owner)
    }
}

/// One waiter's registration; dropping it unregisters it, and unsubscribes the channel when no
/// other waiter of the backend needs it.
pub(super) struct Subscription {
    shared: Arc<Shared>,
    channel: String,
    owner: String,
    wake: Arc<Notify>,
    /// An attempt to subscribe still under way when this waiter last polled.
    attempt: Option<JoinHandle<Result<(), RedisError>>>,
}

impl Subscription {
    /// Makes sure the channel is subscribed on a live connection, connecting if need be. Cheap
    /// (no I/O) when it already is, for this waiter or another of the same channel, and while the
    /// pause after a failed attempt lasts (the error says so).
    ///
    /// The attempt runs on the background runtime; this waits for it for `grace` at most, then
    /// answers `Ok` with the attempt still under way: the waiter polls now (queueing before it
    /// is subscribed), and [`wait`](Self::wait) returns once the attempt subscribed, so that the
    /// poll after it finds a hand-off whose message came before the SUBSCRIBE.
    pub(super) async fn ensure(&mut self, grace: Duration) -> Result<(), RedisError> {
        if self.shared.state().is_subscribed(&self.channel) {
            self.attempt = None;
            return Ok(());
        }
        if self.attempt.as_ref().is_some_and(|a| !a.is_finished()) {
            return Ok(());
        }
        self.attempt = None;
        self.shared.state().pausing()?;
        let mut attempt =
            background::handle().spawn(subscribe(self.shared.clone(), self.channel.clone()));
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
                () = self.wake.notified() => return,
                () = &mut sleep => return,
                subscribed = settled(&mut self.attempt) => if subscribed { return },
            }
        }
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

/// One attempt to subscribe `channel`, connecting first if need be, made on the background
/// runtime so that no waiter waits for it longer than it chooses to. Attempts queue on `ops`;
/// each one looks again, once its turn comes, whether it is still needed, and whether the
/// pause after a failure lasts.
async fn subscribe(shared: Arc<Shared>, channel: String) -> Result<(), RedisError> {
    let _ops = shared.ops.lock().await;
    let current = {
        let state = shared.state();
        if state.is_subscribed(&channel) || !state.channels.contains_key(&channel) {
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
    let subscribed = tokio::time::timeout(shared.timeout, sink.subscribe(&channel)).await;
    let error = match subscribed {
        Ok(Ok(())) => {
            let mut state = shared.state();
            if let Some(channel) = state.channels.get_mut(&channel) {
                channel.subscribed = Some(generation);
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
                        shared
                            .state()
                            .wake(message.get_channel_name(), parse_hand_off(&payload));
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
    for channel in state.channels.values() {
        for wake in channel.waiters.values() {
            wake.notify_one();
        }
    }
}

/// Reads a hand-off message: the owner it names, `<owner>`, or `<owner> <fence>` from a release
/// by an older dlock (the waiter claims the lock all the same).
fn parse_hand_off(payload: &str) -> &str {
    payload.split_once(' ').map_or(payload, |(owner, _)| owner)
}

#[cfg(test)]
mod tests {
    use super::parse_hand_off;

    #[test]
    fn hand_off_messages_name_the_owner() {
        assert_eq!(parse_hand_off("abc"), "abc");
        assert_eq!(parse_hand_off("abc 42"), "abc");
    }
}
