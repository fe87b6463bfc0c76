//! The one etcd lease of a backend, and the one keep-alive stream that keeps it.
//!
//! Every node the backend creates (holders' and waiters') is attached to this lease, so etcd
//! deletes them all when it expires: a crashed process frees its keys one lease TTL after its
//! last keep-alive. A driver task on dlock's background runtime owns the stream: it sends a
//! keep-alive every third of the TTL (so a waiter's node lives however long it waits), and one
//! more whenever the backend asks for a confirmation ([`EtcdLease::confirm`]): the answer to
//! that one says the lease was extended to its TTL from no earlier than the moment it was asked.
//! etcd answers the keep-alives of one stream in order, so each answer goes to the request that
//! is oldest among those waiting.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use tokio::sync::{mpsc, oneshot, watch};

use super::etcd_error;
use crate::LockError;

/// What a keep-alive answered.
#[derive(Debug, Clone, Copy)]
pub(super) enum Confirmation {
    /// The lease lives, extended to `ttl` from no earlier than `sent_at`.
    Alive { sent_at: Instant, ttl: Duration },
    /// The lease is gone (expired or revoked): every node on it is gone with it.
    Gone,
}

type Answer = oneshot::Sender<Result<i64, LockError>>;

/// The backend's etcd lease, while its driver runs.
pub(super) struct EtcdLease {
    pub(super) id: i64,
    asks: mpsc::UnboundedSender<Answer>,
    /// `true` once the lease is known gone (or could not be confirmed for a whole TTL).
    gone: watch::Receiver<bool>,
}

impl EtcdLease {
    /// Grants a lease of `ttl` (whole seconds, rounded up) and starts its driver on dlock's
    /// background runtime.
    pub(super) async fn grant(client: &Client, ttl: Duration) -> Result<EtcdLease, LockError> {
        let secs = i64::try_from(ttl.as_millis().div_ceil(1000))
            .unwrap_or(i64::MAX)
            .max(1);
        let mut leases = client.lease_client();
        let granted = leases.grant(secs, None).await.map_err(etcd_error)?;
        let id = granted.id();
        let ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(0));
        let (keeper, stream) = leases.keep_alive(id).await.map_err(etcd_error)?;
        let (asks, asked) = mpsc::unbounded_channel();
        let (gone_tx, gone) = watch::channel(false);
        let driver = Driver {
            client: client.clone(),
            id,
            ttl,
            confirmed_at: Instant::now(),
            gone: gone_tx,
        };
        crate::background::spawn(driver.run(keeper, stream, asked));
        Ok(EtcdLease { id, asks, gone })
    }

    /// Whether the lease is known gone.
    pub(super) fn is_gone(&self) -> bool {
        *self.gone.borrow()
    }

    /// Resolves once the lease is known gone.
    pub(super) async fn until_gone(&self) {
        let mut gone = self.gone.clone();
        let _ = gone.wait_for(|gone| *gone).await;
    }

    /// Sends a keep-alive and waits for its answer, up to `patience`.
    ///
    /// # Errors
    ///
    /// [`LockError::Backend`] where no answer came: the lease may or may not live.
    pub(super) async fn confirm(&self, patience: Duration) -> Result<Confirmation, LockError> {
        if self.is_gone() {
            return Ok(Confirmation::Gone);
        }
        let sent_at = Instant::now();
        let (answer, answered) = oneshot::channel();
        if self.asks.send(answer).is_err() {
            return Ok(Confirmation::Gone);
        }
        match tokio::time::timeout(patience, answered).await {
            Ok(Ok(Ok(ttl))) if ttl > 0 => Ok(Confirmation::Alive {
                sent_at,
                ttl: Duration::from_secs(u64::try_from(ttl).unwrap_or(0)),
            }),
            Ok(Ok(Ok(_))) => Ok(Confirmation::Gone),
            Ok(Ok(Err(error))) => Err(error),
            Ok(Err(_)) => Ok(Confirmation::Gone),
            Err(_) => Err(LockError::backend(format!(
                "etcd did not answer a keep-alive of lease {:x} within {patience:?}",
                self.id
            ))),
        }
    }
}

