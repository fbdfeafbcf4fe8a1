//! Postgres's transcript writes: chunks, and the session rows they advance.
//!
//! Every update waits for the commit that stores it before anyone sees it, so that commit is one
//! statement that stores chunks and nothing else ([`PgStore::write_chunks`], which the transcript
//! writer uses). Advancing each session's row after its chunks (`last_seq`, `updated_at`,
//! `stored_bytes`) is not HOT (`updated_at` and `stored_bytes` are in the owner's list indexes): it
//! rewrote the row and its indexes inside that commit, ~90 µs of the server's time per round trip
//! (measured with `pgbench`). The writer makes those advances later, when its queue is quiet
//! ([`PgStore::settle`]), as SQLite's writer does.
//!
//! A settle recounts from the stored chunks, so it is right whoever runs it and however often:
//! `last_seq` and `stored_bytes` move together, the chunks above a row's `last_seq` are exactly
//! the ones its `stored_bytes` does not count yet (a session's chunks commit in seq order, one
//! writer at a time), and the settle adds those and moves `last_seq` past them. Two replicas
//! settling one session (around a takeover) serialize on its row: Postgres evaluates the second
//! `UPDATE`'s expressions again on the row the first left, so nothing is counted twice. A gateway
//! killed before it settled leaves rows behind; a session is read with its newest chunk's seq
//! ([`super::super::sql::Sql::LAST_SEQ`]), its next write's settle catches the row up, and every
//! replica settles the rows left behind when it starts ([`SETTLE_ALL_BEHIND`]).
//!
//! [`PgStore::write_batch`](super::PgStore) keeps its meaning: everything it stores is settled
//! when it returns (the chunks and the settle in one transaction).

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::Postgres;
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgConnection;

use super::PgStore;
use crate::store::sql::{Sql, note_unstored, pg_insert_chunks};
use crate::store::{SessionWrite, StoreError};

/// The `INSERT` that stores chunks, the chunks (`$1`-`$5`: session, seq_from, seq_to, payload,
/// at) limited to the rows `$only` lets through; returns each chunk stored as (session,
/// seq_from). A chunk whose seqs are stored already is skipped.
///
/// The chunks' rows (`w`) carry each payload's place in `$4`, not the payload: the payload is
/// taken from `$4` only where the row is inserted. A chunk is up to hundreds of KiB, and with the
/// payload in the rows Postgres copied it into a CTE's tuplestore and into the hash tables of the
/// joins over it; `EXPLAIN ANALYZE` of a 220 KiB chunk: 1.48 ms of the server's time, 0.40 ms
/// with the payload taken last.
macro_rules! insert_chunks_sql {
    ($only:literal) => {
        concat!(
            pg_insert_chunks!(concat!(
                "SELECT w.session_id, w.seq_from, w.seq_to, ($4::text[])[w.i::int], w.at
        FROM unnest($1::text[], $2::bigint[], $3::bigint[], $5::bigint[]) WITH ORDINALITY
            AS w(session_id, seq_from, seq_to, at, i)
        WHERE ",
                $only
            )),
            "
        RETURNING session_id, seq_from"
        )
    };
}

/// Stores chunks in one statement, atomic on its own: the write every update waits on before a
/// client sees it is one round trip and one commit. A chunk whose session is gone, or whose seqs
/// are stored already, is skipped (and logged), as [`Sql::write_batch`] does.
const WRITE_CHUNKS: &str = insert_chunks_sql!("EXISTS (SELECT 1 FROM sessions s WHERE s.id = w.session_id)");

