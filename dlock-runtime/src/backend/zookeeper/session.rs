//! The session every node of a backend lives on: opening it (its task on dlock's background
//! runtime), opening a new one when it ended, how long a lease may be on it, and which errors
//! mean it ended.

use std::future::{poll_fn, Future};
use std::time::Duration;

use zookeeper_client::{Client, Error as ZkError, SessionId};

use super::ZookeeperBackend;
use crate::{background, LockError};

/// One ZooKeeper session.
#[derive(Clone)]
pub(super) struct Session {
    pub(super) client: Client,
    pub(super) id: SessionId,
    /// The session timeout the ensemble granted.
    pub(super) timeout: Duration,
}

impl ZookeeperBackend {
    /// The live session, opening a new one if the current one ended.
    pub(super) async fn session(&self) -> Result<Session, LockError> {
        let current = self.shared.current();
        if !current.client.state().is_terminated() {
            return Ok(current);
        }
        let _one = self.shared.reconnecting.lock().await;
        let current = self.shared.current();
        if !current.client.state().is_terminated() {
            return Ok(current);
        }
        let fresh = open(&self.shared.hosts, self.shared.asked_timeout).await?;
        tracing::warn!(
            old = %current.id,
            new = %fresh.id,
            "distributed_lock: ZooKeeper session ended; its leases are lost; opened a new session"
        );
        // Nodes of the old session went with it: nothing of them is held any more.
        self.shared
            .held()
            .retain(|_, holding| holding.session() != current.id);
        *self
            .shared
            .session
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = fresh.clone();
        Ok(fresh)
    }

    /// Refuses a ttl longer than the session allows (see [`safe_ttl`]), and a session too short
    /// for any ttl.
    pub(super) fn check_ttl(&self, ttl: Duration, session: &Session) -> Result<(), LockError> {
        let limit = safe_ttl(session.timeout, self.shared.tick);
        if limit < MIN_TTL {
            return Err(LockError::InvalidOptions {
                reason: format!(
                    "the ZooKeeper session timeout of {:?} (asked {:?}) leaves no safe ttl with a                      tick of {:?}: a lease may last at most two thirds of the session timeout less                      a tick; raise the session timeout with `ZookeeperBuilder::session_timeout`                      (within the server's maxSessionTimeout), or set `ZookeeperBuilder::tick_time`                      to the ensemble's tickTime",
                    session.timeout, self.shared.asked_timeout, self.shared.tick
                ),
            });
        }
        if ttl > limit {
            return Err(LockError::InvalidOptions {
                reason: format!(
                    "ttl {ttl:?} is longer than {limit:?}, two thirds of the ZooKeeper session                      timeout of {:?} (asked {:?}) less a tick of {:?}: the leader could expire                      the session, and delete the lock node, while the client still trusts the                      lease; lower the ttl, or raise the session timeout with                      `ZookeeperBuilder::session_timeout` (within the server's maxSessionTimeout)",
                    session.timeout, self.shared.asked_timeout, self.shared.tick
                ),
            });
        }
        Ok(())
    }
}

/// The longest ttl that is safe on a session of `timeout` granted by an ensemble ticking every
/// `tick`: two thirds of the timeout, less one tick.
///
/// The client trusts a lease until ttl (less its safety margin) after it *sent* the request that
/// confirmed it, at `t`. The leader ends the session a session timeout after it last heard of
/// it, and a follower's clients it hears of only in the follower's ping replies: every half
/// tick, the follower lists the sessions that sent anything since its previous reply. A request
/// the follower forwards — the confirmation itself — does not restart the leader's count. Cut
/// off just after it forwarded the confirmation, a follower may never report it; the last
/// report then came at most half a tick before the cut, and covered the session's latest
/// request before it. The client sends something at least every third of the session timeout
/// (the Java client pings after that long idle; zookeeper-client sooner, and renewals come every
/// ttl/3 ≤ that), so that request was sent at most a third of the timeout before the last report.
/// Hence the leader may count from `t − timeout/3 − tick/2` and end the session at
/// `t + 2·timeout/3 − tick/2`; the leader's rounding of expiries up to a whole tick only ends it
/// later. A ttl of `2·timeout/3 − tick` leaves the ping rounds, paced by the leader's loop and
/// delayed in flight, another half tick, and keeps the client's safety margin for what it is
/// for: drift between the clocks and replies in flight.
pub(super) fn safe_ttl(timeout: Duration, tick: Duration) -> Duration {
    (timeout * 2 / 3).saturating_sub(tick)
}

