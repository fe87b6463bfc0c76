//! The key template: literal text with `<param>` / `<param.field.field>` placeholders.
//!
//! Parsing is independent of the function; checking the placeholders against its parameters is
//! done by `expand`, which knows them.

/// One piece of a key template.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Segment {
    /// Text copied into the key as written.
    Literal(String),
    /// A value rendered with `Display` and percent-encoded: `root.path[0].path[1]…`.
    Placeholder { root: String, path: Vec<String> },
}

/// The characters that escaping leaves as they are; everything else in a rendered value becomes
/// `%XX`. Must agree with `dlock_runtime::key`.
fn is_unescaped(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@')
}

/// Parses `text`, or says what is wrong and how to fix it.
pub(crate) fn parse(text: &str) -> Result<Vec<Segment>, String> {
    if text.is_empty() {
        return Err("empty key; give the lock a name, e.g. key = \"order:<order_id>\"".into());
    }
    let mut segments = Vec::new();
    let mut literal = String::new();
    let mut chars = text.char_indices();
    while let Some((start, c)) = chars.next() {
        match c {
            '>' => {
                return Err(format!(
                    "stray `>` at byte {start} of the key; placeholders are written `<param>`"
                ))
            }
            '<' => {
                let body_start = start + 1;
                let Some(len) = text[body_start..].find(['>', '<']) else {
                    return Err(format!(
                        "unclosed `<` at byte {start} of the key; close the placeholder: `<param>`"
                    ));
                };
                if text.as_bytes()[body_start + len] == b'<' {
                    return Err(format!(
                        "unclosed `<` at byte {start} of the key; close the placeholder before the next `<`"
                    ));
                }
                let body = &text[body_start..body_start + len];
                for _ in 0..=body.chars().count() {
                    chars.next();
                }
                if body.is_empty() {
                    return Err("empty placeholder `<>`; name a parameter: `<param>`".into());
                }
                if !literal.is_empty() {
                    segments.push(Segment::Literal(std::mem::take(&mut literal)));
                }
                segments.push(parse_placeholder(body)?);
            }
            _ => literal.push(c),
        }
    }
    if !literal.is_empty() {
        segments.push(Segment::Literal(literal));
    }
    check_separators(&segments)?;
    Ok(segments)
}

fn parse_placeholder(body: &str) -> Result<Segment, String> {
    let mut parts = body.split('.');
    let root = parts.next().unwrap_or_default();
    // Exactly the identifiers Rust's lexer takes (`char::is_alphabetic` also takes marks such as
    // U+0345, which no identifier may start with), bar `_`, which names nothing; and tuple
    // indices that fit the `u32` a field index is. Anything else would reach `Ident::new` in
    // `expand` and panic instead of giving this message.
    let is_ident = |s: &str| {
        let mut cs = s.chars();
        s != "_"
            && cs
                .next()
                .is_some_and(|c| c == '_' || unicode_ident::is_xid_start(c))
            && cs.all(unicode_ident::is_xid_continue)
    };
    let is_field = |s: &str| {
        is_ident(s) || (s.bytes().all(|b| b.is_ascii_digit()) && s.parse::<u32>().is_ok())
    };
    let path: Vec<String> = parts.map(str::to_owned).collect();
    if !is_ident(root) || !path.iter().all(|p| is_field(p)) {
        return Err(format!(
            "`<{body}>` is not a placeholder; write a parameter name, optionally with fields: `<param>` or `<param.field>`"
        ));
    }
    Ok(Segment::Placeholder {
        root: root.to_owned(),
        path,
    })
}

