//! Fuzzes the key template of `#[distributed_lock(key = "…")]`.
//!
//! For any text and any placeholder values (the input is `template\0value\0value…`):
//! - neither the template parser nor the whole attribute expansion panics (a panicking proc macro
//!   leaves the user with "proc macro panicked" instead of a message at their key);
//! - a rejected template comes with a non-empty message;
//! - an accepted template re-serialises from its segments to exactly the text it was parsed from,
//!   with no empty or adjacent literals and no `<` / `>` left in a literal;
//! - an accepted template renders injectively with the runtime's own `KeyBuilder`: two different
//!   value tuples, including ones that move a separator from one value into the next, never
//!   render the same key.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proc_macro2::{Span, TokenStream};
use quote::quote;

// The macro crate's own modules, shared by every target.
include!("../macro_crate.rs");

use dlock_runtime::__private::KeyBuilder;
use template::Segment;

/// How many alternative value tuples one input may try, to keep each execution short.
const MAX_SPLITS: usize = 64;

// The input is plain text, so that seeds and crashes read as they are: the template, then the
// placeholder values, each after a NUL byte.
fuzz_target!(|data: &[u8]| {
    let mut parts = data.split(|&b| b == 0);
    let Ok(text) = std::str::from_utf8(parts.next().unwrap_or_default()) else {
        return;
    };
    let values: Vec<String> = parts
        .map(|part| String::from_utf8_lossy(part).into_owned())
        .collect();
    let values: Vec<&str> = values.iter().map(String::as_str).collect();
    check_expansion(text);
    match template::parse(text) {
        Err(message) => assert!(!message.is_empty(), "empty error for {text:?}"),
        Ok(segments) => {
            assert_eq!(serialise(&segments), text, "{segments:?}");
            check_shape(&segments);
            check_injective(&segments, &values);
        }
    }
});

/// The whole attribute, on a function whose parameters let placeholders reach field and tuple
/// paths, must expand (or report an error) without panicking.
fn check_expansion(text: &str) {
    let key = syn::LitStr::new(text, Span::call_site());
    let item: TokenStream = quote! {
        async fn handle(&self, a: &str, b: (u64, u64), c: Account) -> Result<(), AppError> {}
    };
    let _ = expand::distributed_lock(quote!(key = #key), item);
}

fn serialise(segments: &[Segment]) -> String {
    let mut text = String::new();
    for segment in segments {
        match segment {
            Segment::Literal(literal) => text.push_str(literal),
            Segment::Placeholder { root, path } => {
                text.push('<');
                text.push_str(root);
                for field in path {
                    text.push('.');
                    text.push_str(field);
                }
                text.push('>');
            }
        }
    }
    text
}

fn check_shape(segments: &[Segment]) {
    assert!(!segments.is_empty());
    for pair in segments.windows(2) {
        assert!(
            !matches!(pair, [Segment::Literal(_), Segment::Literal(_)]),
            "adjacent literals: {segments:?}"
        );
    }
    for segment in segments {
        match segment {
            Segment::Literal(literal) => {
                assert!(!literal.is_empty(), "empty literal: {segments:?}");
                assert!(
                    !literal.contains(['<', '>']),
                    "bracket in literal: {segments:?}"
                );
            }
            Segment::Placeholder { root, path } => {
                assert!(!root.is_empty(), "{segments:?}");
                assert!(path.iter().all(|field| !field.is_empty()), "{segments:?}");
            }
        }
    }
}

fn render(segments: &[Segment], values: &[String]) -> String {
    let mut builder = KeyBuilder::with_capacity(0);
    let mut values = values.iter();
    for segment in segments {
        match segment {
            Segment::Literal(literal) => builder.push_literal(literal),
            Segment::Placeholder { .. } => builder.push_display(values.next().unwrap()),
        }
    }
    builder.finish()
}

/// Checks that the fuzzer's values, and every re-split of them around the literal between two
/// placeholders, render different keys when they differ.
fn check_injective(segments: &[Segment], values: &[&str]) {
    let count = segments
        .iter()
        .filter(|s| matches!(s, Segment::Placeholder { .. }))
        .count();
    if count == 0 {
        return;
    }
    let value = |i: usize| values.get(i).copied().unwrap_or_default().to_owned();
    let first: Vec<String> = (0..count).map(value).collect();
    let second: Vec<String> = (count..2 * count).map(value).collect();
    let key = render(segments, &first);
    if first != second {
        assert_ne!(key, render(segments, &second), "{first:?} vs {second:?}");
    }
    // The attack escaping must defeat: `<a>-<b>` with ("x-y", "z") and ("x", "y-z"). For each
    // pair of neighbouring placeholders, split "value, literal, value" at every other occurrence
    // of the literal between them.
    let mut tries = 0;
    let mut placeholder = 0;
    for (i, segment) in segments.iter().enumerate() {
        if !matches!(segment, Segment::Placeholder { .. }) {
            continue;
        }
        let between = match (segments.get(i + 1), segments.get(i + 2)) {
            (Some(Segment::Placeholder { .. }), _) => "",
            (Some(Segment::Literal(text)), Some(Segment::Placeholder { .. })) => text.as_str(),
            _ => {
                placeholder += 1;
                continue;
            }
        };
        let joined = format!("{}{between}{}", first[placeholder], first[placeholder + 1]);
        let original = first[placeholder].len();
        for cut in (0..=joined.len()).filter(|&cut| {
            cut != original && joined.is_char_boundary(cut) && joined[cut..].starts_with(between)
        }) {
            tries += 1;
            if tries > MAX_SPLITS {
                return;
            }
            let mut other = first.clone();
            other[placeholder] = joined[..cut].to_owned();
            other[placeholder + 1] = joined[cut + between.len()..].to_owned();
            assert_ne!(key, render(segments, &other), "{first:?} vs {other:?}");
        }
        placeholder += 1;
    }
}