/// [`WRITE_CHUNKS`] for a replica holding leases, also one statement (one round trip, one
/// commit, no `BEGIN`): the leases `$6` holds among these sessions, their rows locked for the
/// statement (a takeover waits for it and then sees all of it); only their chunks are stored.
/// Returns each held session with the seq_from of each chunk stored (`NULL` when none was), and
/// for each lease that says another replica follows the session (`announce`) sends a NOTIFY
/// with the session's newest seq here, which Postgres delivers only once this commits (and once
/// per transaction for the same text). A held lease's session exists, and stays while its lease
/// row is locked (deleting it deletes the lease), so its chunks need no check of `sessions`.
///
/// A replica starting to follow sets `announce` with an `UPDATE`, which waits for this
/// statement's lock; a statement that waited reads the row again (`FOR SHARE` returns its newest
/// version), so it sees `announce` as the follower left it (see the `replica::follow` module).
///
/// A commit of one chunk, the round trip every update waits on, takes [`WRITE_CHUNK_LEASED`]
/// instead; this one stores the chunks of several sessions at once. `pgbench` on a 2-core Xeon,
/// one 700-byte chunk, five alternated rounds: 203 µs a commit against 247 µs for the earlier
/// shape (the chunks' rows in a CTE read three times, and the NOTIFYs in one more with a
/// subquery counting them); a bare `INSERT` of the chunk took 129-145 µs.
const WRITE_CHUNKS_LEASED: &str = concat!(
    "WITH held AS (
        SELECT l.session_id, l.announce FROM session_leases l
        WHERE l.replica = $6 AND l.session_id = ANY($1::text[])
        FOR SHARE OF l
    ), stored AS (
        ",
    insert_chunks_sql!("w.session_id IN (SELECT session_id FROM held)"),
    "
    )
    SELECT h.session_id, s.seq_from,
        CASE WHEN h.announce THEN pg_notify('acp_session_committed', h.session_id || ':' ||
            (SELECT MAX(n.seq_to) FROM unnest($1::text[], $3::bigint[]) AS n(session_id, seq_to)
             WHERE n.session_id = h.session_id)) END AS notified
    FROM held h LEFT JOIN stored s ON s.session_id = h.session_id"
);

/// [`WRITE_CHUNKS_LEASED`] for one chunk, the common case (a writer's commit holds one chunk a
/// session, and a round trip or a stream is one session), with the chunk's fields as scalars
/// (`$1`-`$5`, `$6` the holder): no arrays to build, unnest and join, and the lease row is found
/// by its key. Returns the session with the chunk's seq_from (`NULL` when its seqs are stored
/// already), or no row when the lease is not held.
///
/// `pgbench` on a 2-core Xeon, one 700-byte chunk, five alternated rounds of 4 s: 222 µs a
/// commit against 285 µs for [`WRITE_CHUNKS_LEASED`] with the same chunk.
const WRITE_CHUNK_LEASED: &str = concat!(
    "WITH held AS (
        SELECT l.announce FROM session_leases l
        WHERE l.session_id = $1 AND l.replica = $6
        FOR SHARE OF l
    ), stored AS (
        ",
    pg_insert_chunks!("SELECT $1, $2, $3, $4, $5 FROM held"),
    "
        RETURNING seq_from
    )
    SELECT $1::text, s.seq_from,
        CASE WHEN h.announce THEN pg_notify('acp_session_committed', $1::text || ':' || $3::bigint) END AS notified
    FROM held h LEFT JOIN stored s ON true"
);

/// Advances the rows of the sessions `$which` picks past their stored chunks: adds the bytes of
/// the chunks above `last_seq` and moves `last_seq` (and `updated_at`) to the newest of them.
/// Each expression reads the row as it was; a row another settle changed meanwhile is read again
/// as that one left it (the subqueries depend on it), so a chunk is never counted twice.
macro_rules! settle_sql {
    ($which:literal) => {
        concat!(
            "UPDATE sessions SET
        stored_bytes = stored_bytes + (SELECT COALESCE(SUM(octet_length(payload)), 0) FROM session_events e
            WHERE e.session_id = sessions.id AND e.seq_from > sessions.last_seq),
        updated_at = GREATEST(updated_at, (SELECT COALESCE(MAX(created_at), 0) FROM session_events e
            WHERE e.session_id = sessions.id AND e.seq_from > sessions.last_seq)),
        last_seq = GREATEST(last_seq, (SELECT COALESCE(MAX(seq_to), 0) FROM session_events e
            WHERE e.session_id = sessions.id AND e.seq_from > sessions.last_seq))
     WHERE ",
            $which,
            " EXISTS (SELECT 1 FROM session_events e WHERE e.session_id = sessions.id AND e.seq_from > sessions.last_seq)"
        )
    };
}