/// The task that owns the keep-alive stream.
struct Driver {
    client: Client,
    id: i64,
    ttl: Duration,
    /// When the last keep-alive that etcd confirmed was sent (about).
    confirmed_at: Instant,
    gone: watch::Sender<bool>,
}

impl Driver {
    async fn run(
        mut self,
        mut keeper: LeaseKeeper,
        mut stream: LeaseKeepAliveStream,
        mut asked: mpsc::UnboundedReceiver<Answer>,
    ) {
        let period = (self.ttl / 3).max(Duration::from_millis(100));
        // Who waits for each keep-alive in flight, oldest first; `None` for the driver's own.
        let mut waiting: VecDeque<(Instant, Option<Answer>)> = VecDeque::new();
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let broken = tokio::select! {
                ask = asked.recv() => match ask {
                    // The backend is gone: its nodes go with the lease, at once.
                    None => {
                        let mut leases = self.client.lease_client();
                        let _ = tokio::time::timeout(self.ttl, leases.revoke(self.id)).await;
                        return;
                    }
                    Some(answer) => {
                        let sent = keeper.keep_alive().await.is_ok();
                        waiting.push_back((Instant::now(), Some(answer)));
                        !sent
                    }
                },
                _ = tick.tick() => {
                    let sent = keeper.keep_alive().await.is_ok();
                    waiting.push_back((Instant::now(), None));
                    !sent
                }
                message = stream.message() => match message {
                    Ok(Some(reply)) => {
                        let (sent_at, answer) = waiting.pop_front().unwrap_or((Instant::now(), None));
                        if reply.ttl() <= 0 {
                            self.end(waiting, answer);
                            return;
                        }
                        self.confirmed_at = self.confirmed_at.max(sent_at);
                        if let Some(answer) = answer {
                            let _ = answer.send(Ok(reply.ttl()));
                        }
                        false
                    }
                    Ok(None) | Err(_) => true,
                },
            };
            if broken {
                for (_, answer) in waiting.drain(..).filter_map(|(at, a)| a.map(|a| (at, a))) {
                    let _ = answer.send(Err(LockError::backend(
                        "the etcd keep-alive stream broke before it answered",
                    )));
                }
                match self.reopen(&mut asked).await {
                    Some((new_keeper, new_stream)) => {
                        keeper = new_keeper;
                        stream = new_stream;
                    }
                    None => {
                        self.end(VecDeque::new(), None);
                        return;
                    }
                }
            }
        }
    }

    /// Opens a new keep-alive stream for the lease, trying again until it opens or the lease
    /// cannot have lived since its last confirmation; `None` once the lease is gone. Asks that
    /// come meanwhile are answered with an error.
    async fn reopen(
        &mut self,
        asked: &mut mpsc::UnboundedReceiver<Answer>,
    ) -> Option<(LeaseKeeper, LeaseKeepAliveStream)> {
        let mut pause = Duration::from_millis(50);
        loop {
            if self.confirmed_at.elapsed() >= self.ttl {
                return None;
            }
            let mut leases = self.client.lease_client();
            match tokio::time::timeout(self.ttl, leases.keep_alive(self.id)).await {
                Ok(Ok((keeper, stream))) => {
                    // Its first keep-alive was answered with a TTL, so the lease lives.
                    self.confirmed_at = Instant::now();
                    return Some((keeper, stream));
                }
                Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => return None,
                Ok(Err(_)) | Err(_) => {}
            }
            while let Ok(answer) = asked.try_recv() {
                let _ = answer.send(Err(LockError::backend(
                    "etcd cannot be reached to keep the lease alive",
                )));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// Marks the lease gone and tells everyone waiting.
    fn end(&self, waiting: VecDeque<(Instant, Option<Answer>)>, first: Option<Answer>) {
        self.gone.send_replace(true);
        for answer in first
            .into_iter()
            .chain(waiting.into_iter().filter_map(|(_, a)| a))
        {
            let _ = answer.send(Ok(0));
        }
    }
}
