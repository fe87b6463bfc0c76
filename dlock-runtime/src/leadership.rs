//! Leader election on a key: [`Locker::campaign`] waits to be elected and returns a
//! [`Leadership`], a lease kept by the watchdog for as long as the leader lives;
//! [`Locker::leader`] reads who leads without campaigning.
//!
//! A leadership is a held lease and nothing more: one leader at a time is the lock's own
//! exclusion, a new leader's fence is greater than every earlier leader's, and a leader that
//! cannot renew (cut off, stalled, its process paused) is told it lost before the store lets
//! anyone else be elected. What is added is the shape of the job: no wait limit by default,
//! renewal required, and [`Leadership::run`], which stops the leader's work at the loss.

use std::future::Future;
use std::time::Instant;

use crate::locked::until_lost;
use crate::locker::{Lease, Locker};
use crate::{Holder, LockError, LockOptions};

/// The leadership of a key, from [`Locker::campaign`]: held, renewed by the watchdog, until it
/// is lost, [resigned](Self::resign) or dropped (which resigns in the background).
///
/// The leader's work must stop when the leadership is lost, or two leaders work at once: run
/// it under [`run`](Self::run), which drops it at the loss, or race it against
/// [`lost`](Self::lost). Pass [`fence`](Self::fence) with the leader's writes, so that a store
/// can refuse those of a leader that was paused past its loss.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// use std::time::Duration;
/// use dlock::{LockOptions, Locker};
///
/// let locker = Locker::memory();
/// let leadership = locker.campaign("scheduler", LockOptions::new().label("billing-scheduler")).await?;
/// let ticks = leadership
///     .run(async {
///         // … the loop only the leader runs; here, three ticks …
///         for _ in 0..3 {
///             tokio::time::sleep(Duration::from_millis(1)).await;
///         }
///         3
///     })
///     .await?;
/// assert_eq!(ticks, 3);
/// leadership.resign().await?;
/// # Ok(()) }
/// ```
#[must_use = "a leadership is resigned as soon as it is dropped"]
#[derive(Debug)]
pub struct Leadership {
    lease: Lease,
}

impl Leadership {
    /// The key led.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// # let locker = dlock::Locker::memory();
    /// let leadership = locker.campaign("scheduler", dlock::LockOptions::new()).await?;
    /// assert_eq!(leadership.key(), "scheduler");
    /// # Ok(()) }
    /// ```
    pub fn key(&self) -> &str {
        self.lease.key()
    }

    /// The fencing token of this term: greater than every earlier leader's. Pass it with the
    /// leader's writes, and let the store refuse a write whose fence is lower than one it has
    /// seen: a leader paused past its loss then writes nothing over its successor's work.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// # let locker = dlock::Locker::memory();
    /// use dlock::LockOptions;
    ///
    /// let first = locker.campaign("scheduler", LockOptions::new()).await?;
    /// let first_term = first.fence();
    /// first.resign().await?;
    /// let next = locker.campaign("scheduler", LockOptions::new()).await?;
    /// assert!(next.fence() > first_term);
    /// # Ok(()) }
    /// ```
    pub fn fence(&self) -> u64 {
        self.lease.fence()
    }

    /// Whether this process still leads, by its own reckoning: false from the moment a renewal
    /// was refused or could not be confirmed in time, and for ever after.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// # let locker = dlock::Locker::memory();
    /// let leadership = locker.campaign("scheduler", dlock::LockOptions::new()).await?;
    /// assert!(leadership.is_leader());
    /// # Ok(()) }
    /// ```
    pub fn is_leader(&self) -> bool {
        self.lease.is_held()
    }

    /// Resolves when the leadership is lost (or resigned): race the leader's work against it
    /// to stop at a point of the work's own choosing, where [`run`](Self::run) would drop it at
    /// any await.
    ///
    /// # Cancel safety
    ///
    /// Dropping it does nothing to the leadership; a new call resolves at once for one lost
    /// already.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// # let locker = dlock::Locker::memory();
    /// # async fn run_one_batch() {}
    /// let leadership = locker.campaign("scheduler", dlock::LockOptions::new()).await?;
    /// for _ in 0..3 {
    ///     tokio::select! {
    ///         biased;
    ///         () = leadership.lost() => break,
    ///         () = run_one_batch() => {}
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> impl Future<Output = ()> + Send + '_ {
        self.lease.lost()
    }

    /// Runs `work` for as long as this process leads: it is polled only while the leadership
    /// is held, and dropped at its next await once it is lost, even when the loss is noticed
    /// late (a process paused past its ttl does not resume the work when it wakes).
    ///
    /// # Errors
    ///
    /// [`LockError::Lost`] when the leadership was lost before `work` finished (or before it
    /// started).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// # let locker = dlock::Locker::memory();
    /// # async fn sweep_expired_sessions() -> usize { 0 }
    /// let leadership = locker.campaign("session-sweeper", dlock::LockOptions::new()).await?;
    /// match leadership.run(sweep_expired_sessions()).await {
    ///     Ok(swept) => println!("swept {swept} sessions"),
    ///     Err(dlock::LockError::Lost { .. }) => println!("another instance leads now"),
    ///     Err(other) => return Err(other),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, LockError> {
        until_lost(work, &self.lease.state)
            .await
            .ok_or_else(|| LockError::Lost {
                key: self.key().to_owned(),
            })
    }

    /// Steps down: releases the key, so the next candidate is elected at once, and waits for
    /// the store to confirm. Resigning a leadership that was lost is not an error.
    ///
    /// # Errors
    ///
    /// [`LockError::Backend`] when the store did not confirm: the key is then held until its
    /// ttl runs out, unrenewed, before another candidate is elected.
    ///
    /// # Cancel safety
    ///
    /// Dropped before the store answered, the resignation goes on in the background.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// # let locker = dlock::Locker::memory();
    /// let leadership = locker.campaign("scheduler", dlock::LockOptions::new()).await?;
    /// leadership.resign().await?;
    /// assert!(locker.leader("scheduler").await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn resign(self) -> Result<(), LockError> {
        self.lease.release().await
    }
}