/// Below this the runtime refuses a ttl anyway.
const MIN_TTL: Duration = Duration::from_millis(1);

/// Opens a session on `hosts`, asking for `timeout`.
pub(super) async fn open(hosts: &str, timeout: Duration) -> Result<Session, LockError> {
    let connect = Client::connector()
        .with_session_timeout(timeout)
        // Report an unreachable ensemble once every host was tried, not after a session
        // timeout of retries. (Reconnection within a session retries as long as it lives.)
        .with_fail_eagerly()
        .connect(hosts);
    let client = with_spawner(connect).await.map_err(|error| {
        LockError::backend(format!("cannot connect to ZooKeeper at {hosts}: {error}"))
    })?;
    Ok(Session {
        id: client.session_id(),
        timeout: client.session_timeout(),
        client,
    })
}

/// Starts the tasks zookeeper-client spawns (its session task, spawned by `connect`) on dlock's
/// background runtime, so a session outlives the runtime of whichever caller opened it.
struct BackgroundSpawner;

impl spawns_core::Spawn for BackgroundSpawner {
    fn spawn(&self, task: spawns_core::Task) {
        drop(background::handle().spawn(Box::into_pin(task.future)));
    }
}

static SPAWNER: BackgroundSpawner = BackgroundSpawner;

/// Polls `future` with [`BackgroundSpawner`] as the thread's spawner.
async fn with_spawner<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    poll_fn(|cx| {
        let _scope = spawns_core::enter(&SPAWNER);
        future.as_mut().poll(cx)
    })
    .await
}

/// Errors after which the session can serve no request: its nodes are gone.
pub(super) fn ends_session(error: &ZkError) -> bool {
    matches!(
        error,
        ZkError::SessionExpired
            | ZkError::SessionMoved
            | ZkError::ClientClosed
            | ZkError::AuthFailed
    )
}

/// Errors a second try may not meet: a lost connection (the client reconnects by itself) or an
/// ended session (the backend opens a new one). Anything the server answered — `NoAuth`,
/// `BadArguments`, `InvalidAcl`, `Unimplemented`, `NoNode`, … — it would answer again.
pub(super) fn is_retryable(error: &ZkError) -> bool {
    lost_connection(error) || ends_session(error)
}

/// Errors that say the connection broke under the request, not what the server made of it: it
/// may or may not have landed, and the client reconnects by itself within the session.
///
/// zookeeper-client (0.11) fails the requests in flight with whatever error broke the
/// connection (`Session::serve_once`, `Depot::error`), and the session only goes
/// `Disconnected` and lives on. That is `ConnectionLoss` only for a clean end of stream; a link
/// gone silent ("no response from connection in …ms", after 40% of the session timeout) and a
/// socket error (a reset, a broken pipe) come as `Custom`. The client makes `Custom` only in its
/// session task, of a connection's failure, never of a server's answer, so all of it is a lost
/// connection. Not here: `Timeout`, which only establishing a session returns (`connect`), never
/// a request; and `UnexpectedError`/`UnmarshalError`, which a garbled reply also breaks the
/// connection with, but which say a server or client is broken (dlock's own `UnexpectedError`
/// says a parent kept vanishing), not that a second try may fare better.
pub(super) fn lost_connection(error: &ZkError) -> bool {
    matches!(error, ZkError::ConnectionLoss | ZkError::Custom(_))
}

/// A ZooKeeper error as a caller of the backend sees it.
pub(super) fn zk_error(error: ZkError) -> LockError {
    LockError::backend(format!("ZooKeeper: {error}"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::safe_ttl;

    #[test]
    fn the_safe_ttl_is_two_thirds_of_the_session_less_a_tick() {
        let s = Duration::from_secs;
        assert_eq!(safe_ttl(s(30), s(2)), s(18));
        assert_eq!(
            safe_ttl(s(6), Duration::from_millis(500)),
            Duration::from_millis(3500)
        );
        assert_eq!(safe_ttl(s(3), s(2)), Duration::ZERO);
    }
}
