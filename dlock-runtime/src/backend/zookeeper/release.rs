//! Releasing a lease: its lock node's delete runs as one of the backend's clean-ups, started
//! before the release awaits anything, and is sent again until the server confirms it or the
//! session ends, whether or not anyone still waits for its answer.
//!
//! Run in the release's own future, the delete would stop with it. The caller may stop waiting
//! (a `select!` that took another branch, an aborted task, the locker's own patience with a store
//! that does not answer) while the delete is on a connection that then breaks: the client fails
//! it without sending it again, reconnects within the session, and the node — on a session that
//! lives on — would block the key for as long as the process runs. So the release only waits
//! for the clean-up's answer, within the session timeout.
//!
//! Until that answer the owner's entry stays, as [`Holding::Releasing`]: a second release of
//! the owner (the locker sends one for a caller that stopped waiting, and a shutdown one for a
//! release in flight) waits for the same delete, and answers `Ok(false)` once the node is gone
//! (it was not the one that released it), rather than at once while the node is still there.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::watch;
use zookeeper_client::{Client, SessionId};

use super::cleanup::delete_until_confirmed;
use super::{Held, Shared, ZookeeperBackend};
use crate::{LockError, Owner};

/// An owner's lock node, from its grant until its release is answered.
pub(super) enum Holding {
    /// A lease is held through it.
    Held(Held),
    /// Its release's delete is in flight.
    Releasing(Releasing),
}

impl Holding {
    /// The session the node lives on.
    pub(super) fn session(&self) -> SessionId {
        match self {
            Holding::Held(held) => held.session,
            Holding::Releasing(releasing) => releasing.session,
        }
    }

    /// The node, while a lease is held through it.
    pub(super) fn held(&self) -> Option<&Held> {
        match self {
            Holding::Held(held) => Some(held),
            Holding::Releasing(_) => None,
        }
    }
}

/// A release's delete in flight.
pub(super) struct Releasing {
    session: SessionId,
    /// Whether the delete took the node, once it is confirmed: `false` where the node was gone
    /// already, or went with its session.
    answer: watch::Receiver<Option<bool>>,
}

impl ZookeeperBackend {
    /// Releases `owner`'s lock node (see the module docs): `Ok(true)` once its delete took the
    /// node; `Ok(false)` where the owner holds nothing here, the node went with its session, or
    /// another release of the owner took it.
    pub(super) async fn release_node(&self, owner: Owner) -> Result<bool, LockError> {
        let session = self.shared.current();
        // Started, or found started, before anything is awaited: this future may be dropped
        // at its first await.
        let (answer, took_it) = {
            let mut holdings = self.shared.held();
            match holdings.remove(&owner) {
                None => return Ok(false),
                // Another release is taking the node: this one answers that the key is not
                // held, once that is true.
                Some(Holding::Releasing(releasing)) => {
                    let answer = releasing.answer.clone();
                    holdings.insert(owner, Holding::Releasing(releasing));
                    (answer, false)
                }
                Some(Holding::Held(held)) => {
                    if held.session != session.id || session.client.state().is_terminated() {
                        // The node went with its session.
                        return Ok(false);
                    }
                    let answer = self.delete_released(owner, held, &session.client);
                    let releasing = Releasing {
                        session: session.id,
                        answer: answer.clone(),
                    };
                    holdings.insert(owner, Holding::Releasing(releasing));
                    (answer, true)
                }
            }
        };
        let existed = answer_within(answer, session.timeout).await?;
        Ok(existed && took_it)
    }

    /// Starts the delete of `held`, `owner`'s released node, as a clean-up (which `close` waits
    /// for); the receiver gets its answer. Once answered, the owner's entry goes.
    fn delete_released(
        &self,
        owner: Owner,
        held: Held,
        client: &Client,
    ) -> watch::Receiver<Option<bool>> {
        let (publish, answer) = watch::channel(None);
        // Weak: a backend dropped meanwhile has no entry left to remove, and the delete goes on
        // all the same.
        let shared: Weak<Shared> = Arc::downgrade(&self.shared);
        let client = client.clone();
        self.shared.cleanups.spawn(async move {
            let existed = delete_until_confirmed(&client, &held.path, &held.parent).await;
            if let Some(shared) = shared.upgrade() {
                let mut holdings = shared.held();
                // An owner's node is released once; only a new grant could be there instead.
                if matches!(holdings.get(&owner), Some(Holding::Releasing(_))) {
                    holdings.remove(&owner);
                }
            }
            publish.send_replace(Some(existed));
        });
        answer
    }
}

/// The delete's answer, waited for at most `patience`; the delete goes on after that.
async fn answer_within(
    mut answer: watch::Receiver<Option<bool>>,
    patience: Duration,
) -> Result<bool, LockError> {
    match tokio::time::timeout(patience, answer.wait_for(Option::is_some)).await {
        Ok(Ok(existed)) => Ok(existed.unwrap_or(false)),
        Ok(Err(_)) => Err(LockError::backend(
            "the ZooKeeper release ended without an answer (dlock's background runtime stopped)",
        )),
        Err(_) => Err(LockError::backend(format!(
            "ZooKeeper did not confirm a release within {patience:?}; its delete is sent again \
             until it is confirmed or the session ends"
        ))),
    }
}
