//! The listener: one `LISTEN` connection per backend, which wakes the head of a key's queue
//! when a release of that key is announced, and every head when the connection drops.

use std::sync::{Arc, Weak};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};

use super::{Shared, Waiting};
use crate::backend::sql::Backoff;
use crate::background;
use crate::Owner;

/// The longest pause between two tries of a listener that cannot connect.
const MAX_RECONNECT_PAUSE: Duration = Duration::from_secs(2);

impl Waiting {
    /// The generation of the listening connection, while one listens: a notification sent
    /// while the same generation listens reaches this backend.
    pub(in crate::backend::postgres) fn listening(&self) -> Option<u64> {
        self.shared.state().listening
    }

    /// Starts the listener, connecting with `options`, on `channel`; returns once it listens or
    /// `timeout` passed (it keeps trying in the background then, and waiters poll meanwhile).
    pub(in crate::backend::postgres) async fn start_listener(
        &self,
        options: PgConnectOptions,
        channel: String,
        timeout: Duration,
    ) {
        let listening = self.shared.listening_changed.notified();
        let weak = Arc::downgrade(&self.shared);
        let task = background::handle().spawn(listen(weak, options, channel, timeout));
        if let Some(previous) = self
            .shared
            .listener
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .replace(task.abort_handle())
        {
            previous.abort();
        }
        if tokio::time::timeout(timeout, listening).await.is_err() {
            tracing::warn!(
                "distributed_lock: cannot LISTEN on PostgreSQL yet; waiters poll until it can"
            );
        }
    }

    /// Stops the listener, for shutdown.
    pub(in crate::backend::postgres) fn stop(&self) {
        if let Some(listener) = self
            .shared
            .listener
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
        {
            listener.abort();
        }
        let mut state = self.shared.state();
        state.listening = None;
        state.wake_every_head();
    }
}

/// The listener's task: connects, listens, wakes the heads the notifications name, and on a
/// lost connection wakes every head and connects again, with back-off, until the backend goes.
async fn listen(weak: Weak<Shared>, options: PgConnectOptions, channel: String, timeout: Duration) {
    let mut backoff = Backoff::new(
        Duration::from_millis(50),
        MAX_RECONNECT_PAUSE,
        Owner::random(),
    );
    loop {
        // A pool of one connection of the listener's own, which it uses only to connect, and
        // a new one for each connection: a listener given up on while its `LISTEN` is under
        // way (see `connect`) keeps its pool's one connection until TCP gives up on it (sqlx
        // sends `UNLISTEN *` on a listener's connection as it is dropped, and waits for the
        // answer, in a task of its own), and a listener on that pool could not connect again.
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .max_lifetime(None)
            .idle_timeout(None)
            .acquire_timeout(timeout)
            .connect_lazy_with(options.clone());
        match connect(&pool, &channel, timeout).await {
            Ok(mut listener) => {
                let Some(shared) = weak.upgrade() else { return };
                {
                    let mut state = shared.state();
                    state.generation += 1;
                    state.listening = Some(state.generation);
                    // A release may have gone unannounced while nobody listened.
                    state.wake_every_head();
                }
                shared.listening_changed.notify_waiters();
                drop(shared);
                backoff.reset();
                // `Ok(None)`: the connection was lost; `Err`: it failed otherwise.
                while let Ok(Some(notification)) = listener.try_recv().await {
                    let Some(shared) = weak.upgrade() else { return };
                    if let Some(key) = released_key(notification.payload(), &shared.name) {
                        shared.state().wake_head(&key);
                    }
                }
                tracing::debug!("distributed_lock: PostgreSQL LISTEN connection lost; waiters poll until it is back");
            }
            Err(error) => {
                tracing::debug!(%error, "distributed_lock: cannot LISTEN on PostgreSQL; waiters poll meanwhile");
            }
        }
        let Some(shared) = weak.upgrade() else { return };
        {
            let mut state = shared.state();
            state.listening = None;
            state.wake_every_head();
        }
        drop(shared);
        tokio::time::sleep(backoff.next_pause()).await;
    }
}

/// Connects (within `timeout`, the pool's acquire timeout) and listens on `channel`, within
/// `timeout` too: a connection gone silent after its handshake (half-open) would leave its
/// `LISTEN` unanswered until TCP gives up, many minutes on, nobody listening meanwhile; it is
/// given up on as a lost one, and the listener connects again.
async fn connect(
    pool: &sqlx::PgPool,
    channel: &str,
    timeout: Duration,
) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.ignore_pool_close_event(true);
    // A lost connection is reported (`Ok(None)`) before it is replaced, so that the heads poll
    // while nobody listens.
    listener.eager_reconnect(false);
    match tokio::time::timeout(timeout, listener.listen(channel)).await {
        Ok(listened) => listened?,
        Err(_) => {
            return Err(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "LISTEN was not answered within the connect timeout",
            )))
        }
    }
    Ok(listener)
}

/// The key a notification's payload says was released, or handed over: the key hex-encoded,
/// and after a hand-off a space and the name of the backend that handed it to its own waiter.
/// `None` for a payload this backend is to pass by: its own hand-offs (its queue knows), and
/// what it cannot read.
fn released_key(payload: &str, own_name: &str) -> Option<Vec<u8>> {
    let key = match payload.split_once(' ') {
        Some((_, from)) if from == own_name => return None,
        Some((key, _)) => key,
        None => payload,
    };
    decode_hex(key)
}

/// Reads a hex-encoded key.
fn decode_hex(payload: &str) -> Option<Vec<u8>> {
    let digit = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let bytes = payload.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return None;
    }
    bytes
        .chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{decode_hex, released_key};

    #[test]
    fn payloads_are_hex_encoded_keys() {
        assert_eq!(decode_hex("6163633a3432"), Some(b"acc:42".to_vec()));
        assert_eq!(decode_hex("6A"), Some(vec![0x6a]));
        assert_eq!(decode_hex(""), Some(vec![]));
        assert_eq!(decode_hex("6"), None);
        assert_eq!(decode_hex("zz"), None);
        assert_eq!(released_key("6a 0123", "4567"), Some(vec![0x6a]));
        assert_eq!(released_key("6a 0123", "0123"), None);
        assert_eq!(released_key("6a", "0123"), Some(vec![0x6a]));
    }
}