/// [`settle_sql`] for the sessions named in `$1`.
const SETTLE: &str = settle_sql!("id = ANY($1::text[]) AND");

/// [`settle_sql`] for every session left behind (a gateway stopped before it settled).
pub(super) const SETTLE_ALL_BEHIND: &str = settle_sql!("");

/// Whether `w` holds what only the replica serving the session may write: its agent's updates or
/// controls.
fn needs_lease(w: &SessionWrite) -> bool {
    w.chunk.is_some() || w.controls.is_some()
}

/// Whether `w` is a chunk and nothing else ([`WRITE_CHUNKS`] writes those).
pub(super) fn is_chunk_only(w: &SessionWrite) -> bool {
    w.chunk.is_some() && !w.has_metadata()
}

/// The ids of the sessions whose chunks `writes` carries, each once.
fn with_chunks(writes: &[SessionWrite]) -> Vec<&str> {
    let mut ids: Vec<&str> = Vec::new();
    for w in writes.iter().filter(|w| w.chunk.is_some()) {
        if !ids.contains(&&*w.session_id) {
            ids.push(&w.session_id);
        }
    }
    ids
}

impl PgStore {
    /// Stores chunk-only `writes` in one statement, their sessions' rows left for
    /// [`Self::settle`]; with `holder`, only the chunks of sessions whose lease it holds (the
    /// others are returned).
    pub(super) async fn write_chunks(
        &self,
        writes: &[SessionWrite],
        holder: Option<&str>,
    ) -> Result<Vec<Arc<str>>, StoreError> {
        self.on_writer(async |conn| chunks_on(conn, writes, holder).await).await
    }

    /// Stores `writes` and settles the sessions whose chunks it stored, in one transaction (what
    /// [`crate::store::Store::write_batch`] promises); with `holder`, as
    /// [`crate::store::Store::write_batch_leased`]: the sessions refused are returned.
    pub(super) async fn write_settled(
        &self,
        writes: &[SessionWrite],
        holder: Option<&str>,
    ) -> Result<Vec<Arc<str>>, StoreError> {
        let mut tx = self.db.as_system().await?;
        let refused = if writes.iter().all(is_chunk_only) {
            chunks_on(&mut tx, writes, holder).await?
        } else {
            // Rows left behind by earlier chunks first: the statements below advance a row by
            // the chunk they store, which would step over the chunks not yet counted.
            settle_on(&mut tx, &with_chunks(writes)).await?;
            match holder {
                None => {
                    Postgres::write_batch(&mut tx, writes).await?;
                    Vec::new()
                }
                Some(holder) => batch_leased(&mut tx, writes, holder).await?,
            }
        };
        let stored: Vec<&str> = with_chunks(writes)
            .into_iter()
            .filter(|s| !refused.iter().any(|r| **r == **s))
            .collect();
        settle_on(&mut tx, &stored).await?;
        tx.commit().await?;
        Ok(refused)
    }

    /// Advances `sessions`' rows past their stored chunks (see the module's notes): idempotent.
    pub(super) async fn settle(&self, sessions: &[Arc<str>]) -> Result<(), StoreError> {
        let ids: Vec<&str> = sessions.iter().map(|s| &**s).collect();
        self.on_writer(async |conn| settle_on(conn, &ids).await).await
    }

