//! The statements, with the table's name and channel filled in once.

use sqlx::postgres::PgPool;
use sqlx::Row;

use super::query::{Protocol, Query, Statement};
use crate::backend::description::LIST_PAGE;
use crate::inspect::bounded;
use crate::LockError;

/// The database's clock in microseconds since the epoch: the floor of a fresh row's fence.
const NOW_US: &str = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint";

/// The statements of one table and its waiters table. Their names are checked by
/// `quote_table` before they are spliced in, and the channel is `dlock_` and hex digits (see
/// [`resolve_channel`]), which is what makes them safe to assert as SQL.
pub(super) struct Statements {
    pub(super) table: String,
    /// The channel releases are announced on.
    pub(super) channel: String,
    /// `$1` key, `$2` owner, `$3` ttl in µs, `$4` this backend's waiter name, `$5` whether the
    /// caller waits (it may then take a place in line when busy), `$6` how long that place
    /// lasts in µs, `$7` whether to take a place whatever (the caller lost a race before),
    /// `$8` whether other waiters of this backend wait behind the caller (granted, a place of
    /// this backend's is then kept, its ticket taken anew, rather than given up), `$9` the
    /// greatest fence of this acquisition's grants that were withdrawn, 0 where none was (a
    /// re-grant to the same owner keeps the row's fence only where it is greater), `$10` the
    /// label (where `described`) → (fence if
    /// granted; if busy: the holder's µs left, the µs until the first waiter ahead lets its
    /// place lapse; whether this backend holds a place now).
    pub(super) acquire: Statement,
    /// `$1` key, `$2` owner, `$3` fence or null → one row where it released (and notified).
    pub(super) release: Statement,
    /// `$1` key, `$2` owners → one row where it deleted the row of one of them (and notified).
    pub(super) release_any: Statement,
    /// `$1` key, `$2` owner, `$3` µs → one row where it set `owner`'s live row to expire `$3`
    /// from now (and notified), for a lease held at least until then (`expire_after`).
    pub(super) expire: Statement,
    /// `$1` key, `$2` owner → one row, the evicted fence, where it evicted `owner`'s live row
    /// (and notified), for an operator's `force_release`.
    pub(super) evict: Statement,
    /// `$1` key, `$2` owner, `$3` the owner to hand the key to (a waiter of this backend),
    /// `$4` its ttl in µs, `$5` this backend's waiter name, `$6` whether other waiters of this
    /// backend wait behind that one, `$7` how long a place lasts in µs, `$8` whether an earlier
    /// send of this hand-over went astray (it then takes over a row of the waiter's owner too),
    /// `$9` the waiter's label (where `described`) → (the new fence where it handed the key over; whether it released it instead, another
    /// process's waiter being ahead in line; whether this backend holds a place now).
    pub(super) hand_over: Statement,
    /// `$1` keys, `$2` owners, `$3` ttls in µs → the (key, owner) pairs renewed (`true`), and
    /// those still held but passed over, their rows locked by another transaction (`false`).
    pub(super) renew: Statement,
    /// `$1` waiter name, `$2` keys, `$3` how long the places last in µs, `$4` the keys this
    /// backend's heads wait for: keeps this backend's places in line for `$2` (those not lapsed
    /// meanwhile) → the keys of `$4` nobody holds now.
    pub(super) keep_places: Statement,
    /// `$1` key, `$2` waiter name: gives up this backend's place in line, announcing it as a
    /// release is (the waiters behind may take the key now).
    pub(super) leave: Statement,
    /// `$1` key, `$2` this backend's waiter name → one row: the number of other backends' live
    /// places in line for the key, and the key's live row if any (owner, fence, µs since the
    /// epoch it was acquired at, µs left, label, host, pid).
    pub(super) inspect: Statement,
    /// `$1` the first key → up to [`LIST_PAGE`] keys of live rows from it, in order.
    pub(super) list: Statement,
    /// `$1` the first key, `$2` the end of the range (not included) → as `list`.
    pub(super) list_to: Statement,
    /// Whether the table has the columns that describe a holder (label, host, pid), which the
    /// statements then write (the acquire's `$10` and the hand-over's `$9`, the label) and read.
    pub(super) described: bool,
}

