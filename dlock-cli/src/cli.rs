//! The command line: commands, arguments and help, parsed by clap.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::exit;

/// Operate dlock's locks: see who holds a key, list and watch held keys, force-release a stuck
/// lock, and benchmark a store.
///
/// URL names the store as the services' lockers do: redis://[[user]:password@]host[:port][/db],
/// rediss://…, redis+cluster://host:port,…, mysql://user:password@host/db,
/// postgres://user:password@host/db, zk://host:port[,host:port][/chroot],
/// etcd://host:port[,host:port]. Store options ride in its query as for `Locker::connect`
/// (`?key_prefix=billing:` for a Redis key prefix).
// This comment is clap's help text, printed as written: its `[…]` are a URL's optional parts,
// not links.
#[allow(rustdoc::broken_intra_doc_links)]
#[derive(Debug, Parser)]
#[command(name = "dlock", version, after_help = exit::HELP)]
pub struct Cli {
    /// Print JSON for scripts instead of tables (field names are stable, listed in the README)
    #[arg(long, global = true)]
    pub json: bool,

    /// What to do
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show who holds KEY (label, host, pid, owner, fence, acquired at, time left) and how many
    /// wait for it. Exits with 3 when nobody holds it.
    Inspect {
        /// The store
        #[arg(value_name = "URL")]
        url: String,
        /// The key, as the application renders it (`acct:42`)
        #[arg(value_name = "KEY")]
        key: String,
    },
    /// List the held keys, those starting with PREFIX if given
    List {
        /// The store
        #[arg(value_name = "URL")]
        url: String,
        /// Only keys starting with this
        #[arg(value_name = "PREFIX", default_value = "")]
        prefix: String,
    },
    /// List the held keys again and again, in place, like `top`, until Ctrl-C. With --json,
    /// one JSON document per line, per refresh.
    Watch {
        /// The store
        #[arg(value_name = "URL")]
        url: String,
        /// Only keys starting with this
        #[arg(value_name = "PREFIX", default_value = "")]
        prefix: String,
        /// Seconds between refreshes (fractions allowed: 0.5)
        #[arg(long, value_name = "SECONDS", default_value = "1", value_parser = parse_interval)]
        interval: Duration,
    },
    /// Evict KEY's holder (`--force` is required): the holder is read, shown, and only that
    /// holder is evicted. Its lease is lost at its next renewal (a lease that does not renew
    /// may learn of it only at its ttl), and the next holder's fence is greater than the evicted
    /// one, so the evicted holder's fenced writes are rejected. Asks for confirmation at a
    /// terminal unless --yes; without --yes and without a terminal, refuses (exit 2). Exits
    /// with 3 when nobody holds the key, or when the holder changed before the eviction
    /// ("the holder changed: nothing released").
    Release(ReleaseArgs),
    /// Measure the store: sequential acquire and release pairs on distinct keys, then TASKS
    /// tasks contending for one key around a counter (lost updates, waits, per-task counts)
    Bench(BenchArgs),
}

/// The arguments of `release`.
#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// Evict the holder without its consent: required, to say that you mean it
    #[arg(long, required = true)]
    pub force: bool,
    /// Do not ask for confirmation
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Evict only this holder: its owner token as `inspect` showed it (32 hex digits). Where
    /// another holds the key by now, nothing is released (exit 3)
    #[arg(long, value_name = "HEX", value_parser = parse_owner)]
    pub owner: Option<String>,
    /// The store
    #[arg(value_name = "URL")]
    pub url: String,
    /// The key, as the application renders it
    #[arg(value_name = "KEY")]
    pub key: String,
}

