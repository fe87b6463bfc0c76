//! A semaphore on a key ([`LockOptions::permits`] above 1), built from the mutex every store
//! already keeps, so that it is as safe as the mutex on each store without a line of its own
//! there.
//!
//! A key of N permits is held as N *permit* keys, each a mutex: at most N holders at once, each
//! with a lease of its own (owner, fence, renewal, expiry at its ttl when its holder dies). The
//! order of waiters comes from one more mutex, the *turnstile*: a caller that waits takes the
//! turnstile first (waiting in the store's queue for it, first come, first served across
//! processes where the store serves a mutex's waiters so), and then, holding it, tries each
//! permit once; if all are taken, it waits for all of them at once and keeps the first granted.
//! Only the turnstile's holder starts waiting for the permits, so a permit let go goes to the
//! caller who came first, and the next in line gets the turnstile when that one has its permit,
//! or a few seconds after it took it (the turnstile is held unrenewed, for the caller's ttl and
//! [`TURNSTILE_TTL`] at most, so that a waiter no longer polled cannot hold the line up): a head
//! that waits longer shares the permits' own queues with the next, which joins them after it
//! (each waiter then holds a place in every permit's queue).
//!
//! The store's keys are the semaphore's key, the control character U+001F and a name:
//! `permit:0` … `permit:N-1`, and `turnstile`. A key rendered by `#[distributed_lock]` holds no
//! control character outside its template's literal text, so none of these is a user's key by
//! accident. Each store takes the character: Redis and the SQL stores compare keys byte for
//! byte, and ZooKeeper's node names percent-encode it.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::task::Poll;
use std::time::{Duration, Instant};

use super::{check_key_length, key_start, Locker, Part};
use crate::lease::LeaseState;
use crate::{metrics, LockError, LockOptions, Owner};

/// Parts the semaphore's key from the name of one of its store keys.
const SEPARATOR: char = '\u{1f}';
/// The name of the turnstile's key.
const TURNSTILE: &str = "turnstile";
/// The start of the name of a permit's key, followed by its number.
const PERMIT: &str = "permit:";
/// How long a caller heads the line of waiters at most (less where its ttl is shorter: see
/// `acquire_permit`).
const TURNSTILE_TTL: Duration = Duration::from_secs(3);

fn turnstile_key(key: &str) -> String {
    format!("{key}{SEPARATOR}{TURNSTILE}")
}

fn permit_key(key: &str, permit: u32) -> String {
    format!("{key}{SEPARATOR}{PERMIT}{permit}")
}

/// The number of the permit a store key of a semaphore's names (its part after the key the
/// caller gave), where it names one.
pub(crate) fn permit_number(suffix: &str) -> Option<u32> {
    suffix
        .strip_prefix(SEPARATOR)?
        .strip_prefix(PERMIT)?
        .parse()
        .ok()
}

/// How many bytes the longest store key of a semaphore of `permits` adds to its key.
fn extra_bytes(permits: u32) -> usize {
    let digits = permits.saturating_sub(1).checked_ilog10().unwrap_or(0) as usize + 1;
    SEPARATOR.len_utf8() + TURNSTILE.len().max(PERMIT.len() + digits)
}

/// The longest of a semaphore's store keys: the one whose length decides whether a store takes
/// them all.
fn longest_key(key: &str, permits: u32) -> String {
    let (turnstile, last) = (turnstile_key(key), permit_key(key, permits - 1));
    if turnstile.len() >= last.len() {
        turnstile
    } else {
        last
    }
}

/// Where a caller starts trying the permits: a different one each time (from a random start in
/// each process), so that callers do not all queue on the first one's store key.
fn first_try(permits: u32) -> u32 {
    static NEXT: LazyLock<AtomicUsize> =
        LazyLock::new(|| AtomicUsize::new(Owner::random().as_u128() as usize));
    (NEXT.fetch_add(1, Ordering::Relaxed) % permits as usize) as u32
}

/// A lease taken on the way to a permit, released (in the background) when dropped unless kept:
/// a failure, a time-out or a dropped future gives back whatever was taken.
struct Taken<'a> {
    locker: &'a Locker,
    state: Option<Arc<LeaseState>>,
}

