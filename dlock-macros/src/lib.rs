//! The `#[distributed_lock]` attribute of [dlock](https://docs.rs/dlock).
//!
//! This crate only parses and expands; everything the expansion does at run time lives in
//! `dlock-runtime`. Depend on `dlock`, which re-exports the attribute, rather than on this crate.
//!
//! The work is split the way the parts are read: [`attr`](self) parses the argument list,
//! `duration` and `template` check the two little languages inside it, and `expand` writes the
//! function back with its body handed to one runtime call. All of it works on `proc_macro2` so
//! that it is unit-tested without a compiler.
#![forbid(unsafe_code)]

mod attr;
mod duration;
mod expand;
mod template;

use proc_macro::TokenStream;

/// Serialises calls of an `async fn` per rendered key with a lease on a distributed store.
///
/// See the `dlock` crate for the arguments and their defaults.
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::distributed_lock(args.into(), item.into()).into()
}
