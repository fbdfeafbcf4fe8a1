//! The SQL both stores run, written once.
//!
//! Each statement is a default method of [`Sql`], generic over the database and handed the
//! connection, pool or transaction to run on: a backend only decides *where* a statement runs
//! (SQLite: the pool, or a transaction for multi-statement work; Postgres: inside `as_user`, as
//! the request role under row-level security, or `as_system`, as the tables' owner).
//! Placeholders are `$N` on both databases: sqlx's SQLite driver binds `$N` to the N-th value as
//! Postgres does. The few words the two dialects spell differently are the constants of [`Sql`].

use sqlx::database::HasStatementCache;
use sqlx::{Database, Decode, Encode, Executor, FromRow, IntoArguments, Postgres, Sqlite, Type};

use super::list_sql::{RunList, SEARCH_PROBE, SESSION_COLUMNS, SearchBy, SearchIndex, fts5_phrase, like_pattern};
use super::{EventChunk, ListFilter, NewSession, Position, SessionRecord, SessionWrite};

/// SQLite's key of the chunk of session `$s` (a `sessions` row's name in the statement) from seq
/// `$seq` (an SQL expression, clamped into the key's 32 bits): `(num << 32) | seq` (migration
/// `…_chunks_keyed_by_session_number`). `chunk_key!(s, last)`: the last key a session can have.
macro_rules! chunk_key {
    ($s:literal, last) => {
        concat!("((", $s, ".num << 32) | 4294967295)")
    };
    ($s:literal, $seq:expr) => {
        concat!("((", $s, ".num << 32) | MIN(MAX(", $seq, ", 0), 4294967295))")
    };
}
pub(crate) use chunk_key;

/// SQLite: chunk `$e` is one of session `$s`'s (their keys are one range, [`chunk_key`]'s).
macro_rules! chunk_of {
    ($e:literal, $s:literal) => {
        concat!($e, ".key BETWEEN ", $s, ".num << 32 AND ", chunk_key!($s, last))
    };
}
pub(crate) use chunk_of;

/// Postgres: stores the chunks `$rows` selects (session, seq_from, seq_to, payload, created_at);
/// a chunk whose seqs are stored already is skipped. The single-chunk statement below and the
/// transcript writer's (`postgres::transcript`) are this one around their own rows.
macro_rules! pg_insert_chunks {
    ($rows:expr) => {
        concat!(
            "INSERT INTO session_events (session_id, seq_from, seq_to, payload, created_at)\n        ",
            $rows,
            "\n        ON CONFLICT (session_id, seq_from) DO NOTHING"
        )
    };
}
pub(crate) use pg_insert_chunks;

/// SQLite: `$cols` of the chunks `$2`'s session `$1` holds after seq `$3`, `$4` at most, in order
/// (see [`Sql::READ_EVENTS`]).
macro_rules! sqlite_chunks_after {
    ($cols:literal) => {
        concat!(
            "SELECT ",
            $cols,
            " FROM sessions s JOIN session_events e ON e.key >= ",
            chunk_key!(
                "s",
                concat!(
                    "COALESCE((SELECT b.seq_from FROM session_events b WHERE b.key BETWEEN s.num << 32 AND ",
                    chunk_key!("s", "?3"),
                    " ORDER BY b.key DESC LIMIT 1), 0)"
                )
            ),
            " AND e.key <= ",
            chunk_key!("s", last),
            " WHERE s.id = ?1 AND s.owner = ?2 AND e.seq_to > ?3 ORDER BY e.key LIMIT ?4"
        )
    };
}

/// Postgres: the same as [`sqlite_chunks_after`].
macro_rules! pg_chunks_after {
    ($cols:literal) => {
        concat!(
            "SELECT ",
            $cols,
            " FROM session_events e JOIN sessions s ON s.id = e.session_id
             WHERE e.session_id = $1 AND s.owner = $2 AND e.seq_to > $3
               AND e.seq_from >= COALESCE((SELECT b.seq_from FROM session_events b
                   WHERE b.session_id = $1 AND b.seq_from <= $3 ORDER BY b.seq_from DESC LIMIT 1), 0)
             ORDER BY e.seq_from LIMIT $4"
        )
    };
}

