//! `dlock inspect URL KEY`: one key's holders and waiters.

use dlock::{mask_password, LockError};
use serde::Serialize;

use super::{connect, finish, print_json};
use crate::exit::Exit;
use crate::report::KeyReport;
use crate::{render, store};

/// `inspect`'s JSON: the key's report, and the store it was read from.
#[derive(Serialize)]
struct Inspected<'a> {
    /// The store's URL, password masked.
    store: &'a str,
    #[serde(flatten)]
    report: &'a KeyReport,
}

/// Prints `key`'s state; exits with [`Exit::NotHeld`] where nobody holds it.
pub async fn run(url: &str, key: &str, json: bool) -> Result<Exit, LockError> {
    let locker = connect(url).await?;
    let result = store::inspect(&locker, key).await;
    let report = finish(locker, result).await?;
    let store = mask_password(url);
    if json {
        print_json(&Inspected {
            store: &store,
            report: &report,
        });
    } else {
        print!("{}", render::inspect(&store, &report));
    }
    Ok(if report.held { Exit::Ok } else { Exit::NotHeld })
}
