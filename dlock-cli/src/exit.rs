//! Exit codes: what a script calling `dlock` can tell apart without reading its output. Listed
//! under `dlock --help` and in the crate's README; never renumbered.

use std::process::ExitCode;

use dlock::LockError;

/// How a `dlock` command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: done.
    Ok,
    /// 1: the store failed, could not be reached, or cannot do what was asked.
    Store,
    /// 2: a usage error: bad arguments (clap exits with 2 too), a URL that cannot be used, or
    /// `release --force` without `--yes` where nobody can confirm at a terminal.
    Usage,
    /// 3: the key is not held (`inspect` of a free key, `release --force` of a free key), or
    /// `release --force` found that the holder it was to evict no longer holds the key (it
    /// released it, or its lease ran out: nothing was released).
    NotHeld,
    /// 4: `release --force` was declined at the prompt; nothing was released.
    Declined,
}

impl Exit {
    /// The process's exit code.
    pub fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::Store => 1,
            Exit::Usage => 2,
            Exit::NotHeld => 3,
            Exit::Declined => 4,
        }
    }

    /// The code a failure of the runtime ends the command with: the caller's mistake (a URL, a
    /// key or options the store cannot take) is a usage error, anything else the store's.
    pub fn for_error(error: &LockError) -> Exit {
        match error {
            LockError::InvalidUrl { .. }
            | LockError::InvalidKey { .. }
            | LockError::InvalidOptions { .. } => Exit::Usage,
            _ => Exit::Store,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit.code())
    }
}

/// The exit codes as `dlock --help` lists them, after the commands.
pub const HELP: &str = "\
Exit codes:
  0  ok
  1  the store failed, could not be reached, or does not support the command
  2  usage error: bad arguments, a URL that cannot be used, or `release --force`
     without `--yes` when standard input is not a terminal (nothing is released)
  3  the key is not held (`inspect` of a free key, `release --force` of a free key),
     or the holder changed before `release --force` evicted it (nothing is released)
  4  `release --force` declined at the prompt (nothing is released)

Passwords in URLs are printed as `***`, in tables, JSON and errors alike.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_help_lists_every_code() {
        for exit in [
            Exit::Ok,
            Exit::Store,
            Exit::Usage,
            Exit::NotHeld,
            Exit::Declined,
        ] {
            assert!(
                HELP.contains(&format!("\n  {}  ", exit.code())),
                "{exit:?} missing from the help"
            );
        }
    }

    #[test]
    fn mistakes_of_the_caller_are_usage_errors() {
        let url = LockError::InvalidUrl {
            url: "ftp://x".into(),
            reason: "unknown scheme".into(),
        };
        assert_eq!(Exit::for_error(&url), Exit::Usage);
        assert_eq!(
            Exit::for_error(&LockError::backend("connection refused")),
            Exit::Store
        );
    }
}
