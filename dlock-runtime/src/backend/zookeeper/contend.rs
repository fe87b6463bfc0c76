//! Acquisition: create a lock node, wait for the nodes ahead of it to go, watching only the one
//! just ahead, and take the key when none is left. It moves a [`LockNode`] through its
//! [`Stage`]s; the stage is what its guard cleans up by when the acquisition is abandoned. It
//! runs on dlock's background runtime, and its grant is handed to the caller to claim (see
//! [`claim`](super::claim)).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use zookeeper_client::{Client, Error as ZkError, EventType};

use super::claim::Grant;
use super::cleanup::synced_listing;
use super::node::{confirm_nodes, LockNode, Queued, Stage};
use super::paths::sequence;
use super::queue::list_or_empty;
use super::session::{ends_session, is_retryable, zk_error, Session};
use super::{Held, ZookeeperBackend, EPHEMERAL_SEQUENTIAL, PERSISTENT};
use crate::backend::{AcquireRequest, Acquired};
use crate::LockError;

/// How often an acquisition recreates a parent that a concurrent release deleted before giving
/// up. Each time needs a release to slip in between two of our requests.
const PARENT_RETRIES: usize = 16;

/// The children of the parent as listed in the create's round trip, and when the create was
/// sent.
type ListedWithCreate = (Vec<String>, Instant);

/// How often one acquisition tries again after an error that a retry may not meet: a few lost
/// connections (the client reconnects by itself, often to another server), and one ended
/// session (the backend opens a new one). Counted apart, so that the connection lost as a
/// session ends does not use up the move to a new session. Lost connections are counted within
/// a spell of trouble only: one more than [`FORGET_LOSSES_AFTER`] after the last is a new spell,
/// so that a long wait outlives an ensemble's rolling restart, a server at a time.
#[derive(Default)]
struct Retries {
    lost_connections: u8,
    last_loss: Option<Instant>,
    new_sessions: u8,
}

/// How long after a lost connection a next one starts the count again.
const FORGET_LOSSES_AFTER: Duration = Duration::from_secs(10);

impl Retries {
    const LOST_CONNECTIONS: u8 = 3;
    const NEW_SESSIONS: u8 = 1;

    /// Whether to try again after `error`, met at `now`, counting the try.
    fn allow(&mut self, error: &ZkError, now: Instant) -> bool {
        let (used, limit) = if ends_session(error) {
            (&mut self.new_sessions, Self::NEW_SESSIONS)
        } else if is_retryable(error) {
            if self
                .last_loss
                .is_some_and(|last| now.saturating_duration_since(last) > FORGET_LOSSES_AFTER)
            {
                self.lost_connections = 0;
            }
            self.last_loss = Some(now);
            (&mut self.lost_connections, Self::LOST_CONNECTIONS)
        } else {
            return false;
        };
        if *used >= limit {
            return false;
        }
        *used += 1;
        true
    }
}

impl ZookeeperBackend {
    /// One acquisition, bounded by its wait plus a session timeout (the ensemble may not
    /// answer). Runs on the background runtime (see [`claim`](super::claim)); a grant is not
    /// the caller's until claimed.
    pub(super) async fn acquire_bounded(
        &self,
        request: &AcquireRequest<'_>,
    ) -> Result<Option<Grant>, LockError> {
        let parent = self.shared.parent(request.key)?;
        let session = self.session().await?;
        self.check_ttl(request.ttl, &session)?;
        let limit = request.wait.saturating_add(session.timeout);
        match tokio::time::timeout(limit, self.acquire_on(session, request, parent)).await {
            Ok(acquired) => acquired,
            // The node guard of the dropped attempt deletes whatever it created.
            Err(_) => Err(LockError::backend(format!(
                "ZooKeeper did not answer within {limit:?}"
            ))),
        }
    }

