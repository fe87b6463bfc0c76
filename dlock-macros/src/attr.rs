//! The argument list of `#[distributed_lock(…)]`: `name = value` pairs, parsed leniently and then
//! checked one by one so that every mistake is reported at once, on its own token.

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, ExprPath, Ident, Lit, LitStr, Token};

pub(crate) use crate::duration::DurationArg;
use crate::duration::{duration, ungroup, Bounds};

/// The argument names, in the order the messages list them.
const VALID: &str =
    "key, ttl, wait, renew, on_lost, locker, label, hold_at_least, permits, mode, crate";

/// What `on_lost = "…"` selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnLost {
    Cancel,
    Continue,
}

/// What `mode = "…"` selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Read,
    Write,
}

/// `locker = EXPR`; `name` is kept to point the compiler's "expected due to this" at it.
pub(crate) struct LockerArg {
    pub name: Ident,
    pub expr: Expr,
}

/// The checked arguments, with the documented defaults filled in (`ttl` 30 s, `wait` 0 s, renewal
/// on, `on_lost = "cancel"`; a missing `label` is the function's path, filled in by `expand`,
/// which knows the function).
pub(crate) struct Args {
    pub key: LitStr,
    pub ttl: DurationArg,
    pub wait: DurationArg,
    pub renew: bool,
    pub on_lost: OnLost,
    pub locker: Option<LockerArg>,
    pub label: Option<LitStr>,
    /// `hold_at_least`, where given.
    pub hold_at_least: Option<DurationArg>,
    /// `permits`, where given: an integer literal from 1 up, as a `u32` literal.
    pub permits: Option<syn::LitInt>,
    /// `mode`, where given.
    pub mode: Option<Mode>,
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
    let mut ttl = DurationArg::Millis(30_000);
    let mut wait = DurationArg::Millis(0);
    let mut renew = true;
    let mut on_lost = OnLost::Cancel;
    let mut locker = None;
    let mut label = None;
    let mut hold_at_least = None;
    let mut permits = None;
    // With the span of its name, which a conflict with `permits` is reported on.
    let mut mode = None;
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
            "ttl" => duration(&name, value, Bounds::TTL).map(|d| ttl = d),
            "wait" => duration(&name, value, Bounds::WAIT).map(|d| wait = d),
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
            "locker" => locker_built_here(&value).map(|()| {
                locker = Some(LockerArg {
                    name: name.clone(),
                    expr: value,
                })
            }),
            "label" => string_literal(&value, "label = \"billing::submit\"").and_then(|lit| {
                if lit.value().is_empty() {
                    Err(syn::Error::new(
                        lit.span(),
                        "empty label; name the holder for operators, e.g. label = \"billing::submit\", \
                         or leave `label` out to use the function's path",
                    ))
                } else {
                    label = Some(lit);
                    Ok(())
                }
            }),
            "hold_at_least" => {
                let value_span = value.span();
                duration(&name, value, Bounds::HOLD).map(|d| hold_at_least = Some((d, value_span)))
            }
            "permits" => permit_count(&value).map(|n| permits = Some(n)),
            "mode" => string_literal(&value, "mode = \"read\"").and_then(|lit| {
                let chosen = match lit.value().as_str() {
                    "read" => Mode::Read,
                    "write" => Mode::Write,
                    _ => {
                        return Err(syn::Error::new(
                            lit.span(),
                            "`mode` is \"read\" (shared with other readers) or \"write\" (alone, \
                             the default)",
                        ))
                    }
                };
                mode = Some((chosen, name.span()));
                Ok(())
            }),
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
    // A lease that is not renewed ends at its ttl: a longer hold could not be kept.
    if let (false, DurationArg::Millis(ttl), Some((DurationArg::Millis(hold), span))) =
        (renew, &ttl, &hold_at_least)
    {
        if hold > ttl {
            errors.push(syn::Error::new(
                *span,
                "`hold_at_least` is longer than the `ttl` of a lease with `renew = false`, which \
                 ends at its ttl; drop `renew = false`, or make the ttl at least as long as the hold",
            ));
        }
    }
    if let (Some((_, span)), Some(_)) = (&mode, &permits) {
        errors.push(syn::Error::new(
            *span,
            "`mode` cannot go with `permits`: a key is a semaphore or a read-write lock, not \
             both; remove one of them",
        ));
    }
    errors.finish()?;
    Ok(Args {
        key: key.expect("a missing key is reported above"),
        ttl,
        wait,
        renew,
        on_lost,
        locker,
        label,
        hold_at_least: hold_at_least.map(|(hold, _)| hold),
        permits,
        mode: mode.map(|(mode, _)| mode),
        krate,
    })
}