impl Statements {
    /// The statements of `table` and `waiters`, its waiters table: one row per backend waiting
    /// for a key, its place in the line across processes (see `line`); sent by `protocol`.
    pub(super) fn new(
        table: String,
        waiters: &str,
        channel: &str,
        protocol: Protocol,
        described: bool,
    ) -> Statements {
        // The holder's description, written by the statement that grants the key: this
        // process's host and id written in (the same for every statement), the label bound.
        let (host, pid) = (host_literal(), std::process::id());
        let (acquire_columns, acquire_values, acquire_set, hand_over_set, read) = if described {
            (
                ", label, host, pid",
                format!(", $10::bytea, {host}, {pid}"),
                ", label = excluded.label, host = excluded.host, pid = excluded.pid",
                format!(", label = $9::bytea, host = {host}, pid = {pid}"),
                "held.label, held.host, held.pid",
            )
        } else {
            (
                "",
                String::new(),
                "",
                String::new(),
                "NULL::bytea, NULL::bytea, NULL::bigint",
            )
        };
        // Every part of a statement reads the tables as they were before it: `holder` is the
        // row of the holder when the key was busy. (Data-modifying parts of a statement are
        // invisible to its other parts.)
        //
        // The line across processes: a waiter of another backend whose place is live and
        // earlier than this backend's (or any such, where this backend has none) is `ahead`,
        // and keeps a free key from this try. A busy try takes a place where its caller lost a
        // race for the key before, where others are in line already, or where this backend
        // holds one (kept): a process alone at a key, whose waiters each find it busy once and
        // get it at the release, then writes nothing to the waiters table. Only the grant and
        // the place are written; the line never grants anything, so exclusion rests on the row
        // alone, as before. A retried acquire whose grant's answer was lost finds its own row
        // and is granted again, whoever queued meanwhile, and never moves its expiry back: the
        // first copy of a statement re-sent after a broken connection can land after the
        // second (held up on the server), or after a renewal, with the expiry it computed as
        // it began, earlier than the one the client counts from. Places that lapsed long ago
        // (their processes died) are swept by the try that gets the key: a refused try sweeping
        // too could deadlock with another refused try, each deleting the other's old place
        // before re-taking its own.
        //
        // A re-grant to the owner that holds the row is the same acquisition's: a copy of its
        // statement that arrives late (re-sent after a broken connection while the first copy
        // was held up on the server), or its next try after one of its grants was withdrawn
        // (by a try's claim window, or a hand-over it did not claim). A withdrawn grant is
        // undone by its fence. So the re-grant keeps the row's fence where it is greater than
        // every fence of the acquisition withdrawn (`$9`): a late copy then does not make the
        // undo of its grant miss, which would leave the row held by nobody until its ttl. A row
        // that still carries a withdrawn fence takes a new one: that grant's undo, perhaps
        // still on its way, must miss the grant the caller claims now. (Fences only grow; see
        // `sql::withdrawn_bound`.)
        //
        // A backend granted the key while more of its waiters wait for it keeps its place, with
        // a new ticket: it is back at the end of the line, and its next waiter need not lose a
        // race again to be in it. So processes with waiters take turns at a key.
        let line_at_acquire = line_ahead(waiters, "$4");
        let place_at_acquire = place_after_grant(waiters, "$4", "$8", "$6", "attempt");
        let acquire = format!(
            "WITH {line_at_acquire}, \
             attempt AS ( \
               INSERT INTO {table} AS held (lock_key, owner, fence, expires_at, created_at{acquire_columns}) \
               SELECT $1, $2, {NOW_US}, clock_timestamp() + $3 * interval '1 microsecond', clock_timestamp(){acquire_values} \
               WHERE (SELECT lapses FROM ahead) IS NULL \
                  OR EXISTS (SELECT 1 FROM {table} WHERE lock_key = $1 AND owner = $2) \
               ON CONFLICT (lock_key) DO UPDATE SET owner = excluded.owner, \
                 fence = CASE WHEN held.owner = excluded.owner AND held.fence > $9::bigint THEN held.fence \
                   ELSE GREATEST(held.fence + 1, excluded.fence) END, \
                 expires_at = CASE WHEN held.owner = excluded.owner \
                   THEN GREATEST(held.expires_at, excluded.expires_at) \
                   ELSE excluded.expires_at END, \
                 created_at = excluded.created_at{acquire_set} \
               WHERE held.owner = '' OR held.expires_at <= clock_timestamp() \
                  OR held.owner = excluded.owner \
               RETURNING fence), \
             {place_at_acquire}, \
             in_line AS ( \
               INSERT INTO {waiters} AS line (lock_key, waiter, ticket, expires_at) \
               SELECT $1, $4, {NOW_US}, clock_timestamp() + $6 * interval '1 microsecond' \
               WHERE $5 AND NOT EXISTS (SELECT 1 FROM attempt) \
                 AND ($7 OR EXISTS (SELECT 1 FROM mine) OR (SELECT lapses FROM ahead) IS NOT NULL) \
               ON CONFLICT (lock_key, waiter) DO UPDATE SET \
                 ticket = CASE WHEN line.expires_at > clock_timestamp() THEN line.ticket ELSE excluded.ticket END, \
                 expires_at = excluded.expires_at \
               RETURNING 1), \
             swept AS ( \
               DELETE FROM {waiters} WHERE lock_key = $1 AND waiter <> $4 \
                 AND expires_at <= clock_timestamp() - interval '1 minute' \
                 AND EXISTS (SELECT 1 FROM attempt)) \
             SELECT (SELECT fence FROM attempt), \
               (SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint \
                FROM {table} WHERE lock_key = $1 AND owner <> ''), \
               (SELECT (extract(epoch FROM lapses - clock_timestamp()) * 1000000)::bigint FROM ahead), \
               EXISTS (SELECT 1 FROM in_line) OR EXISTS (SELECT 1 FROM requeued)"
        );
        // A row owned by nobody is free whatever its expiry says (the database's clock may have
        // stepped back since), in every statement that reads rows.
        //
        // A release keeps the row, expired and owned by nobody (no owner is empty), as an
        // eviction does: the key's next grant then takes the row over, with a fence above the
        // row's last, read under its lock. Deleted, the next grant would insert a fresh row
        // with a fence of the clock its statement read at its start: one that stalled between
        // that read and its insert, while another grant came and went, would get a fence below
        // that grant's. (Rows of keys never taken again stay: see the backend's docs, "Release".)
        let release = format!(
            "WITH released AS (UPDATE {table} SET owner = '', expires_at = clock_timestamp() \
               WHERE lock_key = $1 AND owner = $2 AND ($3::bigint IS NULL OR fence = $3) \
               RETURNING lock_key) \
             SELECT pg_notify('{channel}', encode(lock_key, 'hex')) FROM released"
        );
        // A release that hands the row to this backend's next waiter, in the same statement:
        // the waiter needs no statement of its own, and no notification to wake it. The line
        // across processes decides as for a try: where another backend's live place is ahead
        // of this backend's (or any, where this backend has none), the row is released (kept,
        // expired and owned by nobody) and the release announced instead, and the waiters in line get the key. A send after one that
        // went astray (its answer lost with its connection) may find the row handed over
        // already: it takes over a row of the waiter's owner too, whatever wrote it (that
        // waiter starts no try while offered the key, but a grant of its own try withdrawn
        // unclaimed may be on its way to being undone), with a new fence (so that undo misses)
        // and an expiry counted from this send, never moved back. A hand-off is
        // announced too, its payload naming this backend: other processes' heads, woken, find
        // the key busy, and take their places in line; this backend's listener passes it by.
        // One statement for either owner: where a hand-over from one to the other is on its way
        // still, waiting on its row lock, the release checks the row again once it commits,
        // and finds it under the other owner.
        let release_any = format!(
            "WITH released AS (UPDATE {table} SET owner = '', expires_at = clock_timestamp() \
               WHERE lock_key = $1 AND owner = ANY($2::text[]) RETURNING lock_key) \
             SELECT pg_notify('{channel}', encode(lock_key, 'hex')) FROM released"
        );
        // An operator's eviction keeps the row, expired and owned by nobody (no owner is
        // empty), rather than deleting it: the next grant takes it over with a fence above the
        // evicted one, which a fresh row's clock floor only nearly promises.
        let evict = format!(
            "WITH evicted AS (UPDATE {table} SET owner = '', expires_at = clock_timestamp() \
               WHERE lock_key = $1 AND owner = $2 AND expires_at > clock_timestamp() \
               RETURNING lock_key, fence) \
             SELECT fence, pg_notify('{channel}', encode(lock_key, 'hex')) FROM evicted"
        );
        // An expiry set exactly, sooner or later, unlike a renewal's; announced, so that waiters
        // resting until the expiry they read wake to read this one.
        let expire = format!(
            "WITH expiring AS (UPDATE {table} \
               SET expires_at = clock_timestamp() + $3 * interval '1 microsecond' \
               WHERE lock_key = $1 AND owner = $2 AND expires_at > clock_timestamp() \
               RETURNING lock_key) \
             SELECT pg_notify('{channel}', encode(lock_key, 'hex')) FROM expiring"
        );
        let line_at_hand_over = line_ahead(waiters, "$5");
        let place_at_hand_over = place_after_grant(waiters, "$5", "$6", "$7", "handed");
        let hand_over = format!(
            "WITH {line_at_hand_over}, \
             handed AS ( \
               UPDATE {table} AS held SET owner = $3, fence = GREATEST(held.fence + 1, {NOW_US}), \
                 expires_at = GREATEST(CASE WHEN held.owner = $3 THEN held.expires_at END, \
                   clock_timestamp() + $4 * interval '1 microsecond'), \
                 created_at = clock_timestamp(){hand_over_set} \
               WHERE held.lock_key = $1 \
                 AND ((held.owner = $2 AND (SELECT lapses FROM ahead) IS NULL) \
                      OR ($8 AND held.owner = $3)) \
               RETURNING held.fence), \
             released AS ( \
               UPDATE {table} SET owner = '', expires_at = clock_timestamp() \
               WHERE lock_key = $1 AND owner = $2 \
                 AND (SELECT lapses FROM ahead) IS NOT NULL \
               RETURNING lock_key), \
             {place_at_hand_over} \
             SELECT (SELECT fence FROM handed), EXISTS (SELECT 1 FROM released), \
               EXISTS (SELECT 1 FROM requeued), \
               CASE WHEN EXISTS (SELECT 1 FROM handed) \
                      THEN pg_notify('{channel}', encode($1, 'hex') || ' ' || $5) \
                    WHEN EXISTS (SELECT 1 FROM released) \
                      THEN pg_notify('{channel}', encode($1, 'hex')) END"
        );
        // Never moving an expiry back, as the acquire's take-over: a renewal is sent again
        // when its answer is late, and the first copy can land last (its backend stalled
        // before it committed) with the time it read; the client counts from the later copy.
        // A row another transaction keeps locked is passed over rather than waited for: waiting
        // on a `SELECT … FOR UPDATE` left open in a client would fail the whole batch at the lock
        // timeout (or never end, where none is set), and every lease of the batch would go
        // unrenewed. A live row of the owner passed over so is answered as not renewed yet
        // (`false`); one renewed, `true`; none, not held. The rows passed over are tried again
        // (see `renew::renew_all`): most are locked for a moment only, by a rival's try.
        let renew = format!(
            "WITH lease AS ( \
               SELECT * FROM unnest($1::bytea[], $2::text[], $3::bigint[]) \
                 AS lease(lock_key, owner, ttl_us)), \
             free AS ( \
               SELECT held.lock_key FROM {table} AS held \
               JOIN lease ON held.lock_key = lease.lock_key AND held.owner = lease.owner \
               FOR UPDATE OF held SKIP LOCKED), \
             renewed AS ( \
               UPDATE {table} AS held SET expires_at = GREATEST(held.expires_at, \
                 clock_timestamp() + lease.ttl_us * interval '1 microsecond') \
               FROM lease \
               WHERE held.lock_key = lease.lock_key AND held.owner = lease.owner \
                 AND held.expires_at > clock_timestamp() \
                 AND held.lock_key IN (SELECT lock_key FROM free) \
               RETURNING held.lock_key, held.owner) \
             SELECT lock_key, owner, true FROM renewed \
             UNION ALL \
             SELECT held.lock_key, held.owner, false FROM {table} AS held \
             JOIN lease ON held.lock_key = lease.lock_key AND held.owner = lease.owner \
             WHERE held.expires_at > clock_timestamp() \
               AND held.lock_key NOT IN (SELECT lock_key FROM free)"
        );
        let keep_places = format!(
            "WITH kept AS ( \
               UPDATE {waiters} SET expires_at = clock_timestamp() + $3 * interval '1 microsecond' \
               WHERE waiter = $1 AND lock_key = ANY($2::bytea[]) AND expires_at > clock_timestamp()) \
             SELECT waited.lock_key FROM unnest($4::bytea[]) AS waited(lock_key) \
             WHERE NOT EXISTS (SELECT 1 FROM {table} AS held \
               WHERE held.lock_key = waited.lock_key AND held.owner <> '' \
                 AND held.expires_at > clock_timestamp())"
        );
        let leave = format!(
            "WITH gone AS (DELETE FROM {waiters} WHERE lock_key = $1 AND waiter = $2 RETURNING lock_key) \
             SELECT pg_notify('{channel}', encode(lock_key, 'hex')) FROM gone"
        );
        // Other backends' live places: each is a process with one waiter or more (this
        // backend's own are counted from its queue, which knows them all).
        let inspect = format!(
            "SELECT (SELECT count(*) FROM {waiters} \
               WHERE lock_key = $1 AND waiter <> $2 AND expires_at > clock_timestamp()), \
             held.owner, held.fence, \
             (extract(epoch FROM held.created_at) * 1000000)::bigint, \
             (extract(epoch FROM held.expires_at - clock_timestamp()) * 1000000)::bigint, {read} \
             FROM (SELECT 1) AS one LEFT JOIN {table} AS held \
               ON held.lock_key = $1 AND held.owner <> '' AND held.expires_at > clock_timestamp()"
        );
        // A range of the primary key, a page at a time (see `description::prefix_end`).
        let list = format!(
            "SELECT lock_key FROM {table} WHERE lock_key >= $1 \
               AND owner <> '' AND expires_at > clock_timestamp() ORDER BY lock_key LIMIT {LIST_PAGE}"
        );
        let list_to = format!(
            "SELECT lock_key FROM {table} WHERE lock_key >= $1 AND lock_key < $2 \
               AND owner <> '' AND expires_at > clock_timestamp() ORDER BY lock_key LIMIT {LIST_PAGE}"
        );
        Statements {
            inspect: Statement::new(inspect, protocol),
            list: Statement::new(list, protocol),
            list_to: Statement::new(list_to, protocol),
            described,
            acquire: Statement::new(acquire, protocol),
            release: Statement::new(release, protocol),
            hand_over: Statement::new(hand_over, protocol),
            release_any: Statement::new(release_any, protocol),
            evict: Statement::new(evict, protocol),
            expire: Statement::new(expire, protocol),
            renew: Statement::new(renew, protocol),
            keep_places: Statement::new(keep_places, protocol),
            leave: Statement::new(leave, protocol),
            table,
            channel: channel.to_owned(),
        }
    }
}