    /// Acquires on `session`, trying once more on a lost connection or an ended session. The
    /// ttl was checked against `session`; a new session is checked again, since the ensemble
    /// may grant it a shorter timeout (another server, another `maxSessionTimeout`), and a
    /// lease must not outlast what its own session can vouch for.
    pub(super) async fn acquire_on(
        &self,
        mut session: Session,
        request: &AcquireRequest<'_>,
        parent: String,
    ) -> Result<Option<Grant>, LockError> {
        let now = Instant::now();
        // A wait too long to add is a wait without end.
        let deadline = now
            .checked_add(request.wait)
            .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600));
        let mut retries = Retries::default();
        let mut parent_missing = false;
        if request.wait.is_zero() {
            // A try that is sure to fail creates nothing: no churn of nodes and watches on a
            // busy key.
            loop {
                match session.client.list_children(&parent).await {
                    Ok(children) if children.iter().any(|c| sequence(c).is_some()) => {
                        return Ok(None)
                    }
                    Ok(_) => break,
                    Err(ZkError::NoNode) => {
                        parent_missing = true;
                        break;
                    }
                    Err(error @ ZkError::BadArguments(_)) => {
                        return Err(refused_path(request.key, &parent, &error))
                    }
                    Err(error) if retries.allow(&error, Instant::now()) => {
                        session = self.session().await?;
                        self.check_ttl(request.ttl, &session)?;
                    }
                    Err(error) => return Err(zk_error(error)),
                }
            }
        }
        let mut node = LockNode::new(
            &session,
            parent,
            request.owner,
            request.label,
            &self.shared.cleanups,
        );
        node.parent_missing = parent_missing;
        loop {
            match self.contend(&mut node, deadline).await {
                Ok(acquired) => return Ok(acquired),
                Err(error @ ZkError::BadArguments(_)) => {
                    // Nothing was created: the server refused the path, as it would again.
                    return Err(refused_path(request.key, &node.parent, &error));
                }
                Err(error) if retries.allow(&error, Instant::now()) => {
                    let fresh = self.session().await?;
                    if fresh.id != node.session {
                        // Our node, if any, went with the old session.
                        node.stage = Stage::Gone;
                        self.check_ttl(request.ttl, &fresh)?;
                        node = LockNode::new(
                            &fresh,
                            node.parent.clone(),
                            request.owner,
                            request.label,
                            &self.shared.cleanups,
                        );
                    }
                    // On the same session the node goes on from its stage: a create whose
                    // answer the lost connection took is looked for before another is sent.
                }
                Err(error) => return Err(zk_error(error)),
            }
        }
    }

    /// Moves `node` on from its stage until it is granted or `deadline` passes (`None`, the
    /// node deleted): creates it if it does not exist yet, and waits, watching its predecessor,
    /// until it is the oldest. An error leaves the node in the stage it reached, for a retry on
    /// the same session or for its guard. A grant is not yet the caller's: it is theirs once
    /// claimed (see [`claim`](super::claim)).
    async fn contend(
        &self,
        node: &mut LockNode,
        deadline: Instant,
    ) -> Result<Option<Grant>, ZkError> {
        let client = node.client.clone();
        // A listing that came with the create, and the create's send time: the create was a
        // write, so its success confirms the session and the node through the quorum. Set
        // only as the node becomes queued, and taken by the very next step.
        let mut listed: Option<ListedWithCreate> = None;
        let mut parents_made = 0;
        loop {
            let queued = match &mut node.stage {
                Stage::CreateUnanswered => {
                    node.stage = find_unanswered_create(&client, node).await?;
                    continue;
                }
                Stage::NotCreated => {
                    listed = create(&client, node, &mut parents_made).await?;
                    continue;
                }
                Stage::Queued(queued) => queued,
                Stage::Granted | Stage::Gone => {
                    unreachable!("a granted or deleted lock node contends no more")
                }
            };
            let (children, confirmed_at) = match listed.take() {
                Some((children, sent_at)) => (children, Some(sent_at)),
                None => (list_or_empty(&client, &node.parent).await?, None),
            };
            if !children.contains(&queued.name) {
                // Deleted from outside (an operator, or a forced release of a waiter).
                node.stage = Stage::NotCreated;
                if Instant::now() >= deadline {
                    node.stage = Stage::Gone;
                    return Ok(None);
                }
                continue;
            }
            let ahead = queued.still_ahead(&client, &node.parent, &children).await?;
            if ahead.is_empty() {
                // No node is ahead any more, and none can come ahead: that holds whoever served
                // the listing. Whether our node and session still live is the leader's word,
                // which a server cut off from it would answer from a stale copy: unless the
                // create just confirmed it, a write does.
                let path = format!("{}/{}", node.parent, queued.name);
                let valid_from = match confirmed_at {
                    Some(sent_at) => sent_at,
                    None => {
                        let sent_at = Instant::now();
                        if !confirm_nodes(&client, &[path.as_str()]).await?[0] {
                            node.stage = Stage::NotCreated;
                            continue;
                        }
                        sent_at
                    }
                };
                let fence = u64::try_from(queued.czxid).unwrap_or(0);
                node.stage = Stage::Granted;
                return Ok(Some(Grant {
                    acquired: Acquired { fence, valid_from },
                    held: Held {
                        path,
                        parent: node.parent.clone(),
                        session: node.session,
                    },
                    client,
                }));
            }
            if Instant::now() >= deadline {
                node.remove().await;
                return Ok(None);
            }
            let (_, just_ahead) = &ahead[ahead.len() - 1];
            let predecessor = format!("{}/{just_ahead}", node.parent);
            let (stat, watcher) = client.check_and_watch_stat(&predecessor).await?;
            if stat.is_none() {
                // Gone between the list and the watch: list again.
                continue;
            }
            tokio::select! {
                event = watcher.changed() => {
                    if event.event_type == EventType::NodeDeleted {
                        self.shared.watch_events.fetch_add(1, Ordering::Relaxed);
                    }
                    // A session event ends the session's requests: the next one says so.
                }
                () = tokio::time::sleep_until(deadline.into()) => {}
            }
        }
    }
}

