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
            && cs.next().is_some_and(|c| c == '_' || unicode_ident::is_xid_start(c))
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
            // Found by the `key_template` fuzz target (they made the expansion panic).
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
}