/// This host's name as a literal of the statements (`bytea`, as a key: no database encoding can
/// refuse it), cut as a label is; `NULL` where it is unknown. Hex, so that nothing in it is
/// read as SQL, and no `\\` that a server's `standard_conforming_strings` would read otherwise.
fn host_literal() -> String {
    let host = bounded(crate::inspect::this_host());
    if host.is_empty() {
        return "NULL::bytea".into();
    }
    let hex: String = host.bytes().map(|b| format!("{b:02x}")).collect();
    format!("decode('{hex}', 'hex')")
}

/// The line across processes as a statement sees it, for the backend whose waiter name is the
/// placeholder `waiter` (of the key `$1`): `mine`, its own live place, if any; and `ahead`, one
/// row whose `lapses` is when the first of the other backends' live places ahead of it lapses
/// (all of theirs count where it has none), null where none is.
fn line_ahead(waiters: &str, waiter: &str) -> String {
    format!(
        "mine AS ( \
           SELECT ticket FROM {waiters} \
           WHERE lock_key = $1 AND waiter = {waiter} AND expires_at > clock_timestamp()), \
         ahead AS ( \
           SELECT min(line.expires_at) AS lapses FROM {waiters} AS line \
           WHERE line.lock_key = $1 AND line.waiter <> {waiter} AND line.expires_at > clock_timestamp() \
             AND (NOT EXISTS (SELECT 1 FROM mine) \
                  OR (line.ticket, line.waiter) < (SELECT ticket, {waiter}::text FROM mine)))"
    )
}

