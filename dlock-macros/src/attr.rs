//! The argument list of `#[distributed_lock(…)]`: `name = value` pairs, parsed leniently and then
//! checked one by one so that every mistake is reported at once, on its own token.

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, Ident, Lit, LitStr, Token};

use crate::duration;

/// The argument names, in the order the messages list them.
const VALID: &str = "key, ttl, wait, renew, on_lost, locker, crate";

/// What `on_lost = "…"` selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnLost {
    Cancel,
    Continue,
}

/// The checked arguments, with the documented defaults filled in (`ttl` 30 s, `wait` 0 s, renewal
/// on, `on_lost = "cancel"`).
pub(crate) struct Args {
    pub key: LitStr,
    pub ttl_ms: u64,
    pub wait_ms: u64,
    pub renew: bool,
    pub on_lost: OnLost,
    pub locker: Option<Expr>,
    pub krate: syn::Path,
}

struct RawArg {
    name: Ident,
    value: Expr,
}

impl Parse for RawArg {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        // `crate` is a keyword; `parse_any` takes it as a name.
        let name = Ident::parse_any(input)?;
        let _: Token![=] = input.parse().map_err(|e| {
            syn::Error::new(
                e.span(),
                format!("expected `{name} = …`; arguments are written `name = value`"),
            )
        })?;
        let value = input.parse()?;
        Ok(RawArg { name, value })
    }
}

/// Collects errors so they are all reported together.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }

    pub fn finish(self) -> Result<(), syn::Error> {
        self.0.map_or(Ok(()), Err)
    }
}

pub(crate) fn parse(args: TokenStream) -> Result<Args, syn::Error> {
    let raw = Punctuated::<RawArg, Token![,]>::parse_terminated.parse2(args)?;
    let mut errors = Errors::default();
    let mut seen: Vec<String> = Vec::new();

    let mut key = None;
    let mut ttl_ms = 30_000;
    let mut wait_ms = 0;
    let mut renew = true;
    let mut on_lost = OnLost::Cancel;
    let mut locker = None;
    let mut krate: syn::Path = syn::parse_quote!(::dlock);

    for RawArg { name, value } in raw {
        let name_str = name.to_string();
        if seen.contains(&name_str) {
            errors.push(syn::Error::new(
                name.span(),
                format!("`{name}` is given twice; remove one"),
            ));
            continue;
        }
        seen.push(name_str.clone());
        let result = match name_str.as_str() {
            "key" => string_literal(&value, "key = \"order:<order_id>\"").and_then(|lit| {
                if lit.value().is_empty() {
                    Err(syn::Error::new(lit.span(), "empty key; give the lock a name, e.g. key = \"order:<order_id>\""))
                } else {
                    key = Some(lit);
                    Ok(())
                }
            }),
            "ttl" => duration_literal(&value, "ttl", false).map(|ms| ttl_ms = ms),
            "wait" => duration_literal(&value, "wait", true).map(|ms| wait_ms = ms),
            "renew" => match &value {
                Expr::Lit(ExprLit { lit: Lit::Bool(b), .. }) => {
                    renew = b.value;
                    Ok(())
                }
                other => Err(syn::Error::new_spanned(other, "`renew` takes `true` or `false`")),
            },
            "on_lost" => string_literal(&value, "on_lost = \"cancel\"").and_then(|lit| {
                on_lost = match lit.value().as_str() {
                    "cancel" => OnLost::Cancel,
                    "continue" => OnLost::Continue,
                    _ => {
                        return Err(syn::Error::new(
                            lit.span(),
                            "`on_lost` is \"cancel\" (stop the body and return `LockError::Lost`) or \"continue\"",
                        ))
                    }
                };
                Ok(())
            }),
            "locker" => locker_built_here(&value).map(|()| locker = Some(value)),
            "crate" => string_literal(&value, "crate = \"::dlock\"").and_then(|lit| {
                krate = lit.parse().map_err(|_| {
                    syn::Error::new(lit.span(), "`crate` takes a path to the dlock crate, e.g. crate = \"::my_app::dlock\"")
                })?;
                Ok(())
            }),
            _ => Err(syn::Error::new(
                name.span(),
                format!("unknown argument `{name}`; valid arguments are: {VALID}"),
            )),
        };
        if let Err(error) = result {
            errors.push(error);
        }
    }

    let key = match key {
        Some(key) => Some(key),
        None if !seen.iter().any(|s| s == "key") => {
            errors.push(syn::Error::new(
                Span::call_site(),
                "missing `key`; name the lock, e.g. #[distributed_lock(key = \"order:<order_id>\")]",
            ));
            None
        }
        None => None,
    };
    errors.finish()?;
    Ok(Args {
        key: key.expect("a missing key is reported above"),
        ttl_ms,
        wait_ms,
        renew,
        on_lost,
        locker,
        krate,
    })
}

