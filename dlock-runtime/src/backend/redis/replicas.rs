//! Replica acknowledgement (`min_replicas`): the `WAIT` that rides in the same round trip as a
//! grant or a renewal, and what a write too few replicas acknowledged means.

use std::time::Duration;

use redis::{Cmd, RedisResult, Script, ScriptInvocation, Value};

use super::conn::Conn;
use super::scripts::{invoke_pipelined, unexpected};
use super::{millis, RedisBackend};
use crate::backend::AcquireRequest;
use crate::LockError;

impl RedisBackend {
    /// The `WAIT` that follows a write whose leases have ttl `ttl` at the shortest: for
    /// `min_replicas` replicas, for a quarter of the renewal interval, no more than half the
    /// response timeout (a `WAIT` that outlasted it would break the connection), at least 1 ms
    /// (`WAIT` with 0 blocks for ever).
    pub(super) fn replicas_for(&self, ttl: Duration) -> ReplicaWait {
        let timeout = (crate::clock::renew_interval(ttl) / 4).min(self.inner.response_timeout / 2);
        ReplicaWait {
            count: self.inner.min_replicas as u64,
            timeout_ms: millis(timeout),
        }
    }

    /// Undoes a grant that too few replicas acknowledged (an owner-checked release), and says
    /// why the acquisition failed.
    pub(super) async fn undo_unreplicated(
        &self,
        request: &AcquireRequest<'_>,
        acknowledged: u64,
    ) -> LockError {
        let key = request.key;
        if let Err(error) = self.release_or_leave(key, request.owner, true).await {
            tracing::debug!(%key, %error, "distributed_lock: undoing a grant the replicas did not acknowledge failed; it will expire");
        }
        let replicas = self.replicas_for(request.ttl);
        LockError::backend(format!(
            "redis at {}: acquire: the grant was acknowledged by {acknowledged} of the {} \
             replica(s) min_replicas asks for within {} ms; it was released",
            self.inner.conn.description(),
            replicas.count,
            replicas.timeout_ms,
        ))
    }
}

/// A `WAIT` for `count` replicas, for at most `timeout_ms`.
#[derive(Debug, Clone, Copy)]
pub(super) struct ReplicaWait {
    pub(super) count: u64,
    pub(super) timeout_ms: u64,
}

impl ReplicaWait {
    pub(super) fn cmd(self) -> Cmd {
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(self.count).arg(self.timeout_ms);
        cmd
    }
}

/// How many replicas a `WAIT` reply says acknowledged the connection's writes.
pub(super) fn parse_acknowledged(reply: Value) -> RedisResult<u64> {
    match reply.extract_error()? {
        Value::Int(acknowledged) => Ok(u64::try_from(acknowledged).unwrap_or(0)),
        other => Err(unexpected(&other)),
    }
}

/// Runs `call`, an invocation of `script`, and `WAIT`s for `replicas` in one pipeline: one round
/// trip (two where the server had to be taught the script). `WAIT` counts the replicas that
/// acknowledged every write the connection made so far, so the script's writes among them.
pub(super) async fn invoke_then_wait(
    conn: Conn,
    script: &Script,
    call: &ScriptInvocation<'_>,
    replicas: ReplicaWait,
) -> RedisResult<(Value, u64)> {
    let replies = invoke_pipelined(
        conn,
        script,
        std::slice::from_ref(call),
        Some(replicas.cmd()),
    )
    .await?;
    let [reply, acknowledged]: [Value; 2] = replies
        .try_into()
        .map_err(|replies: Vec<Value>| unexpected(&Value::Array(replies)))?;
    Ok((reply.extract_error()?, parse_acknowledged(acknowledged)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_blocks_for_a_twelfth_of_the_ttl_within_half_the_response_timeout() {
        let backend = RedisBackend::builder("redis://h")
            .unwrap()
            .min_replicas(1)
            .response_timeout(Duration::from_secs(3))
            .build()
            .unwrap();
        let timeout = |ttl: u64| backend.replicas_for(Duration::from_millis(ttl)).timeout_ms;
        assert_eq!(timeout(2_400), 200);
        assert_eq!(timeout(30_000), 1_500);
        assert_eq!(timeout(1), 1, "WAIT 0 would block for ever");
        assert_eq!(backend.replicas_for(Duration::from_secs(1)).count, 1);
    }
}
