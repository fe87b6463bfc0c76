//! The durations of the attribute (`ttl`, `wait`, `hold_at_least`): literals of an integer and a
//! unit, units combinable (`"1m30s"`), checked against each argument's bounds, or paths to
//! `Duration` constants.

use syn::{Expr, ExprLit, ExprPath, Ident, Lit, LitStr};

/// A `ttl`, `wait` or `hold_at_least`: a literal checked here, or a path to a `Duration`
/// constant that the compiler checks.
pub(crate) enum DurationArg {
    Millis(u64),
    /// `name = PATH`; `name` is kept to point the compiler's "expected due to this" at it.
    Const {
        name: Ident,
        path: ExprPath,
    },
}

/// The units a duration literal may use, with their length in milliseconds.
const UNITS: [(&str, u64); 4] = [("ms", 1), ("s", 1_000), ("m", 60_000), ("h", 3_600_000)];

/// Parses `text` into milliseconds, or says what is wrong and how to write it.
pub(crate) fn parse_millis(text: &str) -> Result<u64, String> {
    const HINT: &str = "write an integer followed by a unit (`ms`, `s`, `m`, `h`), e.g. \"3s\", \"500ms\" or \"1m30s\"";
    if text.is_empty() {
        return Err(format!("empty duration; {HINT}"));
    }
    let mut rest = text;
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!(
                "malformed duration \"{text}\": expected a number at \"{rest}\"; {HINT}"
            ));
        }
        let (number, after) = rest.split_at(digits);
        let unit_len = after.bytes().take_while(u8::is_ascii_alphabetic).count();
        let (unit, after) = after.split_at(unit_len);
        if unit.is_empty() {
            return Err(format!(
                "malformed duration \"{text}\": `{number}` has no unit; {HINT}"
            ));
        }
        let Some(&(_, scale)) = UNITS.iter().find(|(name, _)| *name == unit) else {
            return Err(format!(
                "malformed duration \"{text}\": unknown unit `{unit}`; {HINT}"
            ));
        };
        let overflow =
            || format!("duration \"{text}\" is too large; it must fit in u64 milliseconds");
        let value: u64 = number.parse().map_err(|_| overflow())?;
        let part = value.checked_mul(scale).ok_or_else(overflow)?;
        total = total.checked_add(part).ok_or_else(overflow)?;
        rest = after;
    }
    Ok(total)
}

/// A tokens group without delimiters (a `macro_rules!` fragment) is looked through.
pub(crate) fn ungroup(value: Expr) -> Expr {
    match value {
        Expr::Group(group) => ungroup(*group.expr),
        other => other,
    }
}

/// What a duration literal of one argument may be.
pub(crate) struct Bounds {
    zero_allowed: bool,
    max_millis: u64,
}

impl Bounds {
    /// A lease lasts from 1 ms up to `i64::MAX` ms: the bounds `Locker::lock` checks at every
    /// call (`LockOptions`), here so that a literal out of them is a compile error.
    pub(crate) const TTL: Bounds = Bounds {
        zero_allowed: false,
        max_millis: i64::MAX as u64,
    };
    /// A hold of zero holds nothing (leave it out instead); the longest is a ttl's.
    pub(crate) const HOLD: Bounds = Bounds {
        zero_allowed: false,
        max_millis: i64::MAX as u64,
    };
    /// Any wait is one: zero tries once, and a longer one than the runtime honours waits until
    /// the key is free.
    pub(crate) const WAIT: Bounds = Bounds {
        zero_allowed: true,
        max_millis: u64::MAX,
    };
}

pub(crate) fn duration(name: &Ident, value: Expr, bounds: Bounds) -> syn::Result<DurationArg> {
    match ungroup(value) {
        Expr::Path(path) => Ok(DurationArg::Const {
            name: name.clone(),
            path,
        }),
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => duration_literal(&lit, name, bounds).map(DurationArg::Millis),
        other => Err(syn::Error::new_spanned(
            other,
            format!(
                "expected a duration literal, e.g. {name} = \"3s\", or the path of a \
                 `std::time::Duration` constant, e.g. {name} = LOCK_{upper}",
                upper = name.to_string().to_uppercase()
            ),
        )),
    }
}