impl Locker {
    /// Campaigns for the leadership of `key`: waits until this caller is elected (holds the
    /// key), then returns the [`Leadership`], which the watchdog renews until it is lost or
    /// resigned. Candidates are elected in the order they arrived, where the store keeps one.
    ///
    /// `options` are those of a lock: `ttl` is how long the key outlives a leader that dies
    /// without resigning (the failover time), and `label` names the leader to
    /// [`leader`](Self::leader) and operators. `wait` bounds the campaign; the default, zero,
    /// which for a lock means "try once", here means no bound, as a campaign is for waiting.
    /// (To try once, give [`lock`](Self::lock)'s options a zero wait and lead with the lease.)
    /// An election that reaches this caller too late to lead (its runtime stalled while the
    /// grant was on its way, past the lease's validity) is given up, and the campaign goes on:
    /// the leadership returned is always a live one.
    ///
    /// # Errors
    ///
    /// [`LockError::Busy`] when a `wait` was given and ran out;
    /// [`LockError::InvalidOptions`] for `renew(false)`, which would end every term at its ttl
    /// however alive the leader, and for [`permits`](LockOptions::permits) above 1, which
    /// would elect several leaders at once, as would [`Mode::Read`](crate::Mode::Read); the errors of [`lock`](Self::lock) otherwise.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the candidates' queue: no key stays held for a campaign
    /// abandoned, elected or not.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// use std::time::Duration;
    /// use dlock::{LockError, LockOptions, Locker};
    ///
    /// let locker = Locker::memory();
    /// let options = LockOptions::new().ttl(Duration::from_secs(5)).label("outbox-relay");
    /// let leader = locker.campaign("outbox-relay", options).await?;
    ///
    /// // A second candidate waits for as long as the first leads; bounded here to show it.
    /// let bounded = options.wait(Duration::from_millis(20));
    /// assert!(matches!(locker.campaign("outbox-relay", bounded).await, Err(LockError::Busy { .. })));
    /// assert_eq!(locker.leader("outbox-relay").await?.unwrap().label(), "outbox-relay");
    /// leader.resign().await?;
    /// # Ok(()) }
    /// ```
    pub async fn campaign(
        &self,
        key: impl Into<String>,
        options: LockOptions,
    ) -> Result<Leadership, LockError> {
        if !options.renew {
            return Err(LockError::InvalidOptions {
                reason: "a leadership is kept by renewal: without it every term would end at \
                         its ttl; remove renew(false)"
                    .into(),
            });
        }
        if options.permits > 1 {
            return Err(LockError::InvalidOptions {
                reason: format!(
                    "a leadership has one leader: remove permits({})",
                    options.permits
                ),
            });
        }
        if options.mode == crate::Mode::Read {
            return Err(LockError::InvalidOptions {
                reason: "a leadership has one leader, and readers share their key: remove \
                         mode(Mode::Read)"
                    .into(),
            });
        }
        if !options.hold_at_least.is_zero() {
            // The hold would keep the key after a resignation, so that nobody leads until it
            // ends, where a resignation is meant to let the next candidate in at once.
            return Err(LockError::InvalidOptions {
                reason: "a leadership ends at once when it is resigned: remove hold_at_least"
                    .into(),
            });
        }
        let mut options = if options.wait.is_zero() {
            options.wait(LockOptions::MAX_WAIT)
        } else {
            options
        };
        let key = key.into();
        let gives_up_at = Instant::now().checked_add(options.wait);
        loop {
            let lease = self.lock(key.clone(), options).await?;
            if lease.is_held() {
                return Ok(Leadership { lease });
            }
            // Elected too late to lead: the grant reached this caller (its runtime stalled, say)
            // after the lease's validity. That term is given up (dropped, the lease is
            // released), and the campaign goes on for what is left of its wait.
            drop(lease);
            let left = gives_up_at.map_or(options.wait, |at| {
                at.saturating_duration_since(Instant::now())
            });
            if left.is_zero() {
                return Err(LockError::Busy { key });
            }
            options = options.wait(left);
        }
    }

    /// Who leads `key` now, without campaigning: its holder's label, host, pid and fence as
    /// the store has them, or `None` when nobody leads. A read of the moment: the leader may
    /// change before the answer is used.
    ///
    /// # Errors
    ///
    /// Those of [`inspect`](Self::inspect).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::{LockOptions, Locker};
    ///
    /// let locker = Locker::memory();
    /// assert!(locker.leader("scheduler").await?.is_none());
    /// let leadership = locker.campaign("scheduler", LockOptions::new().label("scheduler-a")).await?;
    /// let leader = locker.leader("scheduler").await?.expect("elected");
    /// assert_eq!((leader.label(), leader.fence()), ("scheduler-a", leadership.fence()));
    /// # Ok(()) }
    /// ```
    pub async fn leader(&self, key: &str) -> Result<Option<Holder>, LockError> {
        let state = self.inspect(key).await?;
        Ok(state.holders().first().cloned())
    }
}
