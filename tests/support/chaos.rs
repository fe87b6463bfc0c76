//! A seeded chaos layer: a [`Backend`] wrapper around a real store that delays replies, loses
//! replies after the store acted, duplicates calls, pauses renewals and stalls the caller's
//! runtime between a grant and the caller seeing it — each decision drawn from a seeded
//! generator, so a run is described by its seed.
//!
//! Beside the faults it keeps a [`LeaseBook`]: what the store confirmed and the caller was told,
//! per acquisition. From it a checker can tell, without trusting the runtime, the latest instant
//! at which a lease could still have been valid by the client's own reckoning.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock::backend::{AcquireRequest, Acquired, Backend, Renewal};
use dlock::{LockError, Owner};

/// SplitMix64: a tiny, good-enough generator whose whole state is one seed.
#[derive(Clone, Debug)]
pub struct SplitMix(u64);

impl SplitMix {
    /// The generator whose whole future is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high.saturating_sub(low) + 1)
    }

    /// True with probability `per_mille` / 1000.
    pub fn chance(&mut self, per_mille: u32) -> bool {
        self.below(1000) < u64::from(per_mille)
    }

    /// A duration in `low..=high` milliseconds.
    pub fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(self.between(low, high))
    }

    /// A generator of its own, independent of this one's later draws.
    pub fn fork(&mut self) -> SplitMix {
        SplitMix(self.next_u64())
    }

    /// One of `items`.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// How often each fault strikes (per mille of calls) and how hard.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    /// A reply reaches the caller late (an async delay after the store acted)…
    pub late_reply: u32,
    /// …by up to this long.
    pub late_reply_max: Duration,
    /// The store acted but the caller gets an error instead of its reply.
    pub lost_reply: u32,
    /// The call reaches the store twice, the second time at once: a renewal or a release as it
    /// was; an acquisition only once granted, and without waiting, as its owner's retry.
    pub duplicate: u32,
    /// The caller's thread is blocked between a grant and the caller seeing it: its runtime is
    /// stalled, as by a long garbage-collection pause or an overloaded machine…
    pub grant_stall: u32,
    /// …for up to this long.
    pub grant_stall_max: Duration,
    /// A renewal reaches the store late (an async delay before the store acts)…
    pub renew_pause: u32,
    /// …by at least this long…
    pub renew_pause_min: Duration,
    /// …and at most this long.
    pub renew_pause_max: Duration,
    /// A release on drop is queued on the background runtime instead of done at once (the store
    /// answers `false` to `release_now`).
    pub queued_release: u32,
}

/// One acquisition as the caller was told of it.
#[derive(Clone, Copy, Debug)]
pub struct BookedLease {
    /// The owner the lease was granted to.
    pub owner: Owner,
    /// The ttl asked for.
    pub ttl: Duration,
    /// When the grant was handed back to the caller: its hold (`hold_at_least`), counted from
    /// when the caller knows of the grant, ends no earlier than a hold after this.
    pub granted_at: Instant,
    /// No later than this the lease's client-side validity ends, unless a later renewal is
    /// confirmed: each confirmation counts at most a ttl from when its request left the caller,
    /// which was no later than it reached this layer.
    pub valid_at_most_until: Instant,
    /// When a refusal of a renewal reached the caller, after which the lease is lost.
    pub refused_at: Option<Instant>,
    /// The longest any call for this lease took to be answered (or given up on by its caller),
    /// from the acquisition that granted it on.
    pub slowest_answer: Duration,
    /// When the latest request for this lease (its acquisition, then each renewal) reached
    /// this layer, and the longest time between two of them.
    pub last_sent: Instant,
    pub longest_gap: Duration,
}

/// What the store confirmed and the caller was told, per key and fence.
#[derive(Default)]
pub struct LeaseBook {
    leases: Mutex<HashMap<(String, u64), BookedLease>>,
    fences: Mutex<HashMap<Owner, u64>>,
}

impl LeaseBook {
    fn granted(&self, key: &str, owner: Owner, ttl: Duration, acquired: &Acquired, took: Duration) {
        self.fences.lock().unwrap().insert(owner, acquired.fence);
        self.leases.lock().unwrap().insert(
            (key.to_owned(), acquired.fence),
            BookedLease {
                owner,
                ttl,
                granted_at: Instant::now(),
                valid_at_most_until: acquired.valid_from + ttl,
                refused_at: None,
                slowest_answer: took,
                last_sent: Instant::now() - took,
                longest_gap: Duration::ZERO,
            },
        );
    }