impl<'a> Taken<'a> {
    fn new(locker: &'a Locker, state: Arc<LeaseState>) -> Self {
        Taken {
            locker,
            state: Some(state),
        }
    }

    fn keep(mut self) -> Arc<LeaseState> {
        self.state.take().expect("kept once")
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        if let Some(state) = self.state.take() {
            self.locker.release_in_background(&state);
        }
    }
}

impl Locker {
    /// Acquires one of `options.permits` permits of `key` (more than one), waiting up to
    /// `options.wait` for one, in line with the other waiters.
    pub(super) async fn acquire_permit(
        &self,
        key: String,
        options: LockOptions,
    ) -> Result<Arc<LeaseState>, LockError> {
        let options = options.checked()?;
        let permits = options.permits;
        let as_semaphore = |error| for_semaphore(error, &key, permits);
        check_key_length(&longest_key(&key, permits)).map_err(as_semaphore)?;
        let started = metrics::started();
        let deadline = Instant::now() + options.wait;
        let busy = || {
            tracing::debug!(%key, permits, waited = ?started.map(|at| at.elapsed()), "distributed_lock: every permit busy");
            metrics::busy(options.label, self.inner.store, started);
            LockError::Busy { key: key.clone() }
        };
        let one = LockOptions {
            permits: 1,
            ..options
        };

        // A caller that does not wait takes a free permit or none: it has no place in a line
        // to keep.
        let turnstile = if options.wait.is_zero() {
            None
        } else {
            // Unrenewed and short: the line's head keeps it only while it waits, and a head that
            // stops waiting without letting it go (its future parked in a `select!`, its runtime
            // stalled, its process dead) holds up the line for this long at most, not for as
            // long as its future lives. A head that waits longer shares the permits' own queues
            // with the next, which joins them after it: the order holds where theirs does.
            let turnstile = LockOptions {
                ttl: options.ttl.min(TURNSTILE_TTL),
                renew: false,
                hold_at_least: Duration::ZERO,
                ..one
            };
            match self
                .acquire_key(turnstile_key(&key), turnstile, Part::Quiet)
                .await
            {
                Ok(state) => Some(Taken::new(self, state)),
                Err(LockError::Busy { .. }) => return Err(busy()),
                Err(error) => return Err(as_semaphore(error)),
            }
        };

        let part = Part::Permit {
            shown_len: key.len(),
            started,
        };
        let mut permit = None;
        let first = first_try(permits);
        for offset in 0..permits {
            let number = ((u64::from(first) + u64::from(offset)) % u64::from(permits)) as u32;
            let once = LockOptions {
                wait: Duration::ZERO,
                ..one
            };
            match self.acquire_key(permit_key(&key, number), once, part).await {
                Ok(state) => {
                    permit = Some(Taken::new(self, state));
                    break;
                }
                Err(LockError::Busy { .. }) => {}
                Err(error) => return Err(as_semaphore(error)),
            }
        }

        let permit = match permit {
            Some(permit) => permit,
            None => {
                let wait = deadline.saturating_duration_since(Instant::now());
                if turnstile.is_none() || wait.is_zero() {
                    return Err(busy());
                }
                let waiting = LockOptions { wait, ..one };
                match self.first_granted(&key, permits, waiting, part).await {
                    Some(Ok(state)) => Taken::new(self, state),
                    None => return Err(busy()),
                    Some(Err(error)) => return Err(as_semaphore(error)),
                }
            }
        };

        // Let go in the background, which frees it as soon for the next in line: awaiting the
        // release here would keep a granted permit from its caller (past its validity, for a
        // short unrenewed ttl), and a caller that stopped waiting meanwhile would give it back.
        drop(turnstile);
        let state = permit.keep();
        tracing::debug!(%key, permits, fence = state.fence, "distributed_lock: permit acquired");
        Ok(state)
    }