fn duration_literal(lit: &LitStr, name: &Ident, bounds: Bounds) -> syn::Result<u64> {
    let ms = parse_millis(&lit.value()).map_err(|msg| syn::Error::new(lit.span(), msg))?;
    if ms == 0 && !bounds.zero_allowed {
        return Err(syn::Error::new(
            lit.span(),
            format!("`{name}` must be longer than zero, e.g. {name} = \"3s\""),
        ));
    }
    if ms > bounds.max_millis {
        const MILLIS_PER_YEAR: u64 = 31_557_600_000;
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "`{name}` \"{text}\" is too long; it must be at most {max}ms (about {years} \
                 million years), e.g. {name} = \"30s\"",
                text = lit.value(),
                max = bounds.max_millis,
                years = bounds.max_millis / MILLIS_PER_YEAR / 1_000_000,
            ),
        ));
    }
    Ok(ms)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::parse_millis;

    #[test]
    fn accepts_single_and_combined_units() {
        assert_eq!(parse_millis("3s"), Ok(3_000));
        assert_eq!(parse_millis("500ms"), Ok(500));
        assert_eq!(parse_millis("1m30s"), Ok(90_000));
        assert_eq!(parse_millis("1h1m1s1ms"), Ok(3_661_001));
        assert_eq!(parse_millis("0s"), Ok(0));
    }

    #[test]
    fn rejects_malformed_input_with_a_hint() {
        for bad in ["", "3", "s", "3d", "3 s", "-3s", "3s5", "1.5s"] {
            let err = parse_millis(bad).unwrap_err();
            assert!(err.contains("e.g. \"3s\""), "{bad:?}: {err}");
        }
    }

    #[test]
    fn rejects_overflow() {
        assert!(parse_millis("18446744073709551616ms")
            .unwrap_err()
            .contains("too large"));
        assert!(parse_millis("5124095576030432h")
            .unwrap_err()
            .contains("too large"));
        assert!(parse_millis("18446744073709551615ms1ms")
            .unwrap_err()
            .contains("too large"));
    }

    proptest! {
        #[test]
        fn a_sum_of_parts_parses_to_the_sum_or_to_too_large(
            parts in proptest::collection::vec((any::<u64>(), 0..4usize), 1..5),
        ) {
            let scales = [("h", 3_600_000u128), ("m", 60_000), ("s", 1_000), ("ms", 1)];
            let text: String = parts
                .iter()
                .map(|&(n, unit)| format!("{n}{}", scales[unit].0))
                .collect();
            let total: u128 = parts.iter().map(|&(n, unit)| u128::from(n) * scales[unit].1).sum();
            match u64::try_from(total) {
                Ok(total) => prop_assert_eq!(parse_millis(&text), Ok(total)),
                Err(_) => prop_assert!(parse_millis(&text).unwrap_err().contains("too large")),
            }
        }

        #[test]
        fn canonical_forms_round_trip(ms in any::<u64>()) {
            let (h, rest) = (ms / 3_600_000, ms % 3_600_000);
            let canonical = format!("{h}h{}m{}s{}ms", rest / 60_000, rest % 60_000 / 1_000, rest % 1_000);
            prop_assert_eq!(parse_millis(&canonical), Ok(ms));
            prop_assert_eq!(parse_millis(&format!("{ms}ms")), Ok(ms));
        }

        #[test]
        fn never_panics_and_always_explains(text in prop_oneof![any::<String>(), "[0-9hms]{0,30}"]) {
            if let Err(message) = parse_millis(&text) {
                prop_assert!(message.contains("e.g.") || message.contains("too large"), "{}", message);
            }
        }
    }
}
