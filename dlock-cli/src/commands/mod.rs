//! The commands, each in a module of its own, and what they share: connecting, printing JSON,
//! and turning a failure into a message and an exit code.

mod inspect;
mod list;
mod release;
mod watch;

use dlock::{LockError, Locker};
use serde::Serialize;

use crate::cli::{Cli, Command};
use crate::exit::Exit;

/// Runs the command `cli` names; answers how it ended. Failures are printed here, on standard
/// error, with any password masked (the runtime's errors mask them themselves).
pub async fn run(cli: Cli) -> Exit {
    let json = cli.json;
    let result = match cli.command {
        Command::Inspect { url, key } => inspect::run(&url, &key, json).await,
        Command::List { url, prefix } => list::run(&url, &prefix, json).await,
        Command::Watch {
            url,
            prefix,
            interval,
        } => watch::run(&url, &prefix, interval, json).await,
        Command::Release(args) => release::run(&args, json).await,
        Command::Bench(args) => crate::bench::run(&args, json).await,
    };
    match result {
        Ok(exit) => exit,
        Err(error) => {
            eprintln!("dlock: {error}");
            Exit::for_error(&error)
        }
    }
}

/// A locker on the store `url` names.
pub async fn connect(url: &str) -> Result<Locker, LockError> {
    Locker::connect(url).await
}

/// Shuts `locker` down (nothing stays held or queued by this process), then answers `result`.
pub async fn finish<T>(locker: Locker, result: Result<T, LockError>) -> Result<T, LockError> {
    let closed = locker.shutdown().await;
    let value = result?;
    closed?;
    Ok(value)
}

/// Prints `value` as pretty JSON on standard output.
pub fn print_json(value: &impl Serialize) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).expect("reports always serialise")
    );
}