/// The most permits a key may have: the runtime's `LockOptions::MAX_PERMITS`, which refuses more
/// at run time by the same bound.
const MAX_PERMITS: u32 = 1024;

/// `permits = N`: an integer literal from 1 to [`MAX_PERMITS`], handed on as a `u32` literal
/// spanned where it was written.
fn permit_count(value: &Expr) -> syn::Result<syn::LitInt> {
    const EXAMPLE: &str = "e.g. permits = 3 for at most three holders at once";
    let Expr::Lit(ExprLit {
        lit: Lit::Int(lit), ..
    }) = ungroup(value.clone())
    else {
        return Err(syn::Error::new(
            value.span(),
            format!("`permits` takes an integer literal, {EXAMPLE}"),
        ));
    };
    if !matches!(lit.suffix(), "" | "u32") {
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "`permits` is a `u32`: write it without the `{}` suffix",
                lit.suffix()
            ),
        ));
    }
    match lit.base10_parse::<u32>() {
        Ok(0) => Err(syn::Error::new(
            lit.span(),
            format!("`permits = 0` admits nobody; give at least 1 (1 is a plain lock), {EXAMPLE}"),
        )),
        Ok(n) if n <= MAX_PERMITS => Ok(syn::LitInt::new(&format!("{n}u32"), lit.span())),
        // A waiter waits on every permit at once: a place in each one's queue.
        _ => Err(syn::Error::new(
            lit.span(),
            format!(
                "`permits` is at most {MAX_PERMITS}: a waiter waits on every permit at once, \
                 each a key of the store's"
            ),
        )),
    }
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

