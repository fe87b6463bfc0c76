//! What a Redis server ran, read from `INFO commandstats`: for the tests that pin down what a
//! call costs the server, command by command.

use std::collections::BTreeMap;

/// Every command the server ran so far, by name, the commands scripts run included; without the
/// `INFO` calls that read it and the replicas' `REPLCONF ACK`s (which come every second, and
/// whenever a `WAIT` asks for them).
pub async fn command_counts(
    connection: &mut impl redis::aio::ConnectionLike,
) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(connection)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| line.strip_prefix("cmdstat_"))
        .filter_map(|line| {
            let (name, rest) = line.split_once(":calls=")?;
            let calls = rest.split(',').next()?.parse().ok()?;
            Some((name.to_owned(), calls))
        })
        .filter(|(name, _)| name != "info" && name != "replconf")
        .collect()
}

/// Runs of a script (`EVALSHA` and `EVAL`) so far.
pub async fn script_runs(connection: &mut impl redis::aio::ConnectionLike) -> u64 {
    let counts = command_counts(connection).await;
    ["evalsha", "eval"]
        .iter()
        .filter_map(|name| counts.get(*name))
        .sum()
}

/// The commands run between two [`command_counts`], by name, those run at least once.
pub fn commands_between(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> Vec<(String, u64)> {
    after
        .iter()
        .map(|(name, calls)| (name.clone(), calls - before.get(name).copied().unwrap_or(0)))
        .filter(|(_, calls)| *calls > 0)
        .collect()
}

/// `list` in the shape [`commands_between`] answers in, to compare with it.
pub fn commands(list: &[(&str, u64)]) -> Vec<(String, u64)> {
    list.iter()
        .map(|&(name, calls)| (name.to_owned(), calls))
        .collect()
}
