//! Key rendering: literal text as written, placeholder values percent-encoded so that rendering
//! is injective.

use std::fmt::{self, Write};

/// Bytes a rendered value keeps as they are. Everything else becomes `%XX`, so a value can never
/// forge the separator that parts it from the next one, and `%` itself is always an escape.
fn is_unescaped(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'@')
}

/// Builds a key from a template's pieces. Used by the code `#[distributed_lock]` generates.
#[derive(Debug, Default)]
pub struct KeyBuilder {
    key: String,
}

impl KeyBuilder {
    /// A builder with room for `capacity` bytes.
    pub fn with_capacity(capacity: usize) -> Self {
        KeyBuilder {
            key: String::with_capacity(capacity),
        }
    }

    /// Appends template text as written.
    pub fn push_literal(&mut self, text: &str) {
        self.key.push_str(text);
    }

    /// Appends `value`'s `Display` form, percent-encoded.
    pub fn push_display<T: fmt::Display + ?Sized>(&mut self, value: &T) {
        // Writing into a String cannot fail; a `Display` impl that reports an error anyway leaves
        // what it wrote so far, which is still an injective encoding of that text.
        let _ = write!(Escaper(&mut self.key), "{value}");
    }

    /// The rendered key.
    pub fn finish(self) -> String {
        self.key
    }
}

/// A `fmt::Write` that percent-encodes what passes through it.
struct Escaper<'a>(&'a mut String);

impl Write for Escaper<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        let out = &mut *self.0;
        let mut clean_from = 0;
        for (i, &byte) in s.as_bytes().iter().enumerate() {
            if !is_unescaped(byte) {
                // Unescaped bytes are ASCII, so a non-empty clean run starts and ends on char
                // boundaries; an empty one may sit inside a multi-byte char and is skipped.
                if clean_from < i {
                    out.push_str(&s[clean_from..i]);
                }
                out.push('%');
                out.push(HEX[usize::from(byte >> 4)] as char);
                out.push(HEX[usize::from(byte & 0xF)] as char);
                clean_from = i + 1;
            }
        }
        if clean_from < s.len() {
            out.push_str(&s[clean_from..]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::KeyBuilder;

    fn render(values: &[&str]) -> String {
        let mut builder = KeyBuilder::with_capacity(0);
        builder.push_literal("acct:");
        for (i, value) in values.iter().enumerate() {
            if i > 0 {
                builder.push_literal(":");
            }
            builder.push_display(value);
        }
        builder.finish()
    }

    /// A value whose `Display` writes `text` in pieces cut at the given char boundaries.
    struct Pieces<'a>(&'a str, Vec<usize>);

    impl std::fmt::Display for Pieces<'_> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            let mut from = 0;
            for &cut in &self.1 {
                f.write_str(&self.0[from..cut])?;
                from = cut;
            }
            f.write_str(&self.0[from..])
        }
    }

    /// What rendering must produce for `value`: one byte per readable byte, `%XX` per other.
    fn expected_len(value: &str) -> usize {
        value
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-_.@".contains(&b) {
                    1
                } else {
                    3
                }
            })
            .sum()
    }

    #[test]
    fn a_megabyte_value_renders_whole() {
        let value = "é:".repeat(350_000);
        let key = render(&[&value]);
        assert_eq!(key.len(), "acct:".len() + 9 * 350_000);
        assert!(key.ends_with("%C3%A9%3A"));
    }

    #[test]
    fn escapes_everything_but_the_readable_set() {
        assert_eq!(render(&["a:b"]), "acct:a%3Ab");
        assert_eq!(render(&["100%"]), "acct:100%25");
        assert_eq!(render(&["user-1_x.y@z"]), "acct:user-1_x.y@z");
        assert_eq!(render(&["é /"]), "acct:%C3%A9%20%2F");
    }

    proptest! {
        #[test]
        fn rendering_is_injective(a in proptest::collection::vec(".*", 1..4), b in proptest::collection::vec(".*", 1..4)) {
            let ra: Vec<&str> = a.iter().map(String::as_str).collect();
            let rb: Vec<&str> = b.iter().map(String::as_str).collect();
            prop_assert_eq!(render(&ra) == render(&rb), a == b);
        }

        #[test]
        fn rendered_values_are_printable_ascii(value in any::<String>()) {
            let key = render(&[&value]);
            prop_assert!(key.bytes().all(|b| b.is_ascii_graphic()));
            prop_assert!(key.len() <= "acct:".len() + 3 * value.len());
        }

        #[test]
        fn rendered_length_is_exact_so_nothing_is_ever_cut(value in any::<String>()) {
            prop_assert_eq!(render(&[&value]).len(), "acct:".len() + expected_len(&value));
        }

        #[test]
        fn escaping_does_not_depend_on_how_display_splits_its_output(
            value in any::<String>(),
            cuts in proptest::collection::vec(any::<proptest::sample::Index>(), 0..6),
        ) {
            let boundaries: Vec<usize> =
                value.char_indices().map(|(i, _)| i).chain([value.len()]).collect();
            let mut cuts: Vec<usize> = cuts.iter().map(|c| *c.get(&boundaries)).collect();
            cuts.sort_unstable();
            let mut builder = KeyBuilder::with_capacity(0);
            builder.push_literal("acct:");
            builder.push_display(&Pieces(&value, cuts));
            prop_assert_eq!(builder.finish(), render(&[&value]));
        }

        #[test]
        fn near_collisions_stay_apart(value in "[a-z:%]{0,6}") {
            // "a:b" split as one value must differ from "a" and "b" as two.
            if let Some((head, tail)) = value.split_once(':') {
                prop_assert_ne!(render(&[&value]), render(&[head, tail]));
            }
        }
    }
}
