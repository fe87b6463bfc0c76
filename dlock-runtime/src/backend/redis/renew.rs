//! Renewal: every lease of a watchdog tick in one pipeline (on a cluster, one per hash slot), and
//! what its replies confirm.

use std::time::Duration;

use redis::{RedisResult, ScriptInvocation, Value};

use super::conn::Conn;
use super::replicas::{parse_acknowledged, ReplicaWait};
use super::scripts::{invoke_pipelined, unexpected, RENEW};
use super::{lease_millis, RedisBackend};
use crate::backend::Renewal;
use crate::{LockError, Owner};

impl RedisBackend {
    /// Renews `leases`, answering per lease (see [`Renewed::judged`]), with the first failure
    /// where some lease was not confirmed: a call that failed, or renewals that fewer replicas
    /// acknowledged than `min_replicas` asks for. `expiry` says how each lock's expiry is set.
    pub(super) async fn renew_judged(
        &self,
        leases: &[Renewal<'_>],
        expiry: Expiry,
    ) -> (Vec<Option<bool>>, Option<LockError>) {
        if leases.is_empty() {
            return (Vec::new(), None);
        }
        let replicas = (self.inner.min_replicas > 0).then(|| {
            let shortest = leases.iter().map(|lease| lease.ttl).min();
            self.replicas_for(shortest.unwrap_or_default())
        });
        if self.inner.cluster {
            #[cfg(feature = "redis-cluster")]
            return self.renew_by_slot(leases, replicas, expiry).await;
            #[cfg(not(feature = "redis-cluster"))]
            unreachable!("a cluster backend needs the redis-cluster feature")
        }
        let calls: Vec<_> = leases
            .iter()
            .map(|lease| renew_call(self.lock_key(lease.key), lease, expiry))
            .collect();
        let renewed = self
            .inner
            .conn
            .run("renew", |conn| renew_pipelined(conn, &calls, replicas))
            .await;
        match renewed {
            Ok(renewed) => {
                let error = self.unreplicated_renewal(&renewed);
                (renewed.judged(), error)
            }
            Err(error) => (vec![None; leases.len()], Some(error)),
        }
    }

    /// Why the leases of `renewed` that the primary renewed are not confirmed, if they are not.
    fn unreplicated_renewal(&self, renewed: &Renewed) -> Option<LockError> {
        let (acknowledged, asked) = renewed.replicas?;
        (acknowledged < asked.count).then(|| {
            LockError::backend(format!(
                "redis at {}: renew: the renewal was acknowledged by {acknowledged} of the {} \
                 replica(s) min_replicas asks for within {} ms; its leases are not confirmed \
                 this round",
                self.inner.conn.description(),
                asked.count,
                asked.timeout_ms,
            ))
        })
    }
}

#[cfg(feature = "redis-cluster")]
impl RedisBackend {
    /// Renews on a cluster: one pipeline per hash slot (a cluster pipeline cannot span slots),
    /// all sent at once. Answers per lease, `None` for the leases of a slot that failed, with
    /// the first failure.
    async fn renew_by_slot(
        &self,
        leases: &[Renewal<'_>],
        replicas: Option<ReplicaWait>,
        expiry: Expiry,
    ) -> (Vec<Option<bool>>, Option<LockError>) {
        // Per slot, the indices of its leases and their calls.
        type Batch = (Vec<usize>, Vec<ScriptInvocation<'static>>);
        let mut by_slot: std::collections::BTreeMap<u16, Batch> = std::collections::BTreeMap::new();
        for (index, lease) in leases.iter().enumerate() {
            let lock = self.lock_key(lease.key);
            let (indices, calls) = by_slot
                .entry(super::keys::cluster_slot(lock.as_bytes()))
                .or_default();
            indices.push(index);
            calls.push(renew_call(lock, lease, expiry));
        }
        // A node that went down can keep its slots' calls waiting (the cluster client retries);
        // the others' answers must not wait for it past the point where their leases could use
        // them: a renewal comes every ttl/3, and a slot's is awaited for no longer than the
        // longest renewal period among its own leases. Not the batch's shortest: as the
        // watchdog waits for a batch as long as its longest-lived lease can, a short lease never
        // cuts a long lease's renewal short (it is lost by its own deadline). A hold's expiry
        // carries what is left of the hold, which may be milliseconds: not a renewal period, and
        // no reason to give up on a call sooner than a round trip takes.
        let bound = |indices: &[usize]| {
            let longest = indices
                .iter()
                .map(|&index| crate::clock::renew_interval(leases[index].ttl))
                .max()
                .unwrap_or_default()
                .max(Duration::from_millis(1));
            match expiry {
                Expiry::Exactly { .. } => longest.max(EXACT_EXPIRY_PATIENCE),
                Expiry::Extend => longest,
            }
        };
        let batches = by_slot.into_values().map(|(indices, calls)| async move {
            let bound = bound(&indices);
            let renewed = self
                .inner
                .conn
                .run("renew", |conn| renew_pipelined(conn, &calls, replicas));
            let renewed = match tokio::time::timeout(bound, renewed).await {
                Ok(renewed) => renewed?,
                Err(_) => {
                    return Err(LockError::backend(format!(
                        "redis cluster: renewing a slot's leases took longer than {bound:?}"
                    )))
                }
            };
            Ok::<_, LockError>((indices, renewed))
        });
        let mut answers = vec![None; leases.len()];
        let mut first_error = None;
        for result in futures_util::future::join_all(batches).await {
            match result {
                Ok((indices, renewed)) => {
                    for (index, held) in indices.into_iter().zip(renewed.judged()) {
                        answers[index] = held;
                    }
                    if let Some(error) = self.unreplicated_renewal(&renewed) {
                        first_error.get_or_insert(error);
                    }
                }
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        (answers, first_error)
    }
}

/// The renew script's call for `lease`, whose lock is named `lock`: extend it by the lease's ttl
/// where its owner still holds it.
impl RedisBackend {
    /// Sets the expiry of `owner`'s lock of `key` to `after` from now, exactly (the renewal
    /// script, told so), acknowledged by the replicas `min_replicas` asks for as a renewal is:
    /// whether `owner` held it.
    ///
    /// The hold ends the lease as a release does, later: where a copy of an acquire call of
    /// `owner` may still be on its way (see `release_or_leave`), it leaves the owner's cancel
    /// marker too, and the record of that call sent twice is then done with.
    pub(super) async fn expire_lease(
        &self,
        key: &str,
        owner: Owner,
        after: Duration,
    ) -> Result<bool, LockError> {
        let resent = self.was_resent(key, owner);
        let cancel = resent || self.inner.cluster;
        let (held, error) = self
            .renew_judged(
                &[Renewal::new(key, owner, after)],
                Expiry::Exactly { cancel },
            )
            .await;
        let held = match (held.first(), error) {
            (_, Some(error)) => Err(error),
            (Some(Some(held)), None) => Ok(*held),
            _ => Err(LockError::backend(format!(
                "redis at {}: expire: no answer",
                self.inner.conn.description()
            ))),
        };
        // Kept where the hold's expiry failed: it is tried again, and the marker with it (a try
        // after the hold's end is a release, which forgets it).
        if resent && held.is_ok() {
            self.inner
                .resent
                .forget(&self.inner.layout.lock_keys(key, owner));
        }
        held
    }
}

fn renew_call(lock: String, lease: &Renewal<'_>, expiry: Expiry) -> ScriptInvocation<'static> {
    let owner = lease.owner.hex();
    let mut call = RENEW.key(lock);
    call.arg(std::str::from_utf8(&owner).expect("hex digits are ASCII"))
        .arg(lease_millis(lease.ttl));
    if let Expiry::Exactly { cancel } = expiry {
        call.arg("exactly");
        if cancel {
            call.arg("cancel");
        }
    }
    call
}

/// How a renewal sets each lock's expiry.
#[derive(Debug, Clone, Copy)]
pub(super) enum Expiry {
    /// Extended to the lease's ttl from now, never shortened: a renewal. Refused where the
    /// lock's hold was set (it is marked so, see renew.lua): the lease was released.
    Extend,
    /// Set to the lease's ttl from now, sooner or later: a lease's hold
    /// ([`expire_lease`](RedisBackend::expire_lease)), which marks the lock so that a renewal
    /// landing late does not stretch it. Where `cancel`, the owner's cancel marker is left too
    /// (see renew.lua).
    Exactly { cancel: bool },
}

/// The least time a cluster's call setting a hold's expiry is awaited.
#[cfg(feature = "redis-cluster")]
const EXACT_EXPIRY_PATIENCE: Duration = Duration::from_secs(1);

/// What one renewal pipeline said.
struct Renewed {
    /// Per lease, whether its owner held it on the primary (now extended there).
    held: Vec<bool>,
    /// With `min_replicas`: how many replicas acknowledged the pipeline's writes, and how many
    /// were asked for.
    replicas: Option<(u64, ReplicaWait)>,
}

impl Renewed {
    /// Per lease: `Some(true)` where renewed (and acknowledged by the replicas asked for),
    /// `Some(false)` where the primary refused it, `None` where renewed on the primary alone —
    /// not confirmed this round.
    fn judged(&self) -> Vec<Option<bool>> {
        let replicated = self
            .replicas
            .is_none_or(|(acknowledged, asked)| acknowledged >= asked.count);
        self.held
            .iter()
            .map(|&held| (replicated || !held).then_some(held))
            .collect()
    }
}

/// Renews with `calls` in one pipeline on `conn`, followed by a `WAIT` where `replicas` asks for
/// one: one round trip (two where the server had to be taught the script).
async fn renew_pipelined(
    conn: Conn,
    calls: &[ScriptInvocation<'_>],
    replicas: Option<ReplicaWait>,
) -> RedisResult<Renewed> {
    let mut replies = invoke_pipelined(conn, &RENEW, calls, replicas.map(ReplicaWait::cmd)).await?;
    if replies.len() != calls.len() + usize::from(replicas.is_some()) {
        return Err(unexpected(&Value::Array(replies)));
    }
    let acknowledged = match replicas {
        Some(replicas) => {
            let reply = replies.pop().expect("counted above");
            Some((parse_acknowledged(reply)?, replicas))
        }
        None => None,
    };
    let held = replies
        .into_iter()
        .map(|reply| match reply.extract_error()? {
            Value::Int(held) => Ok(held == 1),
            other => Err(unexpected(&other)),
        })
        .collect::<RedisResult<_>>()?;
    Ok(Renewed {
        held,
        replicas: acknowledged,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_too_few_replicas_acknowledged_confirms_nothing_but_a_refusal() {
        let asked = ReplicaWait {
            count: 2,
            timeout_ms: 100,
        };
        let renewed = |acknowledged| Renewed {
            held: vec![true, false],
            replicas: Some((acknowledged, asked)),
        };
        assert_eq!(renewed(1).judged(), vec![None, Some(false)]);
        assert_eq!(renewed(2).judged(), vec![Some(true), Some(false)]);
        let unasked = Renewed {
            held: vec![true, false],
            replicas: None,
        };
        assert_eq!(unasked.judged(), vec![Some(true), Some(false)]);
    }
}