/// Two placeholders must be parted by a character that escaping never produces, or two argument
/// tuples could render one key (`<a><b>`: "ab","" and "a","b").
fn check_separators(segments: &[Segment]) -> Result<(), String> {
    for window in segments.windows(2).chain(segments.windows(3)) {
        let separated = match window {
            [Segment::Placeholder { .. }, Segment::Placeholder { .. }] => false,
            [Segment::Placeholder { .. }, Segment::Literal(text), Segment::Placeholder { .. }] => {
                text.chars().any(|c| !is_unescaped(c) && c != '%')
            }
            _ => true,
        };
        if !separated {
            return Err(
                "two placeholders need a separator between them that escaping never produces, such as `:` or `/` \
                 (e.g. \"<a>:<b>\"); otherwise different arguments could render the same key"
                    .into(),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use dlock_runtime::__private::KeyBuilder;
    use proptest::prelude::*;

    use super::{parse, Segment};

    fn lit(s: &str) -> Segment {
        Segment::Literal(s.into())
    }
    fn ph(root: &str, path: &[&str]) -> Segment {
        Segment::Placeholder {
            root: root.into(),
            path: path.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn parses_literals_and_placeholders() {
        assert_eq!(
            parse("acct:<open_id>").unwrap(),
            vec![lit("acct:"), ph("open_id", &[])]
        );
        assert_eq!(
            parse("<self.user.id>:x:<n.0>!").unwrap(),
            vec![
                ph("self", &["user", "id"]),
                lit(":x:"),
                ph("n", &["0"]),
                lit("!")
            ]
        );
        assert_eq!(parse("static").unwrap(), vec![lit("static")]);
        assert_eq!(
            parse("ключ:<id>").unwrap(),
            vec![lit("ключ:"), ph("id", &[])]
        );
        assert_eq!(
            parse("<ключ._x.4294967295>").unwrap(),
            vec![ph("ключ", &["_x", "4294967295"])]
        );
    }

    #[test]
    fn rejects_each_malformed_template() {
        let cases = [
            ("", "empty key"),
            ("a:<>", "empty placeholder"),
            ("a:<id", "unclosed `<`"),
            ("a:<id:<x>", "unclosed `<`"),
            ("a>b", "stray `>`"),
            ("<a b>", "not a placeholder"),
            ("<a.>", "not a placeholder"),
            ("<1a>", "not a placeholder"),
            ("<a><b>", "separator"),
            // Regressions: these passed and made the expansion panic (see `fuzz/`).
            ("<b.4294967296>", "not a placeholder"),
            ("<b.\u{345}>", "not a placeholder"),
            ("<\u{345}>", "not a placeholder"),
            ("<_>", "not a placeholder"),
            ("<b._>", "not a placeholder"),
            ("<a>-x<b>", "separator"),
            ("<a>%<b>", "separator"),
        ];
        for (template, expected) in cases {
            let err = parse(template).unwrap_err();
            assert!(err.contains(expected), "{template:?}: {err}");
        }
    }

    #[test]
    fn accepts_separated_placeholders() {
        assert!(parse("<a>:<b>").is_ok());
        assert!(parse("<a>/x/<b>").is_ok());
    }

    /// The template text back from its segments.
    fn serialise(segments: &[Segment]) -> String {
        segments
            .iter()
            .map(|segment| match segment {
                Segment::Literal(text) => text.clone(),
                Segment::Placeholder { root, path } => {
                    let fields: String = path.iter().map(|f| format!(".{f}")).collect();
                    format!("<{root}{fields}>")
                }
            })
            .collect()
    }

    /// Renders `segments` the way the generated code does, with `values` for the placeholders.
    fn render(segments: &[Segment], values: &[String]) -> String {
        let mut builder = KeyBuilder::with_capacity(0);
        let mut values = values.iter();
        for segment in segments {
            match segment {
                Segment::Literal(text) => builder.push_literal(text),
                Segment::Placeholder { .. } => builder.push_display(values.next().unwrap()),
            }
        }
        builder.finish()
    }

    /// The value tuples that differ from `values` only in where the literal between two
    /// neighbouring placeholders falls: their raw concatenations equal that of `values`.
    fn resplits(segments: &[Segment], values: &[String]) -> Vec<Vec<String>> {
        let mut found = Vec::new();
        let mut index = 0;
        for (i, segment) in segments.iter().enumerate() {
            if !matches!(segment, Segment::Placeholder { .. }) {
                continue;
            }
            if let (Some(Segment::Literal(between)), Some(Segment::Placeholder { .. })) =
                (segments.get(i + 1), segments.get(i + 2))
            {
                let joined = format!("{}{between}{}", values[index], values[index + 1]);
                for (cut, _) in joined.match_indices(between.as_str()) {
                    if cut != values[index].len() {
                        let mut other = values.to_vec();
                        other[index] = joined[..cut].to_owned();
                        other[index + 1] = joined[cut + between.len()..].to_owned();
                        found.push(other);
                    }
                }
            }
            index += 1;
        }
        found
    }

    /// Templates made of pieces that matter to the separator rule: characters escaping keeps
    /// (`-`, `.`, `@`, letters), `%`, which escaping produces, and real separators.
    fn template() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("<a>"),
            Just("<b.0>"),
            Just("<c.x>"),
            Just(":"),
            Just("/"),
            Just("-"),
            Just("."),
            Just("@"),
            Just("%"),
            Just("%3A"),
            Just("x"),
            Just("é"),
            Just(" "),
        ];
        proptest::collection::vec(piece, 1..7).prop_map(|pieces| pieces.concat())
    }

    /// Values over an alphabet that collides easily with the pieces above once concatenated.
    fn values() -> impl Strategy<Value = Vec<String>> {
        proptest::collection::vec("[a:%3A/.-]{0,4}", 6)
    }

    proptest! {
        #[test]
        fn accepted_templates_render_injectively(
            text in template(),
            first in values(),
            second in values(),
        ) {
            if let Ok(segments) = parse(&text) {
                let count = segments
                    .iter()
                    .filter(|s| matches!(s, Segment::Placeholder { .. }))
                    .count();
                let (first, second) = (&first[..count], &second[..count]);
                let key = render(&segments, first);
                prop_assert_eq!(
                    key == render(&segments, second),
                    first == second,
                    "{:?} with {:?} and {:?}", text, first, second
                );
                // Random tuples seldom collide; the attack escaping must defeat is moving the
                // text between two placeholders into a value: `<a>-<b>` with ("x-y", "z") and
                // ("x", "y-z"). Try every such re-split.
                for other in resplits(&segments, first) {
                    prop_assert_ne!(&key, &render(&segments, &other), "{:?}: {:?} vs {:?}", text, first, other);
                }
            }
        }

        #[test]
        fn parsing_never_panics_and_round_trips(text in prop_oneof![template(), any::<String>(), "[<>a-c.:_0-9%]{0,12}"]) {
            match parse(&text) {
                Ok(segments) => prop_assert_eq!(serialise(&segments), text),
                Err(message) => prop_assert!(!message.is_empty()),
            }
        }
    }
}