    /// Waits for every permit of `key` at once, as `options` say, and answers the first one
    /// granted: `None` when each stayed busy for the wait, or the first error. The waits still
    /// under way then are dropped, each leaving the store's queue; one granted in the same
    /// instant is given back by its drop (an idle permit for a moment, never a second holder).
    async fn first_granted(
        &self,
        key: &str,
        permits: u32,
        options: LockOptions,
        part: Part,
    ) -> Option<Result<Arc<LeaseState>, LockError>> {
        let mut waits: Vec<_> = (0..permits)
            .map(|number| Box::pin(self.acquire_key(permit_key(key, number), options, part)))
            .collect();
        std::future::poll_fn(|cx| {
            let mut at = 0;
            while at < waits.len() {
                match waits[at].as_mut().poll(cx) {
                    Poll::Pending => at += 1,
                    Poll::Ready(Err(LockError::Busy { .. })) => {
                        // Done with: never polled again.
                        drop(waits.swap_remove(at));
                    }
                    Poll::Ready(answer) => return Poll::Ready(Some(answer)),
                }
            }
            if waits.is_empty() {
                Poll::Ready(None)
            } else {
                Poll::Pending
            }
        })
        .await
    }
}

/// `error`, from one of the store keys of the semaphore of `permits` on `key`, as its caller
/// asked: naming the semaphore's key, and saying how much longer the store keys are where that
/// is why the key was refused.
fn for_semaphore(error: LockError, key: &str, permits: u32) -> LockError {
    match error {
        LockError::Busy { .. } => LockError::Busy {
            key: key.to_owned(),
        },
        LockError::Lost { .. } => LockError::Lost {
            key: key.to_owned(),
        },
        LockError::InvalidKey { key: named, reason } => LockError::InvalidKey {
            // Named by its start where the store named its own key so (a runaway key), else
            // whole.
            key: if named.ends_with('…') {
                key_start(key)
            } else {
                key.to_owned()
            },
            reason: format!(
                "with {permits} permits the store holds it under keys up to {} bytes longer \
                 (the key, U+001F and the name of a permit or of the waiters' turnstile), and \
                 the longest of them is refused: {reason}",
                extra_bytes(permits)
            ),
        },
        other => other,
    }
}

#[cfg(all(test, feature = "memory"))]
mod tests {
    use super::*;

    #[test]
    fn the_longest_store_key_is_counted_in_the_extra_bytes() {
        for permits in [2, 9, 10, 11, 100, 101, 1000, u32::MAX] {
            assert_eq!(
                longest_key("k", permits).len(),
                1 + extra_bytes(permits),
                "{permits}"
            );
        }
        assert_eq!(permit_key("a", 3), "a\u{1f}permit:3");
        assert_eq!(turnstile_key("a"), "a\u{1f}turnstile");
    }

    #[tokio::test]
    async fn a_key_too_long_with_its_permits_says_by_how_much() {
        let locker = Locker::memory();
        let key = "k".repeat(Locker::MAX_KEY_BYTES - 3);
        // Fits as a mutex …
        drop(locker.lock(key.clone(), LockOptions::new()).await.unwrap());
        // … not as a semaphore, whose store keys are longer.
        let refused = locker
            .lock(key.clone(), LockOptions::new().permits(3))
            .await;
        match refused {
            Err(LockError::InvalidKey { key: named, reason }) => {
                assert!(named.starts_with("kkk") && named.len() < 100, "{named}");
                assert!(
                    reason.contains(
                        "with 3 permits the store holds it under keys up to 10 bytes longer"
                    ),
                    "{reason}"
                );
                assert!(reason.contains("at most 1048576 bytes"), "{reason}");
            }
            other => panic!("expected InvalidKey, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn one_permit_is_the_mutex() {
        let locker = Locker::memory();
        let lease = locker
            .lock("one", LockOptions::new().permits(1))
            .await
            .unwrap();
        // Held under the key itself, as any mutex.
        assert_eq!(locker.list("").await.unwrap(), ["one"]);
        assert!(matches!(
            locker.lock("one", LockOptions::new()).await,
            Err(LockError::Busy { .. })
        ));
        lease.release().await.unwrap();
    }
}
