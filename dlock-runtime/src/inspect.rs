//! What operators ask of a store: who holds a key, since when, for how long yet, and how many
//! wait for it ([`Locker::inspect`](crate::Locker::inspect)); which keys are held
//! ([`Locker::list`](crate::Locker::list)).
//!
//! On the stores that answer them (memory, Redis), every lease carries its holder's description,
//! written by the acquisition itself (in the same store command: it costs no round trip): the label of the acquisition, the host name and
//! process id of the process that holds it, the fence, and when the store granted it, by the
//! store's clock.

use std::time::{Duration, SystemTime};

use crate::{Mode, Owner};

/// One holder of a key, as the store describes it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// use dlock::{LockOptions, Locker};
///
/// let locker = Locker::memory();
/// let lease = locker.lock("report:2026-11", LockOptions::new()).await?;
/// let state = locker.inspect("report:2026-11").await?;
/// let holder = &state.holders()[0];
/// assert_eq!(holder.owner(), lease.owner());
/// assert_eq!(holder.fence(), lease.fence());
/// assert_eq!(holder.pid(), Some(std::process::id()));
/// println!(
///     "held by {} on {} (pid {:?}) since {:?}, {:?} left",
///     holder.label(),
///     holder.host().unwrap_or("?"),
///     holder.pid(),
///     holder.acquired_at(),
///     holder.time_left(),
/// );
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    label: String,
    host: Option<String>,
    pid: Option<u32>,
    owner: Owner,
    fence: u64,
    acquired_at: SystemTime,
    time_left: Option<Duration>,
    mode: Mode,
}

impl Holder {
    /// A holder of `owner`, granted with `fence` at `acquired_at` (by the store's clock), with no
    /// label, host, process id or time left known yet: set them with the `with_` methods. For a
    /// [`Backend`](crate::backend::Backend) of your own that answers
    /// [`inspect`](crate::backend::Backend::inspect).
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use dlock::{Holder, Owner};
    ///
    /// let owner = Owner::random();
    /// let holder = Holder::new(owner, 7, SystemTime::now())
    ///     .with_label("nightly-report")
    ///     .with_host("worker-3")
    ///     .with_pid(4242)
    ///     .with_time_left(Duration::from_secs(20));
    /// assert_eq!((holder.label(), holder.host(), holder.pid()), ("nightly-report", Some("worker-3"), Some(4242)));
    /// assert_eq!(holder.owner(), owner);
    /// ```
    pub fn new(owner: Owner, fence: u64, acquired_at: SystemTime) -> Self {
        Holder {
            label: String::new(),
            host: None,
            pid: None,
            owner,
            fence,
            acquired_at,
            time_left: None,
            mode: Mode::Write,
        }
    }