    fn renewed(&self, key: &str, owner: Owner, sent: Instant, held: bool) {
        let Some(fence) = self.fences.lock().unwrap().get(&owner).copied() else {
            return;
        };
        let now = Instant::now();
        if let Some(lease) = self
            .leases
            .lock()
            .unwrap()
            .get_mut(&(key.to_owned(), fence))
        {
            if held {
                lease.valid_at_most_until = lease.valid_at_most_until.max(sent + lease.ttl);
            } else if lease.refused_at.is_none() {
                lease.refused_at = Some(now);
            }
        }
    }

    /// Notes that a renewal of `owner`'s lease on `key` was answered, or given up on, `took`
    /// after it reached this layer.
    fn answered(&self, key: &str, owner: Owner, took: Duration) {
        let Some(fence) = self.fences.lock().unwrap().get(&owner).copied() else {
            return;
        };
        if let Some(lease) = self
            .leases
            .lock()
            .unwrap()
            .get_mut(&(key.to_owned(), fence))
        {
            lease.slowest_answer = lease.slowest_answer.max(took);
        }
    }

    /// Notes that a renewal of `owner`'s lease on `key` reached this layer at `sent`.
    fn sending(&self, key: &str, owner: Owner, sent: Instant) {
        let Some(fence) = self.fences.lock().unwrap().get(&owner).copied() else {
            return;
        };
        if let Some(lease) = self
            .leases
            .lock()
            .unwrap()
            .get_mut(&(key.to_owned(), fence))
        {
            lease.longest_gap = lease.longest_gap.max(sent - lease.last_sent);
            lease.last_sent = lease.last_sent.max(sent);
        }
    }

    /// Over every acquisition of `key`: the longest any call took to be answered, and the
    /// longest time without a request for the lease (up to `now`).
    pub fn timeliness(&self, key: &str, now: Instant) -> (Duration, Duration) {
        self.leases
            .lock()
            .unwrap()
            .iter()
            .filter(|((k, _), _)| k == key)
            .fold(
                (Duration::ZERO, Duration::ZERO),
                |(slowest, gap), (_, lease)| {
                    (
                        slowest.max(lease.slowest_answer),
                        gap.max(lease.longest_gap)
                            .max(now.saturating_duration_since(lease.last_sent)),
                    )
                },
            )
    }

    /// The acquisition of `key` with `fence`, if the caller was told of it.
    pub fn lease(&self, key: &str, fence: u64) -> Option<BookedLease> {
        self.leases
            .lock()
            .unwrap()
            .get(&(key.to_owned(), fence))
            .copied()
    }

    /// The store key of the permit of semaphore `key` granted with `fence` (`key`, U+001F,
    /// `permit:` and its number): `None` where no permit or more than one was granted with that
    /// fence (fences are counted per store key, so two permits may share one).
    pub fn permit_of(&self, key: &str, fence: u64) -> Option<String> {
        let prefix = format!("{key}\u{1f}permit:");
        let leases = self.leases.lock().unwrap();
        let mut found = leases
            .keys()
            .filter(|(k, f)| *f == fence && k.starts_with(&prefix))
            .map(|(k, _)| k.clone());
        let first = found.next()?;
        found.next().is_none().then_some(first)
    }

    /// From when on the lease of `key` with `fence` is invalid for sure, by what the caller was
    /// told: its validity run out, or a renewal refused.
    pub fn invalid_since(&self, key: &str, fence: u64) -> Option<Instant> {
        let lease = self.lease(key, fence)?;
        Some(
            lease
                .refused_at
                .map_or(lease.valid_at_most_until, |refused| {
                    refused.min(lease.valid_at_most_until)
                }),
        )
    }
}

/// Notes in the book, when a renewal call ends or is dropped, how long it took.
struct Timing<'a> {
    book: &'a LeaseBook,
    leases: &'a [Renewal<'a>],
    sent: Instant,
}

impl Drop for Timing<'_> {
    fn drop(&mut self) {
        let took = self.sent.elapsed();
        for lease in self.leases {
            self.book.answered(lease.key, lease.owner, took);
        }
    }
}

/// A backend whose calls suffer [`Faults`], drawn from a seeded generator.
#[derive(Clone)]
pub struct Chaos<B> {
    pub inner: B,
    pub faults: Faults,
    rng: Arc<Mutex<SplitMix>>,
    pub book: Arc<LeaseBook>,
}

impl<B> Chaos<B> {
    /// `inner` under `faults`, drawn from `rng`; what callers are told goes into `book`.
    pub fn new(inner: B, faults: Faults, rng: SplitMix, book: Arc<LeaseBook>) -> Self {
        Chaos {
            inner,
            faults,
            rng: Arc::new(Mutex::new(rng)),
            book,
        }
    }

