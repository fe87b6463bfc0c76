//! The `LockSpec` a locked call is made with: the attribute's arguments as the runtime takes
//! them, constants read where the compiler checks them.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::Signature;

use crate::attr::{Args, DurationArg, Mode, OnLost};
use crate::expand::local;
use crate::key;

/// `LockSpec::new(name, ttl, wait, renew, on_lost).label(label)`. The label is a `&'static
/// str` written into the program, so that naming the holder costs a call nothing: the
/// `label = "…"` given, or else the function's path, `module_path!()` and its name. (A method's
/// type is not part of it: the attribute sees the method, not the `impl` around it.)
pub(crate) fn lock_spec(args: &Args, sig: &Signature) -> TokenStream {
    let krate = &args.krate;
    let name = sig.ident.to_string();
    let ttl = ttl(&args.ttl, krate, sig);
    let wait = duration(&args.wait, None);
    let renew = args.renew;
    let on_lost = match args.on_lost {
        OnLost::Cancel => quote!(#krate::__private::OnLost::Cancel),
        OnLost::Continue => quote!(#krate::__private::OnLost::Continue),
    };
    let label = match &args.label {
        Some(label) => quote!(#label),
        None => quote!(::core::concat!(::core::module_path!(), "::", #name)),
    };
    let mut spec = quote!(#krate::__private::LockSpec::new(#name, #ttl, #wait, #renew, #on_lost).label(#label));
    if let Some(hold) = &args.hold_at_least {
        let hold = duration(hold, None);
        spec = quote!(#spec.hold_at_least(#hold));
    }
    if let Some(permits) = &args.permits {
        spec = quote!(#spec.permits(#permits));
    }
    if let Some(mode) = args.mode {
        let mode = match mode {
            Mode::Read => quote!(#krate::Mode::Read),
            Mode::Write => quote!(#krate::Mode::Write),
        };
        spec = quote!(#spec.mode(#mode));
    }
    spec
}

/// A `Duration` expression. A constant is read in a `const` block, through a `let` typed
/// `Duration` and spanned on its path: a wrong type or a value that is no constant is reported
/// on the path, with "expected due to this" on the argument's name. `check` goes between the
/// two, on the value read. A wait needs no check: any `Duration` is one (`Duration::MAX` waits
/// until the key is free).
fn duration(duration: &DurationArg, check: Option<TokenStream>) -> TokenStream {
    match duration {
        DurationArg::Millis(ms) => quote!(::core::time::Duration::from_millis(#ms)),
        DurationArg::Const { name, path } => {
            let value = local("__dlock_duration");
            let ty = quote_spanned!(name.span()=> ::core::time::Duration);
            quote_spanned! {path.span()=>
                const {
                    let #value: #ty = #path;
                    #check
                    #value
                }
            }
        }
    }
}

/// The ttl: a `Duration` expression as [`duration`] makes it, a constant checked by the bounds
/// every call checks (`LockOptions`), so that one out of them is a compile error on its path
/// rather than a function that always fails (or, returning `()`, always skips).
///
/// A `const` block inside the function is evaluated only when the function is compiled for a
/// caller, and never by `cargo check`. So a constant that an item nested in the function's body
/// can name is read in such an item instead, which the compiler evaluates as it checks the
/// crate (see [`nameable_from_a_nested_item`]); the others stay in the block.
fn ttl(ttl: &DurationArg, krate: &syn::Path, sig: &Signature) -> TokenStream {
    let value = local("__dlock_duration");
    let DurationArg::Const { name, path } = ttl else {
        return duration(ttl, None);
    };
    // On the constant's own name, the last segment: a span cannot cover the whole path.
    let constant = path
        .path
        .segments
        .last()
        .map_or_else(|| path.span(), |segment| segment.ident.span());
    let check = quote_spanned! {constant=>
        ::core::assert!(
            !#krate::__private::ttl_is_too_short(#value),
            "`ttl` must be at least 1ms, and this constant is shorter: every call would fail with `LockError::InvalidOptions`; make it longer, e.g. `Duration::from_secs(30)`",
        );
        ::core::assert!(
            !#krate::__private::ttl_is_too_long(#value),
            "`ttl` must be at most `i64::MAX` milliseconds (about 292 million years), and this constant is longer: every call would fail with `LockError::InvalidOptions`; make it shorter, e.g. `Duration::from_secs(30)`",
        );
    };
    if !nameable_from_a_nested_item(path, sig) {
        return duration(ttl, Some(check));
    }
    let item = local("__DLOCK_TTL");
    let ty = quote_spanned!(name.span()=> ::core::time::Duration);
    quote_spanned! {path.span()=>
        {
            const #item: ::core::time::Duration = {
                let #value: #ty = #path;
                #check
                #value
            };
            #item
        }
    }
}

/// Whether `path` names the same constant from an item nested in the function's body. Not so:
/// a path through `Self`, a parameter or a generic parameter of the function, or a path with
/// generic arguments or a qualified self, none of which a nested item can use; nor a path
/// through a type, which may be a generic parameter of the surrounding `impl` (`T::TTL`), out of
/// the attribute's sight. A single name can (a constant or a static; a parameter is excluded
/// above), and so can a path through a module: `crate`, `self` or `super`, a leading `::`, or a
/// first segment in lower case, as Rust names modules and never type parameters.
fn nameable_from_a_nested_item(path: &syn::ExprPath, sig: &Signature) -> bool {
    let syn::ExprPath { qself, path, .. } = path;
    if qself.is_some() || path.segments.iter().any(|s| !s.arguments.is_none()) {
        return false;
    }
    let Some(first) = path.segments.first().map(|s| s.ident.to_string()) else {
        return false;
    };
    let names_a_parameter =
        path.segments.len() == 1 && key::params(sig).iter().any(|param| *param.name() == first);
    let through_a_generic = sig.generics.params.iter().any(|param| match param {
        syn::GenericParam::Type(ty) => ty.ident == first,
        syn::GenericParam::Const(constant) => constant.ident == first,
        syn::GenericParam::Lifetime(_) => false,
    });
    if first == "Self" || names_a_parameter || through_a_generic {
        return false;
    }
    path.leading_colon.is_some()
        || path.segments.len() == 1
        || ["crate", "self", "super"].contains(&first.as_str())
        || first.starts_with(|c: char| c.is_lowercase())
}

#[cfg(test)]
mod tests {
    use super::nameable_from_a_nested_item;

    #[test]
    fn a_ttl_constant_is_checked_in_a_nested_item_where_one_can_name_it() {
        let sig: syn::Signature =
            syn::parse_quote!(async fn run<T: Config, const N: usize>(&self, ttl: Duration));
        let nameable = |path: syn::ExprPath| nameable_from_a_nested_item(&path, &sig);
        // Constants and statics by name, and through modules.
        assert!(nameable(syn::parse_quote!(LOCK_TTL)));
        assert!(nameable(syn::parse_quote!(config::LOCK_TTL)));
        assert!(nameable(syn::parse_quote!(crate::config::LOCK_TTL)));
        assert!(nameable(syn::parse_quote!(self::LOCK_TTL)));
        assert!(nameable(syn::parse_quote!(super::LOCK_TTL)));
        assert!(nameable(syn::parse_quote!(::app::LOCK_TTL)));
        // What only the function itself can use, or what may be a generic of its `impl`.
        assert!(!nameable(syn::parse_quote!(Self::TTL)));
        assert!(!nameable(syn::parse_quote!(T::TTL)));
        assert!(!nameable(syn::parse_quote!(N)));
        assert!(!nameable(syn::parse_quote!(ttl)));
        assert!(!nameable(syn::parse_quote!(self)));
        assert!(!nameable(syn::parse_quote!(Jobs::TTL)));
        assert!(!nameable(syn::parse_quote!(<T as Config>::TTL)));
        assert!(!nameable(syn::parse_quote!(config::Of::<T>::TTL)));
    }
}