    /// The same holder, holding the key in `mode` (a writer unless set).
    ///
    /// ```
    /// # use dlock::{Holder, Mode, Owner};
    /// let holder = Holder::new(Owner::random(), 1, std::time::SystemTime::now()).with_mode(Mode::Read);
    /// assert_eq!(holder.mode(), Mode::Read);
    /// ```
    pub fn with_mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Whether the holder is one of the key's readers ([`Mode::Read`]), each of which is listed,
    /// or its one writer ([`Mode::Write`], every plain lock's holder).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::{LockOptions, Locker, Mode};
    ///
    /// let locker = Locker::memory();
    /// let read = LockOptions::new().mode(Mode::Read);
    /// let _readers = (locker.lock("catalog", read).await?, locker.lock("catalog", read).await?);
    /// let holders = locker.inspect("catalog").await?.holders().to_vec();
    /// assert_eq!(holders.len(), 2);
    /// assert!(holders.iter().all(|holder| holder.mode() == Mode::Read));
    /// # Ok(()) }
    /// ```
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The same holder, with the label of its acquisition.
    ///
    /// ```
    /// # use dlock::{Holder, Owner};
    /// let holder = Holder::new(Owner::random(), 1, std::time::SystemTime::now()).with_label("billing::charge");
    /// assert_eq!(holder.label(), "billing::charge");
    /// ```
    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = label.into();
        self
    }

    /// The same holder, on the host named `host`.
    ///
    /// ```
    /// # use dlock::{Holder, Owner};
    /// let holder = Holder::new(Owner::random(), 1, std::time::SystemTime::now()).with_host("worker-3");
    /// assert_eq!(holder.host(), Some("worker-3"));
    /// ```
    pub fn with_host(mut self, host: impl Into<String>) -> Self {
        self.host = Some(host.into());
        self
    }

    /// The same holder, in the process with id `pid`.
    ///
    /// ```
    /// # use dlock::{Holder, Owner};
    /// let holder = Holder::new(Owner::random(), 1, std::time::SystemTime::now()).with_pid(4242);
    /// assert_eq!(holder.pid(), Some(4242));
    /// ```
    pub fn with_pid(mut self, pid: u32) -> Self {
        self.pid = Some(pid);
        self
    }

    /// The same holder, whose lease ends `time_left` from now unless renewed.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use dlock::{Holder, Owner};
    /// let holder = Holder::new(Owner::random(), 1, std::time::SystemTime::now())
    ///     .with_time_left(Duration::from_secs(3));
    /// assert_eq!(holder.time_left(), Some(Duration::from_secs(3)));
    /// ```
    pub fn with_time_left(mut self, time_left: Duration) -> Self {
        self.time_left = Some(time_left);
        self
    }

    /// The label of the acquisition (what the code that took the lease calls it); empty where it
    /// gave none, or where the lease was granted by a version of dlock that stored no label.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// use std::time::Duration;
    /// use dlock::backend::{AcquireRequest, Backend, MemoryBackend};
    /// use dlock::{Locker, Owner};
    ///
    /// let store = MemoryBackend::new();
    /// let request = AcquireRequest::new("job:1", Owner::random(), Duration::from_secs(5), Duration::ZERO)
    ///     .label("nightly-report");
    /// store.acquire(&request).await?;
    /// let state = Locker::with_backend(store).inspect("job:1").await?;
    /// assert_eq!(state.holders()[0].label(), "nightly-report");
    /// # Ok(()) }
    /// ```
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The name of the host the holder runs on, where the store knows it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let locker = dlock::Locker::memory();
    /// let _lease = locker.lock("job:1", dlock::LockOptions::new()).await?;
    /// let state = locker.inspect("job:1").await?;
    /// assert!(state.holders()[0].host().is_some()); // this host's name
    /// # Ok(()) }
    /// ```
    pub fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }

    /// The id of the holder's process on its host, where the store knows it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let locker = dlock::Locker::memory();
    /// let _lease = locker.lock("job:1", dlock::LockOptions::new()).await?;
    /// let state = locker.inspect("job:1").await?;
    /// assert_eq!(state.holders()[0].pid(), Some(std::process::id()));
    /// # Ok(()) }
    /// ```
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// The owner token the lease is stored under ([`Lease::owner`](crate::Lease::owner)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let locker = dlock::Locker::memory();
    /// let lease = locker.lock("job:1", dlock::LockOptions::new()).await?;
    /// assert_eq!(locker.inspect("job:1").await?.holders()[0].owner(), lease.owner());
    /// # Ok(()) }
    /// ```
    pub fn owner(&self) -> Owner {
        self.owner
    }

    /// The lease's fencing token ([`Lease::fence`](crate::Lease::fence)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let locker = dlock::Locker::memory();
    /// let lease = locker.lock("job:1", dlock::LockOptions::new()).await?;
    /// assert_eq!(locker.inspect("job:1").await?.holders()[0].fence(), lease.fence());
    /// # Ok(()) }
    /// ```
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// When the store granted the lease, by the store's clock (a server's wall clock may differ
    /// from this host's). A lease handed to a waiter was granted when the release handed it on.
    /// For a lease granted by a version of dlock that stored no time (on Redis), the time its
    /// fence was counted, which Redis floors by its clock in microseconds.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// use std::time::{Duration, SystemTime};
    ///
    /// let locker = dlock::Locker::memory();
    /// let _lease = locker.lock("job:1", dlock::LockOptions::new()).await?;
    /// let held_for = locker.inspect("job:1").await?.holders()[0].acquired_at().elapsed().unwrap_or_default();
    /// assert!(held_for < Duration::from_secs(5));
    /// # Ok(()) }
    /// ```
    pub fn acquired_at(&self) -> SystemTime {
        self.acquired_at
    }

    /// How long the lease has left on the store unless it is renewed; `None` where the store
    /// keeps it with no expiry.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// use std::time::Duration;
    /// use dlock::LockOptions;
    ///
    /// let locker = dlock::Locker::memory();
    /// let _lease = locker.lock("job:1", LockOptions::new().ttl(Duration::from_secs(10))).await?;
    /// let left = locker.inspect("job:1").await?.holders()[0].time_left();
    /// assert!(left.is_some_and(|left| left <= Duration::from_secs(10)));
    /// # Ok(()) }
    /// ```
    pub fn time_left(&self) -> Option<Duration> {
        self.time_left
    }
}

/// What a store says of one key: its holders and how many wait for it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// let locker = dlock::Locker::memory();
/// let state = locker.inspect("job:1").await?;
/// assert_eq!(state.key(), "job:1");
/// assert!(state.holders().is_empty()); // nobody holds it
/// assert_eq!(state.waiters(), 0);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyState {
    key: String,
    holders: Vec<Holder>,
    waiters: usize,
}

impl KeyState {
    /// The state of `key`: held by `holders` (none where it is free), with `waiters` waiting.
    /// For a [`Backend`](crate::backend::Backend) of your own that answers
    /// [`inspect`](crate::backend::Backend::inspect).
    ///
    /// ```
    /// use dlock::KeyState;
    /// let free = KeyState::new("job:1", Vec::new(), 0);
    /// assert!(!free.is_held());
    /// ```
    pub fn new(key: impl Into<String>, holders: Vec<Holder>, waiters: usize) -> Self {
        KeyState {
            key: key.into(),
            holders,
            waiters,
        }
    }