    fn chance(&self, per_mille: u32) -> bool {
        per_mille > 0 && self.rng.lock().unwrap().chance(per_mille)
    }

    fn up_to(&self, max: Duration) -> Duration {
        let max = max.as_micros() as u64;
        Duration::from_micros(self.rng.lock().unwrap().between(0, max))
    }

    fn between(&self, min: Duration, max: Duration) -> Duration {
        min + self.up_to(max.saturating_sub(min))
    }

    async fn late_reply(&self) {
        if self.chance(self.faults.late_reply) {
            tokio::time::sleep(self.up_to(self.faults.late_reply_max)).await;
        }
    }

    fn lost_reply(&self, call: &str) -> Option<LockError> {
        self.chance(self.faults.lost_reply).then(|| {
            LockError::Backend(
                format!("chaos: the reply to {call} was lost after the store acted").into(),
            )
        })
    }
}

impl<B: Backend> Backend for Chaos<B> {
    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Option<Acquired>, LockError> {
        let sent = Instant::now();
        let granted = self.inner.acquire(request).await;
        if let Ok(Some(_)) = granted {
            if self.chance(self.faults.duplicate) {
                // The same owner asks again at once: the store must treat it as the same
                // holder (busy, or the same grant), never as a second one.
                let again =
                    AcquireRequest::new(request.key, request.owner, request.ttl, Duration::ZERO);
                let _ = self.inner.acquire(&again).await;
            }
            if self.chance(self.faults.grant_stall) {
                std::thread::sleep(self.up_to(self.faults.grant_stall_max));
            }
        }
        self.late_reply().await;
        if granted.is_ok() {
            if let Some(error) = self.lost_reply("acquire") {
                return Err(error);
            }
        }
        if let Ok(Some(acquired)) = &granted {
            self.book.granted(
                request.key,
                request.owner,
                request.ttl,
                acquired,
                sent.elapsed(),
            );
        }
        granted
    }

    async fn release(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
        let mut released = self.inner.release(key, owner).await;
        if self.chance(self.faults.duplicate) {
            let _ = self.inner.release(key, owner).await;
        }
        self.late_reply().await;
        if let Some(error) = self.lost_reply("release") {
            released = Err(error);
        }
        released
    }

    async fn undo_acquire(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
        let mut released = self.inner.undo_acquire(key, owner).await;
        if self.chance(self.faults.duplicate) {
            let _ = self.inner.undo_acquire(key, owner).await;
        }
        self.late_reply().await;
        if let Some(error) = self.lost_reply("undo_acquire") {
            released = Err(error);
        }
        released
    }

    async fn renew(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
        let sent = Instant::now();
        for lease in leases {
            self.book.sending(lease.key, lease.owner, sent);
        }
        let _timing = Timing {
            book: &self.book,
            leases,
            sent,
        };
        if self.chance(self.faults.renew_pause) {
            tokio::time::sleep(
                self.between(self.faults.renew_pause_min, self.faults.renew_pause_max),
            )
            .await;
        }
        let renewed = self.inner.renew(leases).await;
        if self.chance(self.faults.duplicate) {
            let _ = self.inner.renew(leases).await;
        }
        self.late_reply().await;
        if renewed.is_ok() {
            if let Some(error) = self.lost_reply("renew") {
                return Err(error);
            }
        }
        if let Ok(held) = &renewed {
            for (lease, held) in leases.iter().zip(held) {
                self.book.renewed(lease.key, lease.owner, sent, *held);
            }
        }
        renewed
    }

    fn expires_at_a_set_time(&self) -> bool {
        self.inner.expires_at_a_set_time()
    }

    fn shares_reads(&self) -> bool {
        self.inner.shares_reads()
    }

    /// A hold's end (`hold_at_least`), suffering the faults of a release.
    async fn expire_after(
        &self,
        key: &str,
        owner: Owner,
        after: Duration,
    ) -> Result<bool, LockError> {
        let mut set = self.inner.expire_after(key, owner, after).await;
        if self.chance(self.faults.duplicate) {
            let _ = self.inner.expire_after(key, owner, after).await;
        }
        self.late_reply().await;
        if let Some(error) = self.lost_reply("expire_after") {
            set = Err(error);
        }
        set
    }

    fn release_now(&self, key: &str, owner: Owner) -> bool {
        if self.chance(self.faults.queued_release) {
            return false;
        }
        self.inner.release_now(key, owner)
    }
}
