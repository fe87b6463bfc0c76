//! `dlock release --force URL KEY`: evicts a key's holder.
//!
//! The holder is read first (`inspect`), shown at the confirmation, and it alone is evicted: the
//! eviction names its owner, and the store evicts nobody else. So a key that changes hands while
//! the question waits for an answer (the holder released it, another took it) keeps its new
//! holder: the command then prints "the holder changed: nothing released" and exits with 3.
//! `--owner HEX` names the holder to evict, as `inspect` showed it earlier: the same, where
//! another holds the key by now.
//!
//! The holder is not asked: its next renewal finds the key no longer its own and its lease is
//! lost (a body under `on_lost = "cancel"` stops); a lease that does not renew may learn of it
//! only at its own ttl. The next holder's fence is greater than the evicted one, so a store that
//! checks fences rejects the evicted holder's late writes.

use std::io::{BufRead, IsTerminal, Write};

use dlock::{mask_password, LockError, Locker};
use serde::Serialize;

use super::{connect, finish, print_json};
use crate::cli::ReleaseArgs;
use crate::exit::Exit;
use crate::report::{human_duration, KeyReport};
use crate::store;

/// `release --force`'s JSON.
#[derive(Serialize)]
struct Released<'a> {
    /// The store's URL, password masked.
    store: &'a str,
    key: &'a str,
    /// Whether a holder was evicted; `false` where nobody held the key, or the holder changed
    /// before the eviction (exit code 3).
    released: bool,
    /// Whether the holder that was read, and shown, no longer held the key when it was to be
    /// evicted (nothing was released).
    holder_changed: bool,
    /// The evicted holder's fence; `null` where nothing was released.
    evicted_fence: Option<u64>,
}

/// Asks for confirmation where it can (see the module documentation), then evicts.
pub async fn run(args: &ReleaseArgs, json: bool) -> Result<Exit, LockError> {
    if !args.yes && !std::io::stdin().is_terminal() {
        eprintln!(
            "dlock: not releasing `{}`: standard input is not a terminal, so nobody can confirm; \
             pass --yes to release without asking",
            args.key
        );
        return Ok(Exit::Usage);
    }
    let locker = connect(&args.url).await?;
    let result = confirm_and_release(&locker, args, json).await;
    finish(locker, result).await
}

async fn confirm_and_release(
    locker: &Locker,
    args: &ReleaseArgs,
    json: bool,
) -> Result<Exit, LockError> {
    let store = mask_password(&args.url);
    // The holder to evict, as the store shows it now. The eviction names its owner, so a key
    // that changes hands while the question waits keeps its new holder.
    let (report, owner) = store::inspect_holder(locker, &args.key).await?;
    let Some(owner) = owner else {
        return Ok(not_held(&store, &args.key, json));
    };
    // `--owner`: the holder seen earlier, which may have gone since.
    if args
        .owner
        .as_ref()
        .is_some_and(|seen| *seen != owner.to_string())
    {
        return Ok(holder_changed(&store, &args.key, json));
    }
    if !args.yes {
        let question = format!(
            "Force-release `{}` on {store}, evicting {}? Its lease is lost and its fenced \
             writes will be rejected. [y/N] ",
            args.key,
            describe(&report)
        );
        if !confirmed(question).await {
            eprintln!("dlock: not released");
            return Ok(Exit::Declined);
        }
    }
    match store::force_release(locker, &args.key, owner).await? {
        Some(fence) => {
            if json {
                print_json(&Released {
                    store: &store,
                    key: &args.key,
                    released: true,
                    holder_changed: false,
                    evicted_fence: Some(fence),
                });
            } else {
                println!(
                    "released `{}`: evicted the holder with fence {fence} (on {store})",
                    args.key
                );
            }
            Ok(Exit::Ok)
        }
        None => Ok(holder_changed(&store, &args.key, json)),
    }
}

/// Reports a key whose holder is no longer the one to evict: nothing was released.
fn holder_changed(store: &str, key: &str, json: bool) -> Exit {
    if json {
        print_json(&Released {
            store,
            key,
            released: false,
            holder_changed: true,
            evicted_fence: None,
        });
    } else {
        eprintln!("dlock: `{key}` on {store}: the holder changed: nothing released");
    }
    Exit::NotHeld
}

/// Reports a key nobody holds: nothing was released.
fn not_held(store: &str, key: &str, json: bool) -> Exit {
    if json {
        print_json(&Released {
            store,
            key,
            released: false,
            holder_changed: false,
            evicted_fence: None,
        });
    } else {
        eprintln!("dlock: `{key}` is not held on {store}: nothing released");
    }
    Exit::NotHeld
}

/// The holders of `report`, for the question: `billing::submit on web-1 (pid 4242, fence 7,
/// 2.5s left)`.
fn describe(report: &KeyReport) -> String {
    let each: Vec<String> = report
        .holders
        .iter()
        .map(|h| {
            let left = h.time_left().map_or_else(String::new, |left| {
                format!(", {} left", human_duration(left))
            });
            let label = if h.label.is_empty() {
                "the holder"
            } else {
                &h.label
            };
            let host = h
                .host
                .as_deref()
                .map_or_else(String::new, |host| format!(" on {host}"));
            let pid = h.pid.map_or_else(String::new, |pid| format!("pid {pid}, "));
            format!("{label}{host} ({pid}fence {}{left})", h.fence)
        })
        .collect();
    each.join(" and ")
}

/// Asks `question` on the terminal; `true` for an answer starting with `y` or `Y`.
async fn confirmed(question: String) -> bool {
    tokio::task::spawn_blocking(move || {
        let mut stderr = std::io::stderr();
        let _ = write!(stderr, "{question}");
        let _ = stderr.flush();
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer).is_ok()
            && matches!(answer.trim_start().chars().next(), Some('y' | 'Y'))
    })
    .await
    .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::report::HolderReport;

    #[test]
    fn the_question_names_the_holder() {
        let holder = HolderReport::new(
            "billing::submit",
            Some("web-1".into()),
            Some(4242),
            "00ff",
            7,
            UNIX_EPOCH,
            Some(Duration::from_millis(2_500)),
        );
        let unknown = HolderReport::new("", None, None, "00ff", 8, UNIX_EPOCH, None);
        let report = KeyReport::new("acct:42", vec![holder, unknown], 0);
        assert_eq!(
            describe(&report),
            "billing::submit on web-1 (pid 4242, fence 7, 2.5s left) and the holder (fence 8)"
        );
    }
}
