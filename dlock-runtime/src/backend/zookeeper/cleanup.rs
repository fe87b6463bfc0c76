//! Deleting lock nodes nobody will use any more — an abandoned waiter's, a released holder's
//! whose delete went unanswered — from the background, until the deletion is confirmed or the
//! session the node lives on has ended.
//!
//! A node left behind blocks its key for as long as its session lives, and the session can
//! outlive the connection by far: the client reconnects within the session timeout. A request
//! in flight when the connection breaks fails (see [`lost_connection`]) without saying whether
//! it landed, so the only safe end is an answer: the node deleted, or already gone, or the
//! session ended (which deletes it). A fixed count of tries is never enough: a link that breaks
//! under every request can outlast any count while the session survives. The pause between
//! tries grows from [`FIRST_PAUSE`] to [`LONGEST_PAUSE`], so a long outage costs one request a
//! second.

use std::future::Future;
use std::time::Duration;

use zookeeper_client::{Client, Error as ZkError};

use super::node::delete_node;
use super::paths::sequence;
use super::queue::list_or_empty;
use super::session::{ends_session, lost_connection};

/// The pause after the first failed try.
const FIRST_PAUSE: Duration = Duration::from_millis(50);

/// The longest pause between two tries.
const LONGEST_PAUSE: Duration = Duration::from_secs(1);

/// Deletes the lock node at `path` (and `parent`, if that leaves it empty) until the server
/// confirms that the node is gone, or the session it lives on has ended. Answers whether this
/// delete took the node: `false` where it was gone already, or went with its session.
pub(super) async fn delete_until_confirmed(client: &Client, path: &str, parent: &str) -> bool {
    until_answered(path, || delete_node(client, path, parent))
        .await
        .unwrap_or(false)
}

/// [`delete_until_confirmed`] for a node whose answer nobody waits for: a clean-up's task.
pub(super) async fn delete_abandoned(client: Client, path: String, parent: String) {
    delete_until_confirmed(&client, &path, &parent).await;
}

/// Deletes the lock nodes under `parent` whose names start with `own_prefix`: what a create
/// whose answer was lost may have made. The listing is read after a `sync` (see
/// [`synced_listing`]), so it shows the node if the create landed.
pub(super) async fn delete_unanswered_create(client: Client, parent: String, own_prefix: String) {
    let Some(children) = until_answered(&parent, || synced_listing(&client, &parent)).await else {
        // The session ended, and the node, if any, with it.
        return;
    };
    let ours = children
        .into_iter()
        .filter(|name| name.starts_with(&own_prefix) && sequence(name).is_some());
    for name in ours {
        delete_until_confirmed(&client, &format!("{parent}/{name}"), &parent).await;
    }
}

/// The children of `parent` as the leader has them once everything it received before has
/// committed. After a lost connection the client may be served by another server, which only
/// promises to be as recent as the last answer the client saw: a create whose answer was lost
/// could be missing from its copy still, and a node found missing would then be left, blocking
/// the key, for as long as the session lives. A `sync` first makes that server catch up with the
/// leader.
pub(super) async fn synced_listing(client: &Client, parent: &str) -> Result<Vec<String>, ZkError> {
    match client.sync(parent).await {
        Ok(()) | Err(ZkError::NoNode) => {}
        Err(error) => return Err(error),
    }
    list_or_empty(client, parent).await
}

/// Runs `attempt` until it answers: its value, or `None` once an error says the session ended
/// or that no retry can succeed (the node is not ours to delete: an operator's ACL, a path the
/// server refuses), when the node is left to go with its session. Every other error (above all
/// a lost connection) is tried again after a pause.
async fn until_answered<T, F, Fut>(path: &str, mut attempt: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ZkError>>,
{
    let mut pause = FIRST_PAUSE;
    let mut warned = false;
    loop {
        match attempt().await {
            Ok(value) => return Some(value),
            Err(error) if ends_session(&error) => return None,
            Err(error) if is_permanent(&error) => {
                tracing::warn!(%path, %error, "distributed_lock: cannot clean up a ZooKeeper lock node; it goes when its session ends");
                return None;
            }
            Err(error) if lost_connection(&error) => {
                tracing::debug!(%path, "distributed_lock: ZooKeeper connection lost while cleaning up a lock node; trying again");
            }
            Err(error) if !warned => {
                // Said once: the tries go on, and a warning a second would drown the log.
                warned = true;
                tracing::warn!(%path, %error, "distributed_lock: cannot clean up a ZooKeeper lock node; trying again until its session ends");
            }
            Err(_) => {}
        }
        tokio::time::sleep(pause).await;
        pause = next_pause(pause);
    }
}

/// Whether `error` says a clean-up can never succeed, however often tried: the server refuses
/// the request itself, not the moment.
fn is_permanent(error: &ZkError) -> bool {
    matches!(
        error,
        ZkError::NoAuth | ZkError::BadArguments(_) | ZkError::InvalidAcl | ZkError::Unimplemented
    )
}

/// The pause after `pause`: twice as long, up to [`LONGEST_PAUSE`].
fn next_pause(pause: Duration) -> Duration {
    (pause * 2).min(LONGEST_PAUSE)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use zookeeper_client::Error as ZkError;

    use super::{next_pause, until_answered, FIRST_PAUSE};

    /// A node the server will never let this client delete (an operator's ACL on the key's
    /// parent) is given up at once, not tried every second for the life of the session.
    #[tokio::test]
    async fn a_clean_up_the_server_refuses_for_good_is_given_up() {
        let mut tries = 0;
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            until_answered("/dlock/k/n", || {
                tries += 1;
                async { Err::<(), _>(ZkError::NoAuth) }
            }),
        )
        .await;
        assert_eq!(answer, Ok(None));
        assert_eq!(tries, 1);
    }

    #[test]
    fn the_pause_doubles_from_50_ms_up_to_a_second() {
        let pauses: Vec<u128> = std::iter::successors(Some(FIRST_PAUSE), |p| Some(next_pause(*p)))
            .take(8)
            .map(|p| p.as_millis())
            .collect();
        assert_eq!(pauses, [50, 100, 200, 400, 800, 1000, 1000, 1000]);
        assert_eq!(next_pause(Duration::from_secs(1)), Duration::from_secs(1));
    }
}