/// Refuses a `locker` expression that builds a `Locker` with one of its constructors
/// (`&Locker::memory()`, `&Locker::connect(url).await?`, …): it is evaluated at every call, so
/// each call would get a store of its own and no two calls would ever exclude each other. Other
/// calls on `Locker`, a user's own trait handing out a shared one say, are left alone.
fn locker_built_here(value: &Expr) -> syn::Result<()> {
    const CONSTRUCTORS: [&str; 6] = [
        "memory",
        "connect",
        "redis",
        "with_backend",
        "from_env",
        "from_backend",
    ];
    let mut expr = value;
    let call = loop {
        expr = match expr {
            Expr::Reference(e) => &e.expr,
            Expr::Paren(e) => &e.expr,
            Expr::Group(e) => &e.expr,
            Expr::Await(e) => &e.base,
            Expr::Try(e) => &e.expr,
            Expr::MethodCall(e) => &e.receiver,
            Expr::Call(call) => break call,
            _ => return Ok(()),
        };
    };
    let Expr::Path(path) = &*call.func else {
        return Ok(());
    };
    let segments: Vec<_> = path.path.segments.iter().collect();
    match segments.as_slice() {
        [.., ty, constructor]
            if ty.ident == "Locker" && CONSTRUCTORS.iter().any(|c| constructor.ident == c) =>
        {
            Err(syn::Error::new_spanned(
                value,
                "this builds a new `Locker`, with a store of its own, at every call: no two calls \
             would ever exclude each other. Build it once and refer to it, e.g. \
             `static LOCKS: LazyLock<Locker> = LazyLock::new(Locker::memory);` and \
             `locker = &LOCKS`, or `locker = &self.locker`",
            ))
        }
        _ => Ok(()),
    }
}

fn string_literal(value: &Expr, example: &str) -> syn::Result<LitStr> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Ok(lit.clone()),
        other => Err(syn::Error::new(
            other.span(),
            format!("expected a string literal, e.g. {example}"),
        )),
    }
}

fn duration_literal(value: &Expr, name: &str, zero_allowed: bool) -> syn::Result<u64> {
    let lit = string_literal(value, &format!("{name} = \"3s\""))?;
    let ms =
        duration::parse_millis(&lit.value()).map_err(|msg| syn::Error::new(lit.span(), msg))?;
    if ms == 0 && !zero_allowed {
        return Err(syn::Error::new(
            lit.span(),
            format!("`{name}` must be longer than zero, e.g. {name} = \"3s\""),
        ));
    }
    Ok(ms)
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use super::{parse, OnLost};

    fn err(tokens: proc_macro2::TokenStream) -> String {
        match parse(tokens) {
            Ok(_) => panic!("expected an error"),
            Err(e) => e
                .into_iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    #[test]
    fn fills_defaults() {
        let args = parse(quote!(key = "a:<b>")).unwrap();
        assert_eq!(args.key.value(), "a:<b>");
        assert_eq!(
            (args.ttl_ms, args.wait_ms, args.renew, args.on_lost),
            (30_000, 0, true, OnLost::Cancel)
        );
        assert!(args.locker.is_none());
    }

    #[test]
    fn reads_every_argument() {
        let args = parse(quote!(
            key = "k",
            ttl = "1m30s",
            wait = "250ms",
            renew = false,
            on_lost = "continue",
            locker = &LOCKS,
            crate = "::other::dlock"
        ))
        .unwrap();
        assert_eq!(
            (args.ttl_ms, args.wait_ms, args.renew, args.on_lost),
            (90_000, 250, false, OnLost::Continue)
        );
        assert!(args.locker.is_some());
        let krate = args.krate;
        assert_eq!(
            quote!(#krate).to_string().replace(' ', ""),
            "::other::dlock"
        );
    }

    #[test]
    fn reports_all_mistakes_together() {
        let message = err(quote!(key = "k", colour = "red", ttl = "0s", ttl = "3s"));
        assert!(
            message.contains("unknown argument `colour`; valid arguments are: key, ttl"),
            "{message}"
        );
        assert!(
            message.contains("`ttl` must be longer than zero"),
            "{message}"
        );
        assert!(message.contains("`ttl` is given twice"), "{message}");
    }

    #[test]
    fn requires_a_literal_key() {
        assert!(err(quote!(ttl = "3s")).contains("missing `key`"));
        assert!(err(quote!(key = KEY)).contains("expected a string literal"));
        assert!(err(quote!(key = "")).contains("empty key"));
    }
}
