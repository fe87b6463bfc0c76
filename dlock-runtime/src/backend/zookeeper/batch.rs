//! Splitting operations on many lock nodes (a renewal's version checks, a queue's reads of
//! node ages) into `multi` and `multiRead` requests the server accepts.
//!
//! A server answers a request larger than its `jute.maxbuffer` (1 MiB less one byte by
//! default) by dropping the connection: every request in flight on the session fails with it,
//! other keys' acquisitions and renewals among them, and a renewal sent again is refused again.
//! A count of operations alone does not keep a request under that: a path may be up to
//! [`MAX_PATH_BYTES`] long, so two long keys, or a thousand keys of a kilobyte, already pass
//! it. So a request is closed when it holds [`MAX_OPS`] operations or [`MAX_BYTES`] of them,
//! whichever comes first; the requests are pipelined, so more of them cost no more round trips.

use super::paths::MAX_PATH_BYTES;

/// The most operations one request carries.
pub(super) const MAX_OPS: usize = 1_000;

/// The most bytes of operations one request carries: half of what a server accepts by
/// default, which leaves room for the request's own framing and for a server configured
/// somewhat below the default.
pub(super) const MAX_BYTES: usize = 512 * 1024;

/// What one operation adds to a request besides its path, rounded up: its header (type, done
/// flag and error code, 9 bytes), the path's length (4) and the operation's own field (a
/// version, 4, or a watch flag, 1).
const OP_OVERHEAD: usize = 32;

/// What a request adds besides its operations, rounded up: its length (4), its header (id and
/// type, 8) and the closing operation header (9).
const REQUEST_OVERHEAD: usize = 64;

/// The largest request a server accepts by default: `jute.maxbuffer`, 1 MiB less one byte.
const SERVER_DEFAULT_LIMIT: usize = 0xf_ffff;

// A lone operation on the longest path dlock creates is a request the server accepts: such an
// operation goes alone when it passes `MAX_BYTES`.
const _: () = assert!(MAX_PATH_BYTES + OP_OVERHEAD + REQUEST_OVERHEAD < SERVER_DEFAULT_LIMIT);

/// `items` cut, in order, into runs of at most [`MAX_OPS`] items whose operations take at most
/// [`MAX_BYTES`], where `path_len` gives the length of an item's path. An item whose operation
/// alone passes `MAX_BYTES` is a run of its own.
pub(super) fn batches<T>(items: &[T], path_len: impl Fn(&T) -> usize) -> Vec<&[T]> {
    let mut runs = Vec::new();
    let (mut start, mut bytes) = (0, 0_usize);
    for (i, item) in items.iter().enumerate() {
        let size = path_len(item).saturating_add(OP_OVERHEAD);
        if i > start && (i - start == MAX_OPS || bytes.saturating_add(size) > MAX_BYTES) {
            runs.push(&items[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes = bytes.saturating_add(size);
    }
    if start < items.len() {
        runs.push(&items[start..]);
    }
    runs
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{batches, MAX_BYTES, MAX_OPS, OP_OVERHEAD};

    fn lens(runs: &[&[usize]]) -> Vec<usize> {
        runs.iter().map(|run| run.len()).collect()
    }

    #[test]
    fn short_paths_go_a_thousand_to_a_request() {
        let paths = vec![80; 2_500];
        assert_eq!(lens(&batches(&paths, |&len| len)), vec![1_000, 1_000, 500]);
        assert!(batches(&[] as &[usize], |&len| len).is_empty());
    }

    /// A thousand paths of a kilobyte pass the server's limit together: they go in more than one
    /// request.
    #[test]
    fn a_thousand_paths_of_a_kilobyte_go_in_more_than_one_request() {
        let paths = vec![1_100; 1_000];
        let runs = batches(&paths, |&len| len);
        assert_eq!(runs.len(), 3, "{:?}", lens(&runs));
        assert_eq!(lens(&runs).iter().sum::<usize>(), 1_000);
    }

    /// Two paths of 600,000 bytes go one to a request, and so does a short one after them; a
    /// path too long for the byte budget alone still goes, by itself.
    #[test]
    fn long_paths_go_one_to_a_request() {
        let paths = [600_000, 600_000, 50, 1_000_000, 40, 40];
        assert_eq!(lens(&batches(&paths, |&len| len)), vec![1, 1, 1, 1, 2]);
    }

    proptest! {
        /// Every item goes in exactly one run, in order; no run passes either limit unless it is
        /// one item alone; and no run could have taken the next run's first item.
        #[test]
        fn runs_keep_order_and_limits(paths in prop::collection::vec(
            prop_oneof![0usize..200, 100_000usize..700_000], 0..1_500,
        )) {
            let runs = batches(&paths, |&len| len);
            let joined: Vec<usize> = runs.iter().flat_map(|run| run.iter().copied()).collect();
            prop_assert_eq!(&joined, &paths);
            let bytes = |run: &[usize]| run.iter().map(|len| len + OP_OVERHEAD).sum::<usize>();
            for run in &runs {
                prop_assert!(!run.is_empty());
                prop_assert!(run.len() == 1 || (run.len() <= MAX_OPS && bytes(run) <= MAX_BYTES));
            }
            for pair in runs.windows(2) {
                let (run, next) = (pair[0], pair[1]);
                prop_assert!(run.len() == MAX_OPS || bytes(run) + next[0] + OP_OVERHEAD > MAX_BYTES);
            }
        }
    }
}
