//! How a statement goes to the server: as a named prepared statement with its values bound
//! (sqlx's extended protocol, the default), or as plain SQL with its values written in as
//! literals (the simple query protocol), for a connection pooler that cannot follow prepared
//! statements from one server connection to another.
//!
//! Writing values into SQL is safe here because the backend chooses every value it sends:
//! numbers, booleans, keys (bytes, written in hex), owner tokens and its own table names. Text
//! is written as an escape string (`E'…'`), whose reading does not depend on the server's
//! `standard_conforming_strings`, and must be ASCII, so no client encoding can read it another
//! way. (The statements are then in sqlx's statement log with their values, keys in hex: the
//! backend's own pool logs none in this mode.)

use std::fmt::Write as _;
use std::sync::Arc;

use sqlx::postgres::{PgRow, Postgres};
use sqlx::{AssertSqlSafe, Executor};

use crate::backend::sql::ROW_LOCK_PATIENCE_S;

/// How the backend sends its statements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Protocol {
    /// Named prepared statements, parsed once per connection and then only bound and executed.
    Prepared,
    /// One simple query per statement, its values written into the SQL: nothing outlives the
    /// statement on the server connection, so any pooler can lend each to another client.
    Simple,
}

impl Protocol {
    /// The protocol of a backend that uses prepared statements or not.
    pub(super) fn prepared(prepared: bool) -> Protocol {
        if prepared {
            Protocol::Prepared
        } else {
            Protocol::Simple
        }
    }
}

/// What a simple query runs before its statement. A query of several statements runs as one
/// transaction, so these settings last for that statement alone and never stay on a server
/// connection a pooler lends to other clients next:
///
/// - the lock timeout a prepared backend's own connections set once for their session (see
///   `ROW_LOCK_PATIENCE_S`);
/// - `bytea` written in hex, which sqlx reads from a simple query's rows (they come as text)
///   whatever the server's or the role's `bytea_output` says.
fn simple_preamble() -> String {
    format!("SET LOCAL lock_timeout = '{ROW_LOCK_PATIENCE_S}s'; SET LOCAL bytea_output = 'hex'; ")
}

/// One of the backend's statements: SQL with `$1`, `$2`… placeholders, and how it is sent.
pub(super) struct Statement {
    sql: Arc<str>,
    protocol: Protocol,
}

impl Statement {
    pub(super) fn new(sql: String, protocol: Protocol) -> Statement {
        Statement {
            sql: Arc::from(sql),
            protocol,
        }
    }

    /// The statement with no values yet, to [`bind`](Query::bind) them in placeholder order.
    pub(super) fn query<'a>(&self) -> Query<'a> {
        Query {
            sql: self.sql.clone(),
            protocol: self.protocol,
            values: Vec::new(),
        }
    }
}

/// A value a statement takes: the kinds the backend sends.
#[derive(Clone, Copy, Debug)]
pub(super) enum Value<'a> {
    Bytes(&'a [u8]),
    Text(&'a str),
    BigInt(Option<i64>),
    Bool(bool),
    BytesArray(&'a [Vec<u8>]),
    TextArray(&'a [String]),
    BigIntArray(&'a [i64]),
}

impl<'a> From<&'a [u8]> for Value<'a> {
    fn from(value: &'a [u8]) -> Self {
        Value::Bytes(value)
    }
}

impl<'a> From<&'a str> for Value<'a> {
    fn from(value: &'a str) -> Self {
        Value::Text(value)
    }
}

impl From<i64> for Value<'_> {
    fn from(value: i64) -> Self {
        Value::BigInt(Some(value))
    }
}

impl From<Option<i64>> for Value<'_> {
    fn from(value: Option<i64>) -> Self {
        Value::BigInt(value)
    }
}

impl From<bool> for Value<'_> {
    fn from(value: bool) -> Self {
        Value::Bool(value)
    }
}

impl<'a> From<&'a [Vec<u8>]> for Value<'a> {
    fn from(value: &'a [Vec<u8>]) -> Self {
        Value::BytesArray(value)
    }
}

impl<'a> From<&'a [String]> for Value<'a> {
    fn from(value: &'a [String]) -> Self {
        Value::TextArray(value)
    }
}

impl<'a> From<&'a [i64]> for Value<'a> {
    fn from(value: &'a [i64]) -> Self {
        Value::BigIntArray(value)
    }
}

/// A statement with its values, sent as its [`Protocol`] says.
pub(super) struct Query<'a> {
    sql: Arc<str>,
    protocol: Protocol,
    values: Vec<Value<'a>>,
}