/// How many of the chunks of `sizes` (in order) a page takes: up to the first that starts past
/// `budget` bytes, and one at least.
fn page_len(sizes: &[i64], budget: i64) -> usize {
    let mut total = 0;
    sizes
        .iter()
        .take_while(|&&size| {
            let starts_within = total < budget;
            total += size;
            starts_within
        })
        .count()
}

/// The statements of the [`super::Store`] contract, for any database that can run them.
///
/// The `where` clauses say what sqlx must be able to do with this database (bind our values,
/// build our rows); SQLite and Postgres both can, so the impls below only fill in the dialect.
pub(crate) trait Sql: Database + HasStatementCache
where
    for<'q> Self::Arguments<'q>: IntoArguments<'q, Self>,
    for<'c> &'c mut Self::Connection: Executor<'c, Database = Self>,
    for<'q> &'q str: Encode<'q, Self> + Type<Self>,
    for<'q> Option<&'q str>: Encode<'q, Self> + Type<Self>,
    for<'q> &'q [u8]: Encode<'q, Self> + Type<Self>,
    for<'q> String: Encode<'q, Self> + Type<Self>,
    for<'q> i64: Encode<'q, Self> + Type<Self>,
    for<'r> Vec<u8>: Decode<'r, Self> + Type<Self>,
    for<'r> (Vec<u8>,): FromRow<'r, Self::Row>,
    for<'r> (i64,): FromRow<'r, Self::Row>,
    for<'r> (String,): FromRow<'r, Self::Row>,
    for<'r> SessionRecord: FromRow<'r, Self::Row>,
    for<'r> EventChunk: FromRow<'r, Self::Row>,
{
    /// The larger of two values: SQLite's two-argument `MAX`, Postgres's `GREATEST`.
    const GREATEST: &'static str;
    /// Case-insensitive `LIKE` (for [`list_query`](super::list_query)): SQLite's `LIKE` already is (for ASCII),
    /// Postgres needs `ILIKE`.
    const LIKE: &'static str;
    /// The text index `session/list` searches can start from (migration `…_session_search`).
    const SEARCH_INDEX: SearchIndex;
    /// A session's `last_seq` as [`Sql::get_session`] reads it. The transcript writers advance a
    /// session's row after its chunks, when their queue is quiet (see
    /// `migrations/sqlite/…_chunks_leave_sessions_alone` and `postgres/transcript.rs`), so it is
    /// read as the larger of the row's and the newest stored chunk's: a session loaded again at
    /// once numbers its updates above every stored one.
    const LAST_SEQ: &'static str;
    /// Stores one chunk of a session (`$1` its id, `$2`-`$5` seq_from, seq_to, payload, stored
    /// at), unless the session is gone or a chunk from that seq_from is stored already.
    const INSERT_CHUNK: &'static str;
    /// Up to `$4` chunks of `$2`'s session `$1` holding updates after seq `$3`, from the chunk
    /// that holds `$3` on (chunks never overlap): a range of the key, not a walk over every chunk
    /// before it (a session caught up page by page deep into a long transcript read it all again
    /// for each page).
    const READ_EVENTS: &'static str;
    /// The payload sizes of the chunks [`Sql::READ_EVENTS`] would read, in order: `octet_length`
    /// reads a value's size from its header, not the value, so a page is chosen before it is read.
    const CHUNK_SIZES: &'static str;

    /// How many rows a statement changed (sqlx's result types share no trait for it).
    fn rows_affected(done: &Self::QueryResult) -> u64;

    /// Inserts a session with no title, no prompts and no transcript yet.
    async fn insert_session<'c>(e: impl Executor<'c, Database = Self>, s: &NewSession<'_>) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO sessions (id, owner, agent, agent_session_id, cwd, additional_dirs, meta, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8)",
        )
        .bind(s.id)
        .bind(s.owner)
        .bind(s.agent)
        .bind(s.agent_session_id)
        .bind(s.cwd)
        .bind(s.additional_dirs)
        .bind(s.meta)
        .bind(s.now)
        .execute(e)
        .await?;
        Ok(())
    }

    /// A session of `owner`, or `None`.
    async fn get_session<'c>(
        e: impl Executor<'c, Database = Self>,
        owner: &str,
        id: &str,
    ) -> Result<Option<SessionRecord>, sqlx::Error> {
        let columns = SESSION_COLUMNS.replacen("last_seq", Self::LAST_SEQ, 1);
        let sql = format!("SELECT {columns} FROM sessions WHERE id = $1 AND owner = $2");
        sqlx::query_as(&sql).bind(id).bind(owner).fetch_optional(e).await
    }

    /// The session controls stored for a session of `owner`, or `None`.
    async fn session_controls<'c>(
        e: impl Executor<'c, Database = Self>,
        owner: &str,
        id: &str,
    ) -> Result<Option<String>, sqlx::Error> {
        let row: Option<(String,)> = sqlx::query_as("SELECT controls FROM sessions WHERE id = $1 AND owner = $2")
            .bind(id)
            .bind(owner)
            .fetch_optional(e)
            .await?;
        Ok(row.map(|(c,)| c))
    }

    /// Deletes a session row of `owner`; `false` when there was none.
    async fn delete_session<'c>(
        e: impl Executor<'c, Database = Self>,
        owner: &str,
        id: &str,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query("DELETE FROM sessions WHERE id = $1 AND owner = $2")
            .bind(id)
            .bind(owner)
            .execute(e)
            .await?;
        Ok(Self::rows_affected(&done) > 0)
    }

    /// Stores one chunk of a session's updates (skipped, and logged, if that seq range is stored
    /// already, or the session was deleted meanwhile); whether it was stored.
    async fn insert_chunk(
        conn: &mut Self::Connection,
        session_id: &str,
        chunk: &EventChunk,
        at: i64,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(Self::INSERT_CHUNK)
            .bind(session_id)
            .bind(chunk.seq_from)
            .bind(chunk.seq_to)
            .bind(chunk.payload.as_str())
            .bind(at)
            .execute(&mut *conn)
            .await?;
        let rows = Self::rows_affected(&done);
        note_unstored(session_id, chunk, rows);
        Ok(rows > 0)
    }

    /// Writes one flush on `conn` (the caller's transaction): each session's chunk, unless the
    /// session is gone or the chunk's seq range is stored already (then it is logged and skipped),
    /// and the session's counters, title and stored bytes.
    async fn write_batch(conn: &mut Self::Connection, writes: &[SessionWrite]) -> Result<(), sqlx::Error> {
        let update = format!(
            "UPDATE sessions SET
                last_seq = {greatest}(last_seq, $2),
                updated_at = {greatest}(updated_at, $3),
                message_count = message_count + $4,
                title = COALESCE($5, title, $6),
                stored_bytes = stored_bytes + $7,
                controls = COALESCE($8, controls)
             WHERE id = $1",
            greatest = Self::GREATEST
        );
        for w in writes {
            let mut stored_bytes = 0;
            if let Some(chunk) = &w.chunk {
                let stored = Self::insert_chunk(&mut *conn, &w.session_id, chunk, w.updated_at).await?;
                if stored {
                    stored_bytes = i64::try_from(chunk.payload.len()).unwrap_or(i64::MAX);
                }
            }
            sqlx::query(&update)
                .bind(&*w.session_id)
                .bind(w.chunk.as_ref().map_or(0, |c| c.seq_to))
                .bind(w.updated_at)
                .bind(w.prompts)
                .bind(w.agent_title.as_deref())
                .bind(w.prompt_title.as_deref())
                .bind(stored_bytes)
                .bind(w.controls.as_deref())
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }

    /// Bytes of `owner`'s stored transcripts: a sum of their sessions' `stored_bytes`.
    async fn stored_bytes<'c>(e: impl Executor<'c, Database = Self>, owner: &str) -> Result<i64, sqlx::Error> {
        // Postgres sums BIGINTs as NUMERIC.
        sqlx::query_scalar("SELECT CAST(COALESCE(SUM(stored_bytes), 0) AS BIGINT) FROM sessions WHERE owner = $1")
            .bind(owner)
            .fetch_one(e)
            .await
    }

    /// Up to `max_chunks` chunks of `owner`'s session `id` holding updates after `after_seq`.
    async fn read_events(
        conn: &mut Self::Connection,
        owner: &str,
        id: &str,
        after_seq: i64,
        max_chunks: u32,
    ) -> Result<Vec<EventChunk>, sqlx::Error> {
        let sizes: Vec<i64> = sqlx::query_scalar(Self::CHUNK_SIZES)
            .bind(id)
            .bind(owner)
            .bind(after_seq)
            .bind(i64::from(max_chunks))
            .fetch_all(&mut *conn)
            .await?;
        let take = page_len(&sizes, super::READ_PAGE_BYTES);
        if take == 0 {
            return Ok(Vec::new());
        }
        // The same first chunks: chunks are only ever added after the last one.
        sqlx::query_as(Self::READ_EVENTS)
            .bind(id)
            .bind(owner)
            .bind(after_seq)
            .bind(take as i64)
            .fetch_all(conn)
            .await
    }

    /// One page of `owner`'s sessions (see [`super::Store::list_sessions`]); a search starts from
    /// `index` when that is the cheaper way.
    ///
    /// The index is global and the list is one owner's, newest first, so no one way is always
    /// right. Starting from the index costs a row lookup for every session it finds, of any
    /// owner. Testing the owner's sessions in list order stops once a page is full: at once when
    /// matches are common, after all of them when they are rare. So, each step only when the one
    /// before did not answer:
    /// 1. an owner with fewer than [`SEARCH_PROBE`] sessions is scanned (cheap any way);
    /// 2. the owner's newest [`SEARCH_PROBE`] sessions are tested in list order: a page from them
    ///    is the answer (a search common among this owner's sessions);
    /// 3. the index counts what it finds, up to [`SEARCH_PROBE`] (FTS5 walks its doclists
    ///    lazily; Postgres reads `session_search` in order when a search is common): fewer, and
    ///    the page starts from it; more (common among everyone's sessions, rare among this
    ///    owner's), and the owner's sessions are scanned, as before the index.
    ///
    /// Only the count of other owners' sessions is used, never their rows.
    async fn list_sessions(
        conn: &mut Self::Connection,
        owner: &str,
        filter: &ListFilter,
        after: Option<Position<'_>>,
        limit: u32,
        index: Option<SearchIndex>,
    ) -> Result<Vec<SessionRecord>, sqlx::Error>
    where
        Self::Connection: RunList,
    {
        let list = async |conn: &mut Self::Connection, by| conn.run_list(owner, filter, after, limit, by).await;
        let Some(search) = filter.search.as_deref() else {
            return list(conn, SearchBy::Scan).await;
        };
        let owned: i64 =
            sqlx::query_scalar("SELECT count(*) FROM (SELECT 1 FROM sessions WHERE owner = $1 LIMIT $2) owned")
                .bind(owner)
                .bind(SEARCH_PROBE)
                .fetch_one(&mut *conn)
                .await?;
        if owned < SEARCH_PROBE {
            return list(conn, SearchBy::Scan).await;
        }
        let newest = list(&mut *conn, SearchBy::Newest(SEARCH_PROBE)).await?;
        if newest.len() >= limit as usize {
            return Ok(newest);
        }
        let Some(index) = index.filter(|i| i.can_find(search)) else {
            return list(conn, SearchBy::Scan).await;
        };
        let (sql, key) = match index {
            SearchIndex::Fts5 => (
                "SELECT count(*) FROM (SELECT 1 FROM session_search WHERE session_search MATCH $1 LIMIT $2) found",
                fts5_phrase(search),
            ),
            SearchIndex::Trigram => (
                "SELECT count(*) FROM (SELECT 1 FROM session_search
                 WHERE title ILIKE $1 ESCAPE '\\' OR meta ILIKE $1 ESCAPE '\\' LIMIT $2) found",
                like_pattern(search),
            ),
        };
        let found: i64 = sqlx::query_scalar(sql)
            .bind(key)
            .bind(SEARCH_PROBE)
            .persistent(false)
            .fetch_one(&mut *conn)
            .await?;
        let by = if found < SEARCH_PROBE {
            SearchBy::Index(index)
        } else {
            SearchBy::Scan
        };
        list(conn, by).await
    }

    /// The cursor key: a fresh random one stored by the first replica to ask, then that one.
    async fn cursor_key(conn: &mut Self::Connection) -> Result<Vec<u8>, sqlx::Error> {
        let fresh: [u8; 32] = rand::random();
        sqlx::query(
            "INSERT INTO gateway_settings (name, value) VALUES ('cursor_key', $1) ON CONFLICT (name) DO NOTHING",
        )
        .bind(fresh.as_slice())
        .execute(&mut *conn)
        .await?;
        sqlx::query_scalar("SELECT value FROM gateway_settings WHERE name = 'cursor_key'")
            .fetch_one(&mut *conn)
            .await
    }
}

