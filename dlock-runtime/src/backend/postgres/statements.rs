//! The statements, with the table's name and channel filled in once.

use std::sync::Arc;

/// The database's clock in microseconds since the epoch: the floor of a fresh row's fence.
const NOW_US: &str = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint";

/// The statements of one table. Its name is checked by `quote_table` before it is spliced in,
/// and the channel is that name (letters, digits, `_`, `.`), which is what makes them safe to
/// assert as SQL.
pub(super) struct Statements {
    pub(super) table: String,
    /// `$1` key, `$2` owner, `$3` ttl in µs → (fence if granted, holder's µs left if busy).
    pub(super) acquire: Arc<str>,
    /// `$1` key, `$2` owner → one row where it released (and notified).
    pub(super) release: Arc<str>,
    /// `$1` keys, `$2` owners, `$3` ttls in µs → the (key, owner) pairs renewed.
    pub(super) renew: Arc<str>,
}

impl Statements {
    pub(super) fn new(table: String, channel: &str) -> Statements {
        // The outer query reads the row as it was before the statement: the holder's, when the
        // key was busy. (Data-modifying parts of a statement are invisible to its other parts.)
        let acquire = format!(
            "WITH attempt AS ( \
               INSERT INTO {table} AS held (lock_key, owner, fence, expires_at, created_at) \
               VALUES ($1, $2, {NOW_US}, clock_timestamp() + $3 * interval '1 microsecond', clock_timestamp()) \
               ON CONFLICT (lock_key) DO UPDATE SET owner = excluded.owner, \
                 fence = GREATEST(held.fence + 1, excluded.fence), \
                 expires_at = excluded.expires_at, created_at = excluded.created_at \
               WHERE held.expires_at <= clock_timestamp() OR held.owner = excluded.owner \
               RETURNING fence) \
             SELECT (SELECT fence FROM attempt), \
               (SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint \
                FROM {table} WHERE lock_key = $1)"
        );
        let release = format!(
            "WITH released AS (DELETE FROM {table} WHERE lock_key = $1 AND owner = $2 RETURNING lock_key) \
             SELECT pg_notify('{channel}', encode(lock_key, 'hex')) FROM released"
        );
        let renew = format!(
            "UPDATE {table} AS held SET expires_at = clock_timestamp() + lease.ttl_us * interval '1 microsecond' \
             FROM unnest($1::bytea[], $2::text[], $3::bigint[]) AS lease(lock_key, owner, ttl_us) \
             WHERE held.lock_key = lease.lock_key AND held.owner = lease.owner \
               AND held.expires_at > clock_timestamp() \
             RETURNING held.lock_key, held.owner"
        );
        Statements {
            acquire: Arc::from(acquire),
            release: Arc::from(release),
            renew: Arc::from(renew),
            table,
        }
    }
}