impl<'a> Query<'a> {
    /// A statement not among a backend's [`Statement`]s (those it runs once, when it connects).
    pub(super) fn once(sql: impl Into<Arc<str>>, protocol: Protocol) -> Query<'a> {
        Query {
            sql: sql.into(),
            protocol,
            values: Vec::new(),
        }
    }

    /// Adds the value of the next placeholder.
    pub(super) fn bind(mut self, value: impl Into<Value<'a>>) -> Self {
        self.values.push(value.into());
        self
    }

    /// Runs the statement; every row it answers.
    pub(super) async fn fetch_all<'e, E>(self, executor: E) -> Result<Vec<PgRow>, sqlx::Error>
    where
        E: Executor<'e, Database = Postgres>,
        'a: 'e,
    {
        match self.protocol {
            Protocol::Prepared => self.prepared().fetch_all(executor).await,
            Protocol::Simple => sqlx::raw_sql(self.simple()?).fetch_all(executor).await,
        }
    }

    /// Runs the statement; its first row (an error where it answers none).
    pub(super) async fn fetch_one<'e, E>(self, executor: E) -> Result<PgRow, sqlx::Error>
    where
        E: Executor<'e, Database = Postgres>,
        'a: 'e,
    {
        match self.protocol {
            Protocol::Prepared => self.prepared().fetch_one(executor).await,
            Protocol::Simple => sqlx::raw_sql(self.simple()?).fetch_one(executor).await,
        }
    }

    /// Runs the statement for its effect.
    pub(super) async fn execute<'e, E>(self, executor: E) -> Result<(), sqlx::Error>
    where
        E: Executor<'e, Database = Postgres>,
        'a: 'e,
    {
        match self.protocol {
            Protocol::Prepared => self.prepared().execute(executor).await.map(drop),
            Protocol::Simple => sqlx::raw_sql(self.simple()?)
                .execute(executor)
                .await
                .map(drop),
        }
    }

    /// The statement prepared, its values bound.
    fn prepared(self) -> sqlx::query::Query<'a, Postgres, sqlx::postgres::PgArguments> {
        let mut query = sqlx::query(AssertSqlSafe(self.sql));
        for value in self.values {
            query = match value {
                Value::Bytes(bytes) => query.bind(bytes),
                Value::Text(text) => query.bind(text),
                Value::BigInt(number) => query.bind(number),
                Value::Bool(flag) => query.bind(flag),
                Value::BytesArray(keys) => query.bind(keys),
                Value::TextArray(texts) => query.bind(texts),
                Value::BigIntArray(numbers) => query.bind(numbers),
            };
        }
        query
    }

    /// The simple query's text: the [preamble](simple_preamble), then the statement with its
    /// values written in.
    fn simple(&self) -> Result<AssertSqlSafe<String>, sqlx::Error> {
        let statement = inline(&self.sql, &self.values).map_err(sqlx::Error::Encode)?;
        Ok(AssertSqlSafe(simple_preamble() + &statement))
    }
}