/// The arguments of `bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The store
    #[arg(value_name = "URL")]
    pub url: String,
    /// How long each of the two workloads runs, in seconds
    #[arg(long, value_name = "SECONDS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub seconds: u64,
    /// How many tasks contend for the one key of the contended workload
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub tasks: u64,
    /// The prefix of the keys the benchmark locks (a random run id follows it)
    #[arg(long, value_name = "PREFIX", default_value = "dlock-bench:")]
    pub key_prefix: String,
    /// With more than 1, a third workload: the tasks share one key as a semaphore of N permits,
    /// against the same tasks on the key as a mutex, each turn `--work` long
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub permits: u32,
    /// How long each turn of the permits workload works, in milliseconds (a call to the
    /// resource the permits share)
    #[arg(long, value_name = "MS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub work: u64,
}

/// `--interval`: positive seconds, fractions allowed.
fn parse_interval(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    if !(0.05..=86_400.0).contains(&seconds) {
        return Err("expected between 0.05 and 86400 seconds".into());
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// An owner token as stores keep it and `inspect` shows it: 32 hex digits, read in lowercase.
fn parse_owner(text: &str) -> Result<String, String> {
    if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "`{text}` is not an owner token (32 hex digits, as `inspect` shows it)"
        ));
    }
    Ok(text.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use clap::{error::ErrorKind, CommandFactory, Parser};

    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn commands_parse() {
        let cli = Cli::parse_from(["dlock", "inspect", "redis://h", "acct:42", "--json"]);
        assert!(cli.json);
        assert!(matches!(cli.command, Command::Inspect { ref key, .. } if key == "acct:42"));
        let cli = Cli::parse_from(["dlock", "list", "redis://h"]);
        assert!(matches!(cli.command, Command::List { ref prefix, .. } if prefix.is_empty()));
        let cli = Cli::parse_from(["dlock", "watch", "redis://h", "acct:", "--interval", "0.5"]);
        assert!(
            matches!(cli.command, Command::Watch { interval, ref prefix, .. }
                if interval == Duration::from_millis(500) && prefix == "acct:")
        );
        let cli = Cli::parse_from(["dlock", "release", "--force", "-y", "redis://h", "k"]);
        assert!(matches!(
            cli.command,
            Command::Release(ReleaseArgs { yes: true, .. })
        ));
        let cli = Cli::parse_from(["dlock", "bench", "redis://h", "--tasks", "3"]);
        assert!(matches!(
            cli.command,
            Command::Bench(BenchArgs {
                tasks: 3,
                seconds: 5,
                permits: 1,
                work: 5,
                ..
            })
        ));
        let cli = Cli::parse_from([
            "dlock",
            "bench",
            "redis://h",
            "--permits",
            "4",
            "--work",
            "2",
        ]);
        assert!(matches!(
            cli.command,
            Command::Bench(BenchArgs {
                permits: 4,
                work: 2,
                ..
            })
        ));
        assert!(Cli::try_parse_from(["dlock", "bench", "redis://h", "--permits", "0"]).is_err());
    }

    #[test]
    fn a_release_without_force_is_a_usage_error() {
        let error = Cli::try_parse_from(["dlock", "release", "redis://h", "k"]).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::MissingRequiredArgument);
        assert_eq!(error.exit_code(), 2);
        assert!(error.to_string().contains("--force"), "{error}");
    }

    #[test]
    fn owners_are_32_hex_digits() {
        let token = "3F2A9C0D5E7B41A8B6C2D9E0F1A3B5C7";
        assert_eq!(parse_owner(token), Ok(token.to_ascii_lowercase()));
        for bad in [
            "",
            "3f2a",
            "zz2a9c0d5e7b41a8b6c2d9e0f1a3b5c7",
            &format!("{token}0"),
        ] {
            assert!(parse_owner(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn intervals_are_positive_seconds() {
        assert_eq!(parse_interval("2"), Ok(Duration::from_secs(2)));
        for bad in ["0", "-1", "soon", "1e9"] {
            assert!(parse_interval(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_help_lists_the_exit_codes() {
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("Exit codes:"), "{help}");
        assert!(help.contains("3  the key is not held"), "{help}");
    }
}
