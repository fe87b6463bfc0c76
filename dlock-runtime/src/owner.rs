//! Owner tokens: 128 random bits per outermost acquisition.

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};

/// Identifies one acquisition of a key. Release and renewal take effect on the server only where
/// the stored owner equals this one, so a holder that lost its lease can never release or extend
/// the lease of whoever took the key next.
///
/// Displayed as 32 lowercase hex digits, which is how stores keep it.
///
/// A token names one acquisition, and its lease: driving a
/// [`Backend`](crate::backend::Backend) directly, draw a fresh one for each
/// [`acquire`](crate::backend::Backend::acquire) call, and never use it again for another
/// acquisition once that one ended (released, lost, or given up). A store takes a grant to the
/// owner that already holds the row for the same acquisition's (a statement sent again after a
/// broken connection, or a try after a grant of its was withdrawn unclaimed) and keeps its
/// fence, and what it does to undo a grant nobody claimed goes by that owner; a second
/// acquisition under the same token could be granted a key such an undo, still on its way,
/// then takes away, or share a fence with an earlier lease.
///
/// ```
/// let a = dlock::Owner::random();
/// let b = dlock::Owner::random();
/// assert_ne!(a, b);
/// assert_eq!(a.to_string().len(), 32);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Owner(u128);

impl Owner {
    /// A fresh token: 128 bits drawn from the operating system's generator for each call.
    ///
    /// Drawn afresh rather than derived from per-process state, because a process that forks
    /// would hand the same state to its child: parent and child would then draw the same
    /// tokens, and a store could not tell their leases apart.
    ///
    /// Locking draws one by itself; call it to drive a [`Backend`](crate::backend::Backend)
    /// directly, in a test of a backend of your own, say.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dlock::{backend::AcquireRequest, Owner};
    ///
    /// let owner = Owner::random();
    /// let request = AcquireRequest::new("acct:42", owner, Duration::from_secs(5), Duration::ZERO);
    /// assert_eq!(request.owner, owner);
    /// ```
    pub fn random() -> Owner {
        let mut bytes = [0u8; 16];
        if getrandom::fill(&mut bytes).is_err() {
            // The generator is unavailable (a sandbox without it): mix what tells this call
            // apart, in this process and from every other, under std's own random keys.
            return Owner::fallback();
        }
        Owner(u128::from_le_bytes(bytes))
    }

    #[cold]
    fn fallback() -> Owner {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let state = RandomState::new();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let time = std::time::SystemTime::now();
        let high = state.hash_one((std::process::id(), n, time));
        let low = state.hash_one((time, n, std::thread::current().id()));
        Owner((u128::from(high) << 64) | u128::from(low))
    }

    /// The token as a number.
    ///
    /// ```
    /// let owner = dlock::Owner::random();
    /// assert_eq!(format!("{:032x}", owner.as_u128()), owner.to_string());
    /// ```
    pub fn as_u128(self) -> u128 {
        self.0
    }

    /// The token whose number is `n`, as a store read it back.
    #[cfg(feature = "redis")]
    pub(crate) fn from_u128(n: u128) -> Owner {
        Owner(n)
    }

    /// The token as 32 lowercase hex digits, how stores keep it. Written out by hand: stores
    /// name the owner in every call, and `format!` costs several times as much.
    pub(crate) fn hex(self) -> [u8; 32] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut digits = [0; 32];
        for (i, digit) in digits.iter_mut().enumerate() {
            *digit = DIGITS[(self.0 >> (124 - 4 * i)) as usize & 0xf];
        }
        digits
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(std::str::from_utf8(&self.hex()).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Owner({self})")
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::Owner;

    #[test]
    fn tokens_read_as_32_hex_digits() {
        let owner = Owner(0x0123_4567_89ab_cdef_fedc_ba98_7654_3210);
        assert_eq!(owner.to_string(), "0123456789abcdeffedcba9876543210");
        assert_eq!(Owner(1).to_string(), format!("{:032x}", 1));
        assert_eq!(Owner(u128::MAX).to_string(), "f".repeat(32));
        let random = Owner::random();
        assert_eq!(random.to_string(), format!("{:032x}", random.as_u128()));
    }

    #[test]
    fn tokens_do_not_repeat() {
        let tokens: HashSet<Owner> = (0..100_000).map(|_| Owner::random()).collect();
        assert_eq!(tokens.len(), 100_000);
    }
}