/// `sql` with each placeholder `$n` replaced by the literal of `values[n - 1]`. One pass from
/// left to right, reading each placeholder's digits whole: `$1` never matches the start of
/// `$10`, and a literal written in is never read again. Every value must be used.
///
/// The backend's statements hold no `$` but their placeholders (no dollar quoting, no `$` in
/// a string), which is what lets a plain scan find them.
fn inline(sql: &str, values: &[Value<'_>]) -> Result<String, sqlx::error::BoxDynError> {
    let mut out = String::with_capacity(sql.len() + 64);
    let mut used = vec![false; values.len()];
    let mut rest = sql;
    while let Some(dollar) = rest.find('$') {
        out.push_str(&rest[..dollar]);
        let after = &rest[dollar + 1..];
        let digits = after
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(after.len());
        if digits == 0 {
            return Err(format!("a `$` that is not a placeholder in: {sql}").into());
        }
        let index: usize = after[..digits].parse()?;
        let value = index
            .checked_sub(1)
            .and_then(|at| values.get(at))
            .ok_or_else(|| format!("no value for ${index} ({} given)", values.len()))?;
        write_literal(&mut out, value)?;
        used[index - 1] = true;
        rest = &after[digits..];
    }
    out.push_str(rest);
    if let Some(unused) = used.iter().position(|used| !used) {
        return Err(format!("${} has a value but no placeholder", unused + 1).into());
    }
    Ok(out)
}

/// Writes `value` as a literal of its own type, cast so that the statement reads it as the
/// prepared statement's parameter of that type.
fn write_literal(out: &mut String, value: &Value<'_>) -> Result<(), String> {
    match *value {
        Value::Bytes(bytes) => write_bytes(out, bytes),
        Value::Text(text) => write_text(out, text)?,
        Value::BigInt(number) => write_bigint(out, number),
        Value::Bool(flag) => out.push_str(if flag { "true" } else { "false" }),
        Value::BytesArray(keys) => {
            write_array(out, keys, "bytea", |out, key| {
                write_bytes(out, key);
                Ok(())
            })?;
        }
        Value::TextArray(texts) => {
            write_array(out, texts, "text", |out, text| write_text(out, text))?
        }
        Value::BigIntArray(numbers) => write_array(out, numbers, "bigint", |out, number| {
            write_bigint(out, Some(*number));
            Ok(())
        })?,
    }
    Ok(())
}

/// `E'\\x6b6579'::bytea`: the bytes in hex, never as text.
fn write_bytes(out: &mut String, bytes: &[u8]) {
    out.push_str("E'\\\\x");
    for byte in bytes {
        let _ = write!(out, "{byte:02x}");
    }
    out.push_str("'::bytea");
}

/// `E'it''s'::text`, with `'` and `\` escaped. ASCII only (the backend's text values are its
/// own hex tokens and table names): in a client encoding such as SJIS the second byte of a
/// multibyte character can be a backslash, which would eat the escaping after it. A NUL byte
/// would end the query on the wire (and no PostgreSQL text can hold one).
fn write_text(out: &mut String, text: &str) -> Result<(), String> {
    if !text.is_ascii() || text.contains('\0') {
        return Err("a text value written into SQL must be ASCII without NUL bytes".into());
    }
    out.push_str("E'");
    for c in text.chars() {
        match c {
            '\'' => out.push_str("''"),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push_str("'::text");
    Ok(())
}

/// `(-5)::bigint`, or `NULL::bigint`. In parentheses, so that a sign never meets an operator
/// before it (`x-$1` must not become the comment `x--5`), and `i64::MIN`, read as a numeric
/// constant first, still fits.
fn write_bigint(out: &mut String, number: Option<i64>) {
    match number {
        Some(number) => {
            let _ = write!(out, "({number})::bigint");
        }
        None => out.push_str("NULL::bigint"),
    }
}

/// `ARRAY[…]::type[]`, each element written by `element`; empty, still typed.
fn write_array<T>(
    out: &mut String,
    elements: &[T],
    type_name: &str,
    mut element: impl FnMut(&mut String, &T) -> Result<(), String>,
) -> Result<(), String> {
    out.push_str("ARRAY[");
    for (at, value) in elements.iter().enumerate() {
        if at > 0 {
            out.push_str(", ");
        }
        element(out, value)?;
    }
    let _ = write!(out, "]::{type_name}[]");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{inline, simple_preamble, Value};

    #[test]
    fn placeholders_are_replaced_by_typed_literals_whole() {
        let values: Vec<Value<'_>> = (1..=10).map(|n| Value::from(n as i64 * 100)).collect();
        let sql = "SELECT $1, $10, $2+$3, $4$5 $6 $7 $8 $9";
        assert_eq!(
            inline(sql, &values).unwrap(),
            "SELECT (100)::bigint, (1000)::bigint, (200)::bigint+(300)::bigint, \
             (400)::bigint(500)::bigint (600)::bigint (700)::bigint (800)::bigint (900)::bigint"
        );
        // A placeholder used twice takes one value.
        assert_eq!(
            inline("$1 = $1", &[Value::Bool(true)]).unwrap(),
            "true = true"
        );
    }

    #[test]
    fn keys_are_hex_bytes_and_text_is_escaped() {
        let key: &[u8] = b"k'\\\0\xff";
        let sql = inline(
            "WHERE lock_key = $1 AND owner = $2",
            &[key.into(), "o'w\\ner".into()],
        )
        .unwrap();
        assert_eq!(
            sql,
            "WHERE lock_key = E'\\\\x6b275c00ff'::bytea AND owner = E'o''w\\\\ner'::text"
        );
        assert!(inline("$1", &["a\0b".into()]).is_err());
        // Not ASCII: a client encoding could read a byte of it as a backslash.
        assert!(inline("$1", &["\u{c1}\\'".into()]).is_err());
    }

    #[test]
    fn numbers_null_and_negative_stay_one_operand() {
        let values = [Value::BigInt(None), i64::MIN.into(), i64::MAX.into()];
        assert_eq!(
            inline("$1 IS NULL, x-$2, $3", &values).unwrap(),
            "NULL::bigint IS NULL, x-(-9223372036854775808)::bigint, (9223372036854775807)::bigint"
        );
    }

    #[test]
    fn arrays_are_typed_even_when_empty() {
        let keys = [b"a".to_vec(), Vec::new()];
        let owners = ["o1".to_owned(), "it's".to_owned()];
        let ttls = [1_i64, -2];
        let values = [
            Value::from(&keys[..]),
            Value::from(&owners[..]),
            Value::from(&ttls[..]),
            Value::from(&[][..] as &[Vec<u8>]),
        ];
        assert_eq!(
            inline("unnest($1, $2, $3), ANY($4)", &values).unwrap(),
            "unnest(ARRAY[E'\\\\x61'::bytea, E'\\\\x'::bytea]::bytea[], \
             ARRAY[E'o1'::text, E'it''s'::text]::text[], \
             ARRAY[(1)::bigint, (-2)::bigint]::bigint[]), ANY(ARRAY[]::bytea[])"
        );
    }

    #[test]
    fn a_placeholder_without_a_value_or_a_value_without_one_is_an_error() {
        assert!(inline("$1, $2", &[Value::Bool(true)]).is_err());
        assert!(inline("$0", &[Value::Bool(true)]).is_err());
        assert!(inline("$1", &[Value::Bool(true), Value::Bool(false)]).is_err());
        assert!(inline("a $ b", &[]).is_err());
    }

    #[test]
    fn the_preamble_sets_only_what_lasts_for_the_statement() {
        let preamble = simple_preamble();
        for setting in preamble.split(';').filter(|s| !s.trim().is_empty()) {
            assert!(setting.trim().starts_with("SET LOCAL "), "{setting}");
        }
    }
}
