//! The holder's description a lock node carries as its data, written with the node by its
//! create (no request of its own), and read back for `inspect`.
//!
//! The data is `{owner}\n{pid}\n{host}\n{label}`: the owner token first, as an earlier dlock
//! wrote it alone (such a node still reads, described by its owner only); the label last, so it
//! may hold any character, a line break too; the host name holds none. The label is cut to
//! [`TEXT_BOUND`](crate::inspect::TEXT_BOUND), which keeps a queue's
//! reads of a thousand nodes far from the server's request limit.

use crate::inspect::bounded;
use crate::Owner;

/// The data of a lock node of `owner`'s acquisition under `label`, from this process.
pub(super) fn node_data(owner: Owner, label: &str) -> String {
    let host = bounded(crate::inspect::this_host());
    format!(
        "{owner}\n{}\n{host}\n{}",
        std::process::id(),
        bounded(label)
    )
}

/// What a lock node's data says of its holder.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct NodeData {
    pub(super) owner: String,
    /// `None` for a node an earlier dlock created, whose data is the owner alone.
    pub(super) pid: Option<u32>,
    pub(super) host: Option<String>,
    pub(super) label: Option<String>,
}

/// Reads a lock node's data, of this version or an earlier one.
pub(super) fn parse_node_data(data: &[u8]) -> NodeData {
    let data = String::from_utf8_lossy(data);
    let mut fields = data.splitn(4, '\n');
    let owner = fields.next().unwrap_or_default().to_owned();
    let pid = fields.next().and_then(|pid| pid.parse().ok());
    let host = fields.next().map(str::to_owned);
    let label = fields.next().map(str::to_owned);
    NodeData {
        owner,
        pid,
        host,
        label,
    }
}

#[cfg(test)]
mod tests {
    use super::{node_data, parse_node_data, NodeData};
    use crate::Owner;

    #[test]
    fn a_node_carries_its_holder_and_one_of_an_earlier_version_still_reads() {
        let owner = Owner::random();
        let read = parse_node_data(node_data(owner, "report\nof the night").as_bytes());
        assert_eq!(read.owner, owner.to_string());
        assert_eq!(read.pid, Some(std::process::id()));
        assert_eq!(read.host.as_deref(), Some(crate::inspect::this_host()));
        assert_eq!(read.label.as_deref(), Some("report\nof the night"));
        assert_eq!(
            parse_node_data(owner.to_string().as_bytes()),
            NodeData {
                owner: owner.to_string(),
                pid: None,
                host: None,
                label: None
            }
        );
    }
}