impl Sql for Sqlite {
    const GREATEST: &'static str = "MAX";
    const LIKE: &'static str = "LIKE";
    const SEARCH_INDEX: SearchIndex = SearchIndex::Fts5;
    const LAST_SEQ: &'static str = concat!(
        "MAX(last_seq, COALESCE((SELECT seq_to FROM session_events e WHERE ",
        chunk_of!("e", "sessions"),
        " ORDER BY e.key DESC LIMIT 1), 0)) AS last_seq"
    );
    // A chunk's key is `(session number << 32) | seq_from` ([`chunk_key`]): a session's chunks
    // are one range of the table's rowid. `?N` placeholders, so that the transcript writer's own
    // connection (rusqlite) runs the same text. A seq_from past 32 bits fails the table's CHECK.
    const INSERT_CHUNK: &'static str = concat!(
        "INSERT INTO session_events (key, session_id, seq_from, seq_to, payload, created_at)
         SELECT ",
        chunk_key!("s", "?2"),
        ", ?1, ?2, ?3, ?4, ?5 FROM sessions s WHERE s.id = ?1
         ON CONFLICT DO NOTHING"
    );
    const READ_EVENTS: &'static str =
        sqlite_chunks_after!("e.seq_from, e.seq_to, e.payload, e.created_at AS stored_at");
    const CHUNK_SIZES: &'static str = sqlite_chunks_after!("octet_length(e.payload)");

    fn rows_affected(done: &Self::QueryResult) -> u64 {
        done.rows_affected()
    }
}

