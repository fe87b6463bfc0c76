//! `dlock`, the command-line tool for operators of services that use dlock: see who holds a
//! key (`inspect`), list and watch the held keys (`list`, `watch`), force-release a stuck lock
//! (`release --force`), and measure a store (`bench`). Tables for people, `--json` for scripts;
//! exit codes are listed under `dlock --help` and in the README.

mod bench;
mod cli;
mod commands;
mod exit;
mod render;
mod report;
mod store;
mod table;

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    // A usage error exits here, with clap's message and code 2.
    let cli = cli::Cli::parse();
    commands::run(cli).await.into()
}
