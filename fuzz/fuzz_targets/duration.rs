//! Fuzzes the duration literals of `#[distributed_lock(ttl = "…", wait = "…")]`.
//!
//! For any text (the input is `literal\0` and the bytes of a number):
//! - neither the parser nor the whole attribute expansion panics, overflow included;
//! - the parser agrees with an independent reading of the grammar (integer + unit, repeated; units
//!   `ms`, `s`, `m`, `h`) done in 128-bit arithmetic: a well-formed literal that fits in `u64`
//!   milliseconds parses to exactly the sum of its parts, one that does not fit is an error that
//!   says "too large" (never a wrapped value), and a malformed one is an error with a hint (or,
//!   when a number before the mistake already overflows, the "too large" one).
//!
//! For any `u64` number of milliseconds, its canonical spellings (`"1h2m3s4ms"`, `"…ms"`, with
//! leading zeros) parse back to it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proc_macro2::{Span, TokenStream};
use quote::quote;

// The macro crate's own modules, shared by every target.
include!("../macro_crate.rs");

use duration::parse_millis;

// The input is plain text, so that seeds and crashes read as they are: the literal, then after a
// NUL byte up to 8 bytes of a little-endian number of milliseconds.
fuzz_target!(|data: &[u8]| {
    let (text, number) = match data.iter().position(|&b| b == 0) {
        Some(nul) => (&data[..nul], &data[nul + 1..]),
        None => (data, &[][..]),
    };
    let mut bytes = [0u8; 8];
    let len = number.len().min(8);
    bytes[..len].copy_from_slice(&number[..len]);
    let millis = u64::from_le_bytes(bytes);
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    check_against_oracle(text);
    check_expansion(text);
    for canonical in canonical_forms(millis) {
        assert_eq!(parse_millis(&canonical), Ok(millis), "{canonical:?}");
    }
});

fn check_against_oracle(text: &str) {
    match (parse_millis(text), oracle(text)) {
        (Ok(ms), Some(total)) => assert_eq!(u128::from(ms), total, "{text:?}"),
        (Ok(ms), None) => panic!("{text:?} is malformed but parsed as {ms}"),
        (Err(message), Some(total)) => {
            assert!(total > u128::from(u64::MAX), "{text:?}: {message}");
            assert!(message.contains("too large"), "{text:?}: {message}");
        }
        // A literal both malformed and too large may be reported as either.
        (Err(message), None) => assert!(
            message.contains("e.g.") || message.contains("too large"),
            "{text:?}: {message}"
        ),
    }
}

/// The grammar read a second way: `None` when malformed, else the total in milliseconds,
/// saturating far above `u64::MAX` (a number of more than 30 significant digits is "huge").
fn oracle(text: &str) -> Option<u128> {
    const HUGE: u128 = u128::MAX / 4;
    if text.is_empty() {
        return None;
    }
    let mut total: u128 = 0;
    let mut chars = text.chars().peekable();
    while chars.peek().is_some() {
        let mut number = String::new();
        while let Some(&c) = chars.peek().filter(|c| c.is_ascii_digit()) {
            number.push(c);
            chars.next();
        }
        let mut unit = String::new();
        while let Some(&c) = chars.peek().filter(|c| c.is_ascii_alphabetic()) {
            unit.push(c);
            chars.next();
        }
        let scale: u128 = match unit.as_str() {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60 * 1_000,
            "h" => 60 * 60 * 1_000,
            _ => return None,
        };
        if number.is_empty() {
            return None;
        }
        let significant = number.trim_start_matches('0');
        let value: u128 = if significant.len() > 30 {
            HUGE
        } else {
            significant.parse().unwrap_or(0)
        };
        total = total.saturating_add(value.saturating_mul(scale)).min(HUGE);
    }
    Some(total)
}

fn canonical_forms(millis: u64) -> Vec<String> {
    let (h, rest) = (millis / 3_600_000, millis % 3_600_000);
    let (m, rest) = (rest / 60_000, rest % 60_000);
    let (s, ms) = (rest / 1_000, rest % 1_000);
    let mut split = String::new();
    for (value, unit) in [(h, "h"), (m, "m"), (s, "s"), (ms, "ms")] {
        if value > 0 {
            split.push_str(&format!("{value}{unit}"));
        }
    }
    if split.is_empty() {
        split.push_str("0ms");
    }
    let mut forms = vec![split, format!("{millis}ms"), format!("000{millis}ms")];
    if millis.is_multiple_of(1_000) {
        forms.push(format!("{}s", millis / 1_000));
    }
    forms
}

/// The whole attribute with the text as `ttl` and `wait` must expand (or report an error)
/// without panicking.
fn check_expansion(text: &str) {
    let lit = syn::LitStr::new(text, Span::call_site());
    let item: TokenStream = quote!(
        async fn handle(id: u64) {}
    );
    let _ = expand::distributed_lock(quote!(key = "job:<id>", ttl = #lit, wait = #lit), item);
}
