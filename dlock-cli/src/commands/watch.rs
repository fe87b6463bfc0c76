//! `dlock watch URL [PREFIX]`: the held keys, redrawn in place every interval, like `top`.

use std::io::{IsTerminal, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dlock::{mask_password, LockError, Locker};
use serde::Serialize;

use super::list::Listed;
use super::{connect, finish};
use crate::exit::Exit;
use crate::report::{human_utc, rfc3339, KeyReport};
use crate::{render, store};

/// Moves the cursor home and clears the screen: each refresh draws the page anew.
const CLEAR: &str = "\x1b[H\x1b[2J";

/// One line of `watch --json` whose refresh failed.
#[derive(Serialize)]
struct Failed<'a> {
    at: &'a str,
    store: &'a str,
    prefix: &'a str,
    error: String,
}

/// One line of `watch --json`.
#[derive(Serialize)]
struct Refreshed<'a> {
    /// When the list was read, RFC 3339 UTC.
    at: &'a str,
    #[serde(flatten)]
    listed: Listed<'a>,
}

/// Redraws the list every `interval` until Ctrl-C. A refresh that fails (the store restarting)
/// is shown and tried again at the next one; only the first, which would fail every time (a
/// store that cannot list, a wrong password), ends the command.
pub async fn run(
    url: &str,
    prefix: &str,
    interval: Duration,
    json: bool,
) -> Result<Exit, LockError> {
    let locker = connect(url).await?;
    let result = refresh_until_interrupted(&locker, url, prefix, interval, json).await;
    finish(locker, result).await
}

async fn refresh_until_interrupted(
    locker: &Locker,
    url: &str,
    prefix: &str,
    interval: Duration,
    json: bool,
) -> Result<Exit, LockError> {
    let store = mask_password(url);
    // Clearing the screen makes sense on a terminal only: piped, pages follow one another.
    let in_place = !json && std::io::stdout().is_terminal();
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let mut first = true;
    loop {
        let listed = tokio::select! {
            _ = &mut interrupted => return Ok(Exit::Ok),
            listed = async {
                ticks.tick().await;
                store::list(locker, prefix).await
            } => listed,
        };
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let page = match listed {
            Err(error) if first => return Err(error),
            listed if json => json_line(&store, prefix, &rfc3339(since_epoch), listed),
            listed => {
                let header = format!(
                    "every {}s: dlock list {store}{}    {} UTC    (Ctrl-C quits)\n\n",
                    interval.as_secs_f64(),
                    if prefix.is_empty() {
                        String::new()
                    } else {
                        format!(" {prefix}")
                    },
                    human_utc(since_epoch),
                );
                let body = match listed {
                    Ok(keys) => render::list(&store, prefix, &keys),
                    Err(error) => format!("dlock: {error}\n"),
                };
                let clear = if in_place { CLEAR } else { "\n" };
                format!("{clear}{header}{body}")
            }
        };
        first = false;
        // One write per page, so the screen never shows half of one.
        let mut stdout = std::io::stdout().lock();
        if stdout
            .write_all(page.as_bytes())
            .and_then(|()| stdout.flush())
            .is_err()
        {
            // The reader went away (`dlock watch … | head`): nothing left to show.
            return Ok(Exit::Ok);
        }
    }
}

/// One refresh as a line of JSON.
fn json_line(
    store: &str,
    prefix: &str,
    at: &str,
    listed: Result<Vec<KeyReport>, LockError>,
) -> String {
    let line = match listed {
        Ok(keys) => serde_json::to_string(&Refreshed {
            at,
            listed: Listed {
                store,
                prefix,
                keys: &keys,
            },
        }),
        Err(error) => serde_json::to_string(&Failed {
            at,
            store,
            prefix,
            error: error.to_string(),
        }),
    };
    line.expect("reports always serialise") + "\n"
}
