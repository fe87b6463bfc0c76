//! A key's queue: its lock nodes in creation order, the holder first. The order is the nodes'
//! `czxid`s, never the numbers in their names, which wrap (see the module docs).

use zookeeper_client::{Client, Error as ZkError, MultiReadResult, Stat};

use super::batch::batches;
use super::paths::sequence;

/// The children of `parent`; none when there is no parent.
pub(super) async fn list_or_empty(client: &Client, parent: &str) -> Result<Vec<String>, ZkError> {
    match client.list_children(parent).await {
        Ok(children) => Ok(children),
        Err(ZkError::NoNode) => Ok(Vec::new()),
        Err(error) => Err(error),
    }
}

/// The lock nodes under `parent`, in creation order (the holder first); empty when there is no
/// parent.
pub(super) async fn queue_in_creation_order(
    client: &Client,
    parent: &str,
) -> Result<Vec<String>, ZkError> {
    let children = list_or_empty(client, parent).await?;
    Ok(creation_order(
        creation_zxids(client, parent, children).await?,
    ))
}

/// The `czxid` of each lock node among `children` of `parent` (see [`read_lock_nodes`]).
pub(super) async fn creation_zxids(
    client: &Client,
    parent: &str,
    children: Vec<String>,
) -> Result<Vec<(i64, String)>, ZkError> {
    Ok(read_lock_nodes(client, parent, children)
        .await?
        .into_iter()
        .map(|node| (node.stat.czxid, node.name))
        .collect())
}

/// A lock node as read: its name, stat and data.
pub(super) struct NodeRead {
    pub(super) name: String,
    pub(super) stat: Stat,
    pub(super) data: Vec<u8>,
}

/// Each lock node among `children` of `parent`, read in `multiRead`s of as many nodes as the
/// server accepts in one request (see [`batch`](super::batch)), the requests pipelined. Other
/// names, and nodes gone since the listing, are left out; a node that cannot be read for
/// another reason (its ACL, say) is an error.
pub(super) async fn read_lock_nodes(
    client: &Client,
    parent: &str,
    children: Vec<String>,
) -> Result<Vec<NodeRead>, ZkError> {
    let names: Vec<String> = children
        .into_iter()
        .filter(|name| sequence(name).is_some())
        .collect();
    let mut reads = Vec::new();
    // Every path is the parent's and a short name.
    for chunk in batches(&names, |name| parent.len() + 1 + name.len()) {
        let mut reader = client.new_multi_reader();
        for name in chunk {
            reader.add_get_data(&format!("{parent}/{name}"))?;
        }
        reads.push(reader.commit());
    }
    let mut found = Vec::with_capacity(names.len());
    let mut names = names.into_iter();
    for read in reads {
        for result in read.await? {
            let name = names.next().unwrap_or_default();
            match result {
                MultiReadResult::Data { stat, data } => found.push(NodeRead { name, stat, data }),
                // Gone since the listing: it is ahead of nobody any more.
                MultiReadResult::Error {
                    err: ZkError::NoNode,
                } => {}
                // A node whose age is unknown may be ahead of ours: leaving it out would let a
                // waiter pass it and hold the key beside it.
                MultiReadResult::Error { err } => return Err(err),
                _ => {
                    return Err(ZkError::UnexpectedError(format!(
                        "a read of {parent}/{name} did not answer its data"
                    )))
                }
            }
        }
    }
    Ok(found)
}

/// Lock nodes with their `czxid`s, in creation order; other names are left out. The numbers in
/// the names play no part: they wrap (see the module docs).
fn creation_order(nodes: Vec<(i64, String)>) -> Vec<String> {
    let mut nodes: Vec<(i64, String)> = nodes
        .into_iter()
        .filter(|(_, name)| sequence(name).is_some())
        .collect();
    nodes.sort_unstable();
    nodes.into_iter().map(|(_, name)| name).collect()
}

#[cfg(test)]
mod tests {
    use super::creation_order;

    #[test]
    fn the_queue_is_in_creation_order_and_skips_foreign_nodes() {
        let nodes = vec![
            (12, "b-0000000010".to_owned()),
            (11, "a-0000000009".to_owned()),
            (5, "readme".to_owned()),
            (13, "c-2147483648000".to_owned()),
            (1, "-0000000001".to_owned()),
            (14, "d-7-0000000011".to_owned()),
        ];
        assert_eq!(
            creation_order(nodes),
            vec![
                "a-0000000009",
                "b-0000000010",
                "c-2147483648000",
                "d-7-0000000011"
            ]
        );
    }

    /// Around the counter's wrap the numbers in the names fall from the largest to the smallest
    /// while the nodes keep being created in order: the queue follows the creation zxids, so
    /// the node created before the wrap stays first, and one whose number is `-1` is not lost.
    #[test]
    fn the_queue_keeps_creation_order_across_the_counter_wrap() {
        let czxid = |n: i64| 0x0000_0007_0000_0000 + n;
        let nodes = vec![
            (czxid(4), "e--000000001".to_owned()),
            (czxid(3), "d--2147483647".to_owned()),
            (czxid(1), "b-2147483647".to_owned()),
            (czxid(0), "a-2147483646".to_owned()),
            (czxid(2), "c--2147483648".to_owned()),
            (czxid(5), "f-0000000000".to_owned()),
        ];
        assert_eq!(
            creation_order(nodes),
            vec![
                "a-2147483646",
                "b-2147483647",
                "c--2147483648",
                "d--2147483647",
                "e--000000001",
                "f-0000000000"
            ]
        );
    }
}
