//! What the commands ask of the runtime, as the tool's reports: a key's state, the held keys,
//! and a forced release.

use dlock::{Holder, KeyState, LockError, Locker, Owner};

use crate::report::{HolderReport, KeyReport};

/// The state of `key`.
pub async fn inspect(locker: &Locker, key: &str) -> Result<KeyReport, LockError> {
    Ok(report(&locker.inspect(key).await?))
}

/// The held keys starting with `prefix`, in key order, each with its state. A key released
/// between the listing and its inspection is left out.
pub async fn list(locker: &Locker, prefix: &str) -> Result<Vec<KeyReport>, LockError> {
    let mut held = Vec::new();
    for key in locker.list(prefix).await? {
        let state = report(&locker.inspect(&key).await?);
        if state.held {
            held.push(state);
        }
    }
    Ok(held)
}

/// The state of `key`, and the owner of its holder (`None` where it is free): the holder
/// `release --force` shows, and then evicts.
pub async fn inspect_holder(
    locker: &Locker,
    key: &str,
) -> Result<(KeyReport, Option<Owner>), LockError> {
    let state = locker.inspect(key).await?;
    let owner = state.holders().first().map(Holder::owner);
    Ok((report(&state), owner))
}

/// Evicts `key`'s holder where it is `owner`: its fence, or `None` where `owner` no longer
/// holds the key.
pub async fn force_release(
    locker: &Locker,
    key: &str,
    owner: Owner,
) -> Result<Option<u64>, LockError> {
    locker.force_release(key, owner).await
}

/// The report of what the store said of one key.
fn report(state: &KeyState) -> KeyReport {
    let holders = state
        .holders()
        .iter()
        .map(|holder| {
            HolderReport::new(
                holder.label(),
                holder.host().map(str::to_owned),
                holder.pid(),
                holder.owner().to_string(),
                holder.fence(),
                holder.acquired_at(),
                holder.time_left(),
            )
        })
        .collect();
    KeyReport::new(state.key(), holders, state.waiters() as u64)
}