/// What a grant (a row of the CTE `granted`) does to the place of the backend whose waiter name
/// is the placeholder `waiter`: `left_line` gives it up, or, where the placeholder `keep` says
/// more of its waiters wait, `requeued` takes it anew at the end of the line, to last the
/// placeholder `lifetime` (µs).
fn place_after_grant(
    waiters: &str,
    waiter: &str,
    keep: &str,
    lifetime: &str,
    granted: &str,
) -> String {
    format!(
        "left_line AS ( \
           DELETE FROM {waiters} WHERE lock_key = $1 AND waiter = {waiter} AND NOT {keep} \
             AND EXISTS (SELECT 1 FROM {granted})), \
         requeued AS ( \
           UPDATE {waiters} SET ticket = {NOW_US}, \
             expires_at = clock_timestamp() + {lifetime} * interval '1 microsecond' \
           WHERE lock_key = $1 AND waiter = {waiter} AND {keep} AND EXISTS (SELECT 1 FROM {granted}) \
           RETURNING 1)"
    )
}

/// The notification channel of the lock table `table` (quoted) names: `dlock_` and a hash of
/// the schema and name it resolves to, so that `locks`, `public.locks` and a `search_path` that
/// finds the same table all share one channel, whatever the length of the names. The hash is
/// computed here (FNV-1a), not by the server: the same in every process and version, and
/// available where a server's `md5` is not (FIPS mode).
///
/// The waiters table (`waiters`, quoted) must exist too.
pub(super) async fn resolve_channel(
    pool: &PgPool,
    table: &str,
    waiters: &str,
    protocol: Protocol,
) -> Result<String, LockError> {
    let waiters_exist: bool = Query::once("SELECT to_regclass($1) IS NOT NULL", protocol)
        .bind(waiters)
        .fetch_one(pool)
        .await
        .and_then(|row| row.try_get(0))
        .map_err(super::backend_error)?;
    if !waiters_exist {
        return Err(LockError::backend(format!(
            "PostgreSQL: the waiters table {waiters} does not exist (create it with `PostgresBackend::ddl`, or let `connect` create it)"
        )));
    }
    let resolved = Query::once(
        "SELECT n.nspname::text, c.relname::text FROM pg_class c \
         JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)",
        protocol,
    )
    .bind(table)
    .fetch_all(pool)
    .await
    .map_err(super::backend_error)?
    .into_iter()
    .next();
    let Some(row) = resolved else {
        return Err(LockError::backend(format!(
            "PostgreSQL: the lock table {table} does not exist (create it with `PostgresBackend::ddl`, or let `connect` create it)"
        )));
    };
    let schema: String = row.try_get(0).map_err(super::backend_error)?;
    let name: String = row.try_get(1).map_err(super::backend_error)?;
    Ok(channel_of(&schema, &name))
}

/// The channel of the table `name` in `schema`.
fn channel_of(schema: &str, name: &str) -> String {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let hash = schema
        .bytes()
        .chain([0])
        .chain(name.bytes())
        .fold(OFFSET, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(PRIME)
        });
    format!("dlock_{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::channel_of;

    #[test]
    fn a_channel_is_a_short_identifier_of_schema_and_name() {
        let channel = channel_of("public", "dlock_locks");
        assert_eq!(channel, channel_of("public", "dlock_locks"));
        assert!(
            channel.len() == 22 && channel.starts_with("dlock_"),
            "{channel}"
        );
        assert_ne!(channel, channel_of("other", "dlock_locks"));
        assert_ne!(channel_of("ab", "c"), channel_of("a", "bc"));
    }
}