    /// The rendered key.
    ///
    /// ```
    /// assert_eq!(dlock::KeyState::new("job:1", Vec::new(), 0).key(), "job:1");
    /// ```
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The key's holders: one for a held lock, none for a free one, and every reader of a key
    /// its readers hold ([`Mode::Read`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let locker = dlock::Locker::memory();
    /// let lease = locker.lock("job:1", dlock::LockOptions::new()).await?;
    /// assert_eq!(locker.inspect("job:1").await?.holders().len(), 1);
    /// lease.release().await?;
    /// assert!(locker.inspect("job:1").await?.holders().is_empty());
    /// # Ok(()) }
    /// ```
    pub fn holders(&self) -> &[Holder] {
        &self.holders
    }

    /// Whether anyone holds the key.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let locker = dlock::Locker::memory();
    /// let _lease = locker.lock("job:1", dlock::LockOptions::new()).await?;
    /// assert!(locker.inspect("job:1").await?.is_held());
    /// # Ok(()) }
    /// ```
    pub fn is_held(&self) -> bool {
        !self.holders.is_empty()
    }

    /// How many callers wait for the key (live waiters in its queue).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// use std::time::Duration;
    /// use dlock::{LockOptions, Locker};
    ///
    /// let locker = Locker::memory();
    /// let lease = locker.lock("job:1", LockOptions::new()).await?;
    /// let waiter = tokio::spawn({
    ///     let locker = locker.clone();
    ///     async move { locker.lock("job:1", LockOptions::new().wait(Duration::from_secs(5))).await }
    /// });
    /// while locker.inspect("job:1").await?.waiters() == 0 {
    ///     tokio::task::yield_now().await;
    /// }
    /// lease.release().await?;
    /// waiter.await.unwrap()?;
    /// # Ok(()) }
    /// ```
    pub fn waiters(&self) -> usize {
        self.waiters
    }
}

/// The most bytes of a label or host name a store keeps with a lease: enough to name any holder,
/// and a bound on what every grant, waiter poll and queue rewrite carries to the store (a label
/// comes from the caller, and may be as long as it likes); 255, so that it fits MySQL's
/// `VARCHAR(255)` whatever its characters, and a ZooKeeper queue's reads of a thousand nodes stay
/// far from the server's request limit.
pub(crate) const TEXT_BOUND: usize = 255;

/// `text` cut to at most [`TEXT_BOUND`] bytes, at a character boundary (a character that would
/// straddle the bound is left out whole): what every store keeps of a label or host name. The
/// one place the bound is applied, so that every store keeps the same cut of the same text.
#[cfg_attr(
    not(any(
        feature = "memory",
        feature = "redis",
        feature = "mysql",
        feature = "postgres",
        feature = "zookeeper",
        feature = "etcd"
    )),
    allow(dead_code)
)]
pub(crate) fn bounded(text: &str) -> &str {
    if text.len() <= TEXT_BOUND {
        return text;
    }
    let mut end = TEXT_BOUND;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The name of the host this process runs on, as stores record it with each lease: read once
/// per process (from `/proc/sys/kernel/hostname` or `/etc/hostname`, else the `HOSTNAME` or
/// `COMPUTERNAME` environment variable) and cut by [`bounded`]; empty where none of them says.
/// Read from files rather than asked of the C library, which would take `unsafe` code or
/// another dependency.
#[cfg(any(
    feature = "memory",
    feature = "redis",
    feature = "mysql",
    feature = "postgres",
    feature = "zookeeper",
    feature = "etcd"
))]
pub(crate) fn this_host() -> &'static str {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        let from_file = ["/proc/sys/kernel/hostname", "/etc/hostname"]
            .iter()
            .filter_map(|path| std::fs::read_to_string(path).ok());
        let from_env = ["HOSTNAME", "COMPUTERNAME"]
            .iter()
            .filter_map(|name| std::env::var(name).ok());
        from_file
            .chain(from_env)
            .map(|name| bounded(name.trim()).to_owned())
            .find(|name| !name.is_empty())
            .unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_cuts_long_text_at_a_character_boundary() {
        assert_eq!(bounded("short"), "short");
        let exact = "x".repeat(TEXT_BOUND);
        assert_eq!(bounded(&exact), exact);
        assert_eq!(bounded(&"x".repeat(10_000)), exact);
        // `é` is two bytes: the one that straddles the bound is left out whole.
        let straddling = format!("{}{}", "a".repeat(TEXT_BOUND - 1), "é".repeat(10));
        assert_eq!(bounded(&straddling), "a".repeat(TEXT_BOUND - 1));
        let fitting = format!("{}é", "a".repeat(TEXT_BOUND - 2));
        assert_eq!(bounded(&format!("{fitting}zzz")), fitting);
    }
}