/// The paths given as `ttl` or `wait`, found even when the arguments have mistakes, so that the
/// function written back under an error still uses the constants they name.
pub(crate) fn duration_paths(args: TokenStream) -> Vec<ExprPath> {
    let Ok(raw) = Punctuated::<RawArg, Token![,]>::parse_terminated.parse2(args) else {
        return Vec::new();
    };
    raw.into_iter()
        .filter(|arg| {
            ["ttl", "wait", "hold_at_least"]
                .iter()
                .any(|name| arg.name == name)
        })
        .filter_map(|arg| match ungroup(arg.value) {
            Expr::Path(path) => Some(path),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use super::{parse, DurationArg, Mode, OnLost};

    fn millis(duration: &DurationArg) -> Option<u64> {
        match duration {
            DurationArg::Millis(ms) => Some(*ms),
            DurationArg::Const { .. } => None,
        }
    }

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
            (
                millis(&args.ttl),
                millis(&args.wait),
                args.renew,
                args.on_lost
            ),
            (Some(30_000), Some(0), true, OnLost::Cancel)
        );
        assert!(args.locker.is_none());
        assert!(args.label.is_none());
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
            label = "billing::submit",
            crate = "::other::dlock"
        ))
        .unwrap();
        assert_eq!(
            args.label.map(|l| l.value()).as_deref(),
            Some("billing::submit")
        );
        assert_eq!(
            (
                millis(&args.ttl),
                millis(&args.wait),
                args.renew,
                args.on_lost
            ),
            (Some(90_000), Some(250), false, OnLost::Continue)
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
    fn bounds_a_ttl_literal_as_every_call_does() {
        let longest = parse(quote!(key = "k", ttl = "9223372036854775807ms")).unwrap();
        assert_eq!(millis(&longest.ttl), Some(i64::MAX as u64));
        let message = err(quote!(key = "k", ttl = "9223372036854775808ms"));
        assert!(
            message.contains("`ttl` \"9223372036854775808ms\" is too long; it must be at most 9223372036854775807ms (about 292 million years), e.g. ttl = \"30s\""),
            "{message}"
        );
        // Any wait is one: a longer one than the runtime honours waits until the key is free.
        let forever = parse(quote!(key = "k", wait = "18446744073709551615ms")).unwrap();
        assert_eq!(millis(&forever.wait), Some(u64::MAX));
    }

    #[test]
    fn takes_a_duration_constant_by_path() {
        let args = parse(quote!(key = "k", ttl = LOCK_TTL, wait = config::WAIT)).unwrap();
        let paths: Vec<String> = [&args.ttl, &args.wait]
            .iter()
            .map(|d| match d {
                DurationArg::Const { path, .. } => quote!(#path).to_string(),
                DurationArg::Millis(_) => panic!("a path was read as a literal"),
            })
            .collect();
        assert_eq!(paths, ["LOCK_TTL", "config :: WAIT"]);
        let message = err(quote!(key = "k", ttl = 3, wait = Duration::from_secs(1)));
        assert!(
            message.contains("expected a duration literal, e.g. ttl = \"3s\", or the path of a `std::time::Duration` constant, e.g. ttl = LOCK_TTL"),
            "{message}"
        );
        assert!(message.contains("e.g. wait = LOCK_WAIT"), "{message}");
    }

    #[test]
    fn reads_permits_and_refuses_what_admits_nobody_or_is_no_literal() {
        assert!(parse(quote!(key = "k")).unwrap().permits.is_none());
        let permits = parse(quote!(key = "k", permits = 3)).unwrap().permits;
        assert_eq!(permits.unwrap().base10_parse::<u32>().unwrap(), 3);
        assert!(parse(quote!(key = "k", permits = 4u32))
            .unwrap()
            .permits
            .is_some());
        assert!(err(quote!(key = "k", permits = 0)).contains("`permits = 0` admits nobody"));
        assert!(
            err(quote!(key = "k", permits = "3")).contains("`permits` takes an integer literal")
        );
        assert!(err(quote!(key = "k", permits = N)).contains("`permits` takes an integer literal"));
        assert!(err(quote!(key = "k", permits = 3u8)).contains("without the `u8` suffix"));
        assert!(err(quote!(key = "k", permits = 4294967296)).contains("at most 1024"));
        assert!(err(quote!(key = "k", permits = 1025)).contains("at most 1024"));
        assert!(parse(quote!(key = "k", permits = 1024)).is_ok());
        assert!(err(quote!(key = "k", permits = 2, permits = 3))
            .contains("`permits` is given twice; remove one"));
    }

    #[test]
    fn reads_a_mode_and_refuses_another_word_or_one_beside_permits() {
        assert!(parse(quote!(key = "k")).unwrap().mode.is_none());
        assert_eq!(
            parse(quote!(key = "k", mode = "read")).unwrap().mode,
            Some(Mode::Read)
        );
        assert_eq!(
            parse(quote!(key = "k", mode = "write")).unwrap().mode,
            Some(Mode::Write)
        );
        assert!(err(quote!(key = "k", mode = "reed"))
            .contains("`mode` is \"read\" (shared with other readers) or \"write\""));
        assert!(err(quote!(key = "k", mode = Mode::Read))
            .contains("expected a string literal, e.g. mode = \"read\""));
        assert!(err(quote!(key = "k", permits = 3, mode = "read"))
            .contains("`mode` cannot go with `permits`"));
    }

    #[test]
    fn refuses_an_empty_repeated_or_computed_label() {
        assert!(err(quote!(key = "k", label = "")).contains("empty label; name the holder"));
        assert!(err(quote!(key = "k", label = "a", label = "b"))
            .contains("`label` is given twice; remove one"));
        assert!(err(quote!(key = "k", label = NAME))
            .contains("expected a string literal, e.g. label = \"billing::submit\""));
    }

    #[test]
    fn requires_a_literal_key() {
        assert!(err(quote!(ttl = "3s")).contains("missing `key`"));
        assert!(err(quote!(key = KEY)).contains("expected a string literal"));
        assert!(err(quote!(key = "")).contains("empty key"));
    }
}
