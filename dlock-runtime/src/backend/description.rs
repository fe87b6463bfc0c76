//! What the stores that keep a holder's description beside its lease (MySQL, PostgreSQL and
//! ZooKeeper) share: the owner read back from the store, and, for the SQL
//! stores, the key range a prefix stands for.

use std::time::{Duration, UNIX_EPOCH};

use crate::{Holder, LockError, Owner};

/// The owner written as 32 hex digits (how every store keeps it); `None` for anything else.
pub(super) fn parse_owner(hex: &str) -> Option<Owner> {
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u128::from_str_radix(hex, 16).ok().map(Owner::from_u128)
}

/// A holder as a row or a node describes it, read back for [`Backend::inspect`](super::Backend::inspect).
pub(super) struct Described {
    /// The owner as stored.
    pub(super) owner: String,
    pub(super) fence: u64,
    /// When it was granted, in microseconds since the epoch by the store's clock.
    pub(super) acquired_us: i64,
    /// How long it has to live, where the store counts it.
    pub(super) left_us: Option<i64>,
    /// The label, host and process id, where a version that writes them granted the lease.
    pub(super) label: Option<String>,
    pub(super) host: Option<String>,
    pub(super) pid: Option<u32>,
}

impl Described {
    /// The holder of `key` on `store` this describes; [`LockError::Backend`] for an owner no
    /// dlock wrote.
    pub(super) fn holder(self, store: &str, key: &str) -> Result<Holder, LockError> {
        let owner = parse_owner(&self.owner).ok_or_else(|| {
            LockError::backend(format!(
                "{store}: the lock of `{key}` holds an owner no dlock wrote: {:?}",
                self.owner.chars().take(64).collect::<String>()
            ))
        })?;
        let since_epoch = Duration::from_micros(u64::try_from(self.acquired_us).unwrap_or(0));
        let mut holder = Holder::new(owner, self.fence, UNIX_EPOCH + since_epoch)
            .with_label(self.label.unwrap_or_default());
        if let Some(left) = self.left_us {
            holder = holder.with_time_left(Duration::from_micros(u64::try_from(left).unwrap_or(0)));
        }
        if let Some(host) = self.host.filter(|host| !host.is_empty()) {
            holder = holder.with_host(host);
        }
        if let Some(pid) = self.pid {
            holder = holder.with_pid(pid);
        }
        Ok(holder)
    }
}

/// How many keys one statement of a listing reads: the listing goes on from the last key read,
/// a page at a time (each page a short range read of the primary key), until a page comes back
/// short. So no statement runs long, and the answer is every held key whatever their number.
#[cfg(any(feature = "mysql", feature = "postgres"))]
pub(super) const LIST_PAGE: usize = 1000;

/// The keys that start with `prefix`, as a range of the primary key, which compares keys byte
/// by byte (`VARBINARY`, `BYTEA`): from `prefix` itself, up to (not including) the returned end;
/// `None` where no end is needed (an empty prefix, or one of `0xFF` bytes only). A range rather
/// than `LIKE 'prefix%'`: no byte of the prefix is a pattern character (`%`, `_` and `\` match
/// themselves), and both databases read it from the index as they read any range.
#[cfg(any(feature = "mysql", feature = "postgres"))]
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// Where the page after the one that ended at `last` starts: the least key greater than `last`.
#[cfg(any(feature = "mysql", feature = "postgres"))]
fn after(last: &[u8]) -> Vec<u8> {
    let mut next = last.to_vec();
    next.push(0);
    next
}

/// Every key that starts with `prefix`, read [`LIST_PAGE`] keys at a time by `read_page(from,
/// end)`, which answers the keys from `from` up to (not including) `end` (`None`: to the last
/// key), in key order, at most a page of them; a page that comes back short is the last.
#[cfg(any(feature = "mysql", feature = "postgres"))]
pub(super) async fn list_by_pages<Page>(
    prefix: &[u8],
    mut read_page: impl FnMut(Vec<u8>, Option<Vec<u8>>) -> Page,
) -> Result<Vec<String>, LockError>
where
    Page: std::future::Future<Output = Result<Vec<Vec<u8>>, LockError>>,
{
    let end = prefix_end(prefix);
    let mut from = prefix.to_vec();
    let mut keys = Vec::new();
    loop {
        let page = read_page(from, end.clone()).await?;
        let full = page.len() == LIST_PAGE;
        from = page.last().map(|last| after(last)).unwrap_or_default();
        keys.extend(
            page.into_iter()
                .map(|key| String::from_utf8_lossy(&key).into_owned()),
        );
        if !full {
            return Ok(keys);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_owner;
    use crate::Owner;

    #[test]
    fn an_owner_reads_back_from_its_hex() {
        let owner = Owner::random();
        assert_eq!(parse_owner(&owner.to_string()), Some(owner));
        assert_eq!(parse_owner("stranger"), None);
    }

    #[cfg(any(feature = "mysql", feature = "postgres"))]
    #[test]
    fn a_prefix_is_the_range_up_to_its_successor() {
        use super::{after, prefix_end};
        assert_eq!(prefix_end(b"acct:"), Some(b"acct;".to_vec()));
        assert_eq!(prefix_end(b"a%\xff"), Some(b"a&".to_vec()));
        assert_eq!(prefix_end(b""), None);
        assert_eq!(prefix_end(b"\xff\xff"), None);
        assert_eq!(after(b"k"), b"k\0".to_vec());
    }
}
