//! `dlock list URL [PREFIX]`: the held keys.

use dlock::{mask_password, LockError};
use serde::Serialize;

use super::{connect, finish, print_json};
use crate::exit::Exit;
use crate::report::KeyReport;
use crate::{render, store};

/// `list`'s JSON (and each line of `watch --json`).
#[derive(Serialize)]
pub struct Listed<'a> {
    /// The store's URL, password masked.
    pub store: &'a str,
    /// The prefix listed under (`""` for every key).
    pub prefix: &'a str,
    /// The held keys, in key order.
    pub keys: &'a [KeyReport],
}

/// Prints the keys held under `prefix`.
pub async fn run(url: &str, prefix: &str, json: bool) -> Result<Exit, LockError> {
    let locker = connect(url).await?;
    let result = store::list(&locker, prefix).await;
    let keys = finish(locker, result).await?;
    let store = mask_password(url);
    if json {
        print_json(&Listed {
            store: &store,
            prefix,
            keys: &keys,
        });
    } else {
        print!("{}", render::list(&store, prefix, &keys));
    }
    Ok(Exit::Ok)
}