/// The error for a key whose parent's path ZooKeeper refused (`BadArguments`): the key is
/// escaped so that this should not happen, and it would happen again on every retry.
fn refused_path(key: &str, parent: &str, error: &ZkError) -> LockError {
    LockError::InvalidKey {
        key: key.to_owned(),
        reason: format!("ZooKeeper refused the path of its lock nodes, under {parent}: {error}"),
    }
}

/// The stage after a create whose answer was lost: it may have landed, so the node is looked
/// for by its owner prefix. [`Queued`](Stage::Queued) when it is there, else
/// [`NotCreated`](Stage::NotCreated). An error leaves the question open.
async fn find_unanswered_create(client: &Client, node: &LockNode) -> Result<Stage, ZkError> {
    let children = synced_listing(client, &node.parent).await?;
    if let Some(name) = children.iter().find(|c| node.is_ours(c)) {
        let path = format!("{}/{name}", node.parent);
        if let Some(stat) = client.check_stat(&path).await? {
            return Ok(Stage::Queued(Queued::new(name.clone(), stat.czxid)));
        }
    }
    Ok(Stage::NotCreated)
}

/// Sends the create of `node`, which is [`NotCreated`](Stage::NotCreated), making it
/// [`CreateUnanswered`](Stage::CreateUnanswered) until the answer comes:
/// [`Queued`](Stage::Queued) with the listing and the create's send time when it was created;
/// `NotCreated` again, with `None`, when the parent was missing (it is made now, and the create
/// is to be sent again); an error otherwise, `CreateUnanswered` unless the answer said the
/// parent kept vanishing or the server refused the path (`BadArguments`, for the parent's
/// create or the node's: nothing was created, and a retry would meet the same answer).
async fn create(
    client: &Client,
    node: &mut LockNode,
    parents_made: &mut usize,
) -> Result<Option<ListedWithCreate>, ZkError> {
    node.stage = Stage::CreateUnanswered;
    let sent_at = Instant::now();
    // Pipelined, one round trip: the session's requests are served in order, so the create
    // finds the parent made just before it (when it was seen missing), and the list includes
    // the node the create makes.
    let make_parent = node
        .parent_missing
        .then(|| client.create(&node.parent, &[], &PERSISTENT));
    let create = client.create(&node.prefix, node.data.as_bytes(), &EPHEMERAL_SEQUENTIAL);
    let list = client.list_children(&node.parent);
    let make_parent = async move {
        match make_parent {
            Some(made) => made.await.map(drop),
            None => Ok(()),
        }
    };
    let (made, created, children) = tokio::join!(make_parent, create, list);
    // A refused parent fails its node's create with `NoNode`, which is not the parent
    // vanishing: say what the server said.
    if let Err(error @ ZkError::BadArguments(_)) = made {
        node.stage = Stage::NotCreated;
        return Err(error);
    }
    match created {
        Ok((stat, sequence)) => {
            let name = format!("{}{sequence}", node.own_prefix);
            node.stage = Stage::Queued(Queued::new(name, stat.czxid));
            Ok(Some((children?, sent_at)))
        }
        Err(ZkError::NoNode) if *parents_made < PARENT_RETRIES => {
            // The parent is missing, or a release deleted it between our steps.
            node.stage = Stage::NotCreated;
            *parents_made += 1;
            if node.parent_missing && matches!(made, Err(ZkError::NoNode)) {
                // The root itself is gone.
                client.mkdir(&node.parent, &PERSISTENT).await?;
            }
            node.parent_missing = true;
            Ok(None)
        }
        Err(error @ ZkError::BadArguments(_)) => {
            node.stage = Stage::NotCreated;
            Err(error)
        }
        Err(ZkError::NoNode) => {
            node.stage = Stage::NotCreated;
            Err(ZkError::UnexpectedError(format!(
                "the parent {} kept vanishing",
                node.parent
            )))
        }
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A long wait through a rolling restart meets a lost connection per server restarted, far
    /// apart: each is tried again. Four in quick succession are not.
    #[test]
    fn lost_connections_far_apart_are_each_tried_again() {
        let start = Instant::now();
        let mut spread = Retries::default();
        for server in 0..5 {
            let at = start + Duration::from_secs(30) * server;
            assert!(spread.allow(&ZkError::ConnectionLoss, at), "loss {server}");
        }
        let mut bunched = Retries::default();
        let allowed: Vec<bool> = (0..4)
            .map(|n| bunched.allow(&ZkError::ConnectionLoss, start + Duration::from_secs(n)))
            .collect();
        assert_eq!(allowed, [true, true, true, false]);
        assert!(bunched.allow(&ZkError::SessionExpired, start));
        assert!(!bunched.allow(&ZkError::SessionExpired, start));
    }

    /// zookeeper-client fails a request with the error that broke its connection, which is
    /// `ConnectionLoss` only for a clean end of stream: a silent link and a reset come as
    /// `Custom`, while the session lives on. Those are tried again, as lost connections are;
    /// what the server answered, or a session that cannot be had, is not, however far apart.
    #[tokio::test]
    async fn a_connection_broken_by_silence_or_a_reset_is_lost_and_a_server_s_answer_final() {
        let silent = broken_connection_error(Break::Silence).await;
        let reset = broken_connection_error(Break::Reset).await;
        assert!(
            matches!(&silent, ZkError::Custom(_)) && silent.to_string().contains("no response"),
            "{silent:?}"
        );
        assert!(matches!(&reset, ZkError::Custom(_)), "{reset:?}");
        for lost in [&silent, &reset, &ZkError::ConnectionLoss] {
            assert!(is_retryable(lost), "{lost:?}");
            assert!(Retries::default().allow(lost, Instant::now()), "{lost:?}");
        }

        let start = Instant::now();
        for error in [
            ZkError::NoAuth,
            ZkError::BadArguments(&"invalid path"),
            ZkError::InvalidAcl,
            ZkError::Unimplemented,
            ZkError::NoNode,
            ZkError::NodeExists,
            ZkError::QuotaExceeded,
            ZkError::UnexpectedError("the parent /dlock/k kept vanishing".into()),
            ZkError::Timeout,
            ZkError::NoHosts,
        ] {
            assert!(!is_retryable(&error), "{error:?}");
            let mut retries = Retries::default();
            for n in 0..5 {
                let at = start + Duration::from_secs(60) * n;
                assert!(!retries.allow(&error, at), "{error:?}, try {n}");
            }
        }
    }

    /// How [`broken_connection_error`] breaks the connection under the request.
    #[derive(Clone, Copy)]
    enum Break {
        /// Nothing more comes, and nothing closes.
        Silence,
        /// The server's side closes with the request unread: the client's socket is reset.
        Reset,
    }

    /// The error zookeeper-client fails a request with when its connection breaks as `how`
    /// says. Its `Custom` errors cannot be made outside it, so a listener here plays a server
    /// just far enough for the client to have a session (its handshake and pings) and send the
    /// request; the backend's behaviour on a real server is the integration tests' to show.
    async fn broken_connection_error(how: Break) -> ZkError {
        use std::io::{Read, Write};
        use std::net::{TcpListener, TcpStream};

        fn frame(stream: &mut TcpStream) -> Option<Vec<u8>> {
            let mut len = [0; 4];
            stream.read_exact(&mut len).ok()?;
            let mut body = vec![0; usize::try_from(i32::from_be_bytes(len)).ok()?];
            stream.read_exact(&mut body).ok()?;
            Some(body)
        }
        fn send(stream: &mut TcpStream, body: &[u8]) {
            let len = i32::try_from(body.len()).unwrap().to_be_bytes();
            stream.write_all(&[&len[..], body].concat()).unwrap();
        }

        const PING_XID: i32 = -2;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            frame(&mut stream).expect("a connect request");
            // Protocol 0, a session of 2 s, id 1, a password of 16 bytes, not read-only.
            let mut granted = 0_i32.to_be_bytes().to_vec();
            granted.extend(2000_i32.to_be_bytes());
            granted.extend(1_i64.to_be_bytes());
            granted.extend(16_i32.to_be_bytes());
            granted.extend([0; 16]);
            granted.push(0);
            send(&mut stream, &granted);
            // Pings are answered until a request comes, which is left unread.
            loop {
                let mut head = [0; 8];
                while stream.peek(&mut head).unwrap() < head.len() {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let xid = i32::from_be_bytes(head[4..].try_into().unwrap());
                if xid != PING_XID {
                    break;
                }
                frame(&mut stream).unwrap();
                let mut pong = PING_XID.to_be_bytes().to_vec();
                pong.extend(0_i64.to_be_bytes());
                pong.extend(0_i32.to_be_bytes());
                send(&mut stream, &pong);
            }
            match how {
                // Held open until the client gives up on it.
                Break::Silence => while frame(&mut stream).is_some() {},
                // Closed with the request unread, which resets the connection.
                Break::Reset => {}
            }
        });
        let session = super::super::session::open(&address, Duration::from_secs(2))
            .await
            .unwrap();
        let error = session.client.check_stat("/k").await.unwrap_err();
        assert!(
            !session.client.state().is_terminated(),
            "the session ended with the connection: {:?}",
            session.client.state()
        );
        error
    }
}