    /// Runs `write` on the connection the transcript writer keeps between its writes. A pooled
    /// connection given back is pinged before it can be taken again (sqlx does so on every
    /// release, in a task of its own): a second round trip per commit, and a wake of the other
    /// core, while clients wait for the commit's updates. The writer is one task, so it keeps one
    /// connection; one whose write failed goes back to the pool, whose ping closes it if it is
    /// broken, and the next write takes another. One idle for [`KEEP_IDLE`] goes back too, so
    /// that the pool's rules (its idle timeout, its lifetime) apply to it as to the others, and
    /// a connection a firewall dropped while idle is not written to.
    async fn on_writer<T>(
        &self,
        write: impl AsyncFnOnce(&mut PgConnection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut kept = self.writer.0.lock().await;
        let mut conn = match kept.take() {
            Some((conn, used)) if used.elapsed() < KEEP_IDLE => conn,
            idle => {
                // Given back before another is taken: the pool may hand it out again.
                drop(idle);
                self.writes.acquire().await?
            }
        };
        let done = write(&mut conn).await?;
        *kept = Some((conn, Instant::now()));
        Ok(done)
    }
}

/// The connection the transcript writer keeps between its writes ([`PgStore::on_writer`]), and
/// when it last wrote through it.
#[derive(Debug, Default)]
pub(super) struct KeptWriter(tokio::sync::Mutex<Option<(PoolConnection<Postgres>, Instant)>>);

impl Drop for KeptWriter {
    /// sqlx gives a pooled connection back in a task of its own, and panics where no Tokio
    /// runtime runs: a store dropped after its runtime (the benchmark's main thread did so, and
    /// ended every Postgres run with that panic). There the kept connection is detached
    /// instead, which frees its place in the pool and closes its socket; the writes pool keeps
    /// no minimum of connections, so nothing is spawned to replace it.
    fn drop(&mut self) {
        if tokio::runtime::Handle::try_current().is_err()
            && let Some((conn, _)) = self.0.get_mut().take()
        {
            drop(conn.detach());
        }
    }
}

/// How long the transcript writer keeps its connection unused before giving it back to the pool.
const KEEP_IDLE: Duration = Duration::from_secs(10);

/// [`SETTLE`] on `conn`.
async fn settle_on(conn: &mut PgConnection, ids: &[&str]) -> Result<(), StoreError> {
    if !ids.is_empty() {
        sqlx::query(SETTLE).bind(ids).execute(conn).await?;
    }
    Ok(())
}

/// [`WRITE_CHUNKS`] (or, with `holder`, [`WRITE_CHUNK_LEASED`] for one chunk and
/// [`WRITE_CHUNKS_LEASED`] for more) on `conn`: the sessions refused.
async fn chunks_on(
    conn: &mut PgConnection,
    writes: &[SessionWrite],
    holder: Option<&str>,
) -> Result<Vec<Arc<str>>, StoreError> {
    let chunks: Vec<(&str, &crate::store::EventChunk, i64)> = writes
        .iter()
        .filter_map(|w| Some((&*w.session_id, w.chunk.as_ref()?, w.updated_at)))
        .collect();
    // Every statement returns (session, seq_from): a held session with no chunk stored has none.
    let arrays = |sql| {
        sqlx::query_as::<_, (String, Option<i64>)>(sql)
            .bind(chunks.iter().map(|c| c.0).collect::<Vec<_>>())
            .bind(chunks.iter().map(|c| c.1.seq_from).collect::<Vec<_>>())
            .bind(chunks.iter().map(|c| c.1.seq_to).collect::<Vec<_>>())
            .bind(chunks.iter().map(|c| c.1.payload.as_str()).collect::<Vec<_>>())
            .bind(chunks.iter().map(|c| c.2).collect::<Vec<_>>())
    };
    let Some(holder) = holder else {
        let stored = arrays(WRITE_CHUNKS).fetch_all(conn).await?;
        if stored.len() < chunks.len() {
            let stored: std::collections::HashSet<(&str, Option<i64>)> =
                stored.iter().map(|(s, f)| (s.as_str(), *f)).collect();
            for (session, chunk, _) in chunks {
                note_unstored(
                    session,
                    chunk,
                    u64::from(stored.contains(&(session, Some(chunk.seq_from)))),
                );
            }
        }
        return Ok(Vec::new());
    };
    let rows = match chunks.as_slice() {
        [(session, chunk, at)] => {
            sqlx::query_as::<_, (String, Option<i64>)>(WRITE_CHUNK_LEASED)
                .bind(*session)
                .bind(chunk.seq_from)
                .bind(chunk.seq_to)
                .bind(chunk.payload.as_str())
                .bind(*at)
                .bind(holder)
                .fetch_all(conn)
                .await?
        }
        _ => arrays(WRITE_CHUNKS_LEASED).bind(holder).fetch_all(conn).await?,
    };
    let mut refused: Vec<Arc<str>> = Vec::new();
    for w in writes {
        let held = rows.iter().any(|(s, _)| **s == *w.session_id);
        if !held {
            if !refused.contains(&w.session_id) {
                refused.push(w.session_id.clone());
            }
        } else if let Some(chunk) = &w.chunk {
            let stored = rows
                .iter()
                .any(|(s, f)| **s == *w.session_id && *f == Some(chunk.seq_from));
            note_unstored(&w.session_id, chunk, u64::from(stored));
        }
    }
    Ok(refused)
}

/// A batch with more than chunks for a replica holding leases, on `conn` (a transaction): the
/// sessions refused.
async fn batch_leased(
    conn: &mut PgConnection,
    writes: &[SessionWrite],
    holder: &str,
) -> Result<Vec<Arc<str>>, StoreError> {
    // One statement: which of these sessions' leases `holder` holds (their rows locked until
    // commit, so a takeover waits for this write and then sees all of it), and a NOTIFY for
    // each that carries updates, delivered by Postgres only if and when this transaction
    // commits, for a session another replica follows. What only the serving agent says
    // (updates, its controls) needs the lease.
    let (ids, seqs): (Vec<&str>, Vec<i64>) = writes
        .iter()
        .filter(|w| needs_lease(w))
        .map(|w| (&*w.session_id, w.chunk.as_ref().map_or(-1, |c| c.seq_to)))
        .unzip();
    let held: Vec<String> = if ids.is_empty() {
        Vec::new()
    } else {
        sqlx::query_scalar(
            "SELECT l.session_id,
                    CASE WHEN w.seq_to >= 0 AND l.announce
                         THEN pg_notify('acp_session_committed', l.session_id || ':' || w.seq_to) END
             FROM session_leases l
             JOIN unnest($1::text[], $2::bigint[]) AS w(session_id, seq_to) ON w.session_id = l.session_id
             WHERE l.replica = $3
             FOR SHARE OF l",
        )
        .bind(&ids)
        .bind(&seqs)
        .bind(holder)
        .fetch_all(&mut *conn)
        .await?
    };
    let is_refused = |w: &SessionWrite| needs_lease(w) && !held.iter().any(|h| **h == *w.session_id);
    let mut refused: Vec<Arc<str>> = Vec::new();
    for w in writes.iter().filter(|w| is_refused(w)) {
        if !refused.contains(&w.session_id) {
            refused.push(w.session_id.clone());
        }
    }
    if refused.is_empty() {
        Postgres::write_batch(&mut *conn, writes).await?;
    } else {
        // Their message counts and titles still count; their updates and controls (which
        // would overwrite what the new holder's agent said) are not stored.
        let kept: Vec<SessionWrite> = writes
            .iter()
            .map(|w| {
                if is_refused(w) {
                    SessionWrite {
                        chunk: None,
                        controls: None,
                        ..w.clone()
                    }
                } else {
                    w.clone()
                }
            })
            .collect();
        Postgres::write_batch(&mut *conn, &kept).await?;
    }
    Ok(refused)
}