impl Sql for Postgres {
    const GREATEST: &'static str = "GREATEST";
    const LIKE: &'static str = "ILIKE";
    const SEARCH_INDEX: SearchIndex = SearchIndex::Trigram;
    const LAST_SEQ: &'static str = "GREATEST(last_seq, COALESCE((SELECT seq_to FROM session_events e
        WHERE e.session_id = sessions.id ORDER BY seq_from DESC LIMIT 1), 0)) AS last_seq";
    const INSERT_CHUNK: &'static str =
        pg_insert_chunks!("SELECT $1, $2, $3, $4, $5 WHERE EXISTS (SELECT 1 FROM sessions WHERE id = $1)");
    const READ_EVENTS: &'static str = pg_chunks_after!("e.seq_from, e.seq_to, e.payload, e.created_at AS stored_at");
    const CHUNK_SIZES: &'static str = pg_chunks_after!("CAST(octet_length(e.payload) AS BIGINT)");

    fn rows_affected(done: &Self::QueryResult) -> u64 {
        done.rows_affected()
    }
}

/// Logs a transcript chunk the database did not take. Such a chunk is skipped, never retried: a
/// batch that failed on it would block every session's transcript behind it.
pub(super) fn note_unstored(session: &str, chunk: &EventChunk, rows: u64) {
    if rows == 0 {
        tracing::warn!(
            session,
            seq_from = chunk.seq_from,
            seq_to = chunk.seq_to,
            "transcript chunk not stored: the session was deleted, or another replica already stored these sequence numbers"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::page_len;

    #[test]
    fn a_page_ends_at_the_first_chunk_past_the_budget() {
        assert_eq!(page_len(&[], 100), 0);
        assert_eq!(page_len(&[500], 100), 1, "one chunk at least, however large");
        assert_eq!(page_len(&[40, 40, 40, 40], 100), 3, "the third starts at 80, within");
        assert_eq!(page_len(&[60, 40, 10], 100), 2, "the third starts at 100, past");
        assert_eq!(page_len(&[1; 10], 100), 10);
    }
}
