//! The SQL both stores run, written once.
//!
//! Each statement is a default method of [`Sql`], generic over the database and handed the
//! connection, pool or transaction to run on: a backend only decides *where* a statement runs
//! (SQLite: the pool, or a transaction for multi-statement work; Postgres: inside `as_user` or
//! `as_system`, for row-level security). Placeholders are `$N` on both databases: sqlx's SQLite
//! driver binds `$N` to the N-th value as Postgres does. The few words the two dialects spell
//! differently are the constants of [`Sql`].

use sqlx::{Database, Decode, Encode, Executor, FromRow, IntoArguments, Postgres, Sqlite, Type};

use super::{EventChunk, ListFilter, NewSession, Position, SessionRecord, SessionWrite};

/// Every column of `sessions`, in [`SessionRecord`] order.
const SESSION_COLUMNS: &str = "id, owner, agent, agent_session_id, cwd, additional_dirs, title, meta, message_count, last_seq, created_at, updated_at";

/// The statements of the [`super::Store`] contract, for any database that can run them.
///
/// The `where` clauses say what sqlx must be able to do with this database (bind our values,
/// build our rows); SQLite and Postgres both can, so the impls below only fill in the dialect.
pub(crate) trait Sql: Database
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
    for<'r> SessionRecord: FromRow<'r, Self::Row>,
    for<'r> EventChunk: FromRow<'r, Self::Row>,
{
    /// The larger of two values: SQLite's two-argument `MAX`, Postgres's `GREATEST`.
    const GREATEST: &'static str;
    /// Case-insensitive `LIKE` (for [`list_query`]): SQLite's `LIKE` already is (for ASCII),
    /// Postgres needs `ILIKE`.
    const LIKE: &'static str;

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
        let sql = format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE id = $1 AND owner = $2");
        sqlx::query_as(&sql).bind(id).bind(owner).fetch_optional(e).await
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

    /// Writes one flush on `conn` (the caller's transaction): each session's chunk, unless the
    /// session is gone or the chunk's seq range is stored already (then it is logged and skipped),
    /// and the session's counters and title.
    /// Stores one chunk of a session's updates (skipped, and logged, if that seq range is stored
    /// already, or the session was deleted meanwhile).
    async fn insert_chunk(
        conn: &mut Self::Connection,
        session_id: &str,
        chunk: &EventChunk,
        at: i64,
    ) -> Result<(), sqlx::Error> {
        let done = sqlx::query(
            "INSERT INTO session_events (session_id, seq_from, seq_to, payload, created_at)
             SELECT $1, $2, $3, $4, $5 WHERE EXISTS (SELECT 1 FROM sessions WHERE id = $1)
             ON CONFLICT (session_id, seq_from) DO NOTHING",
        )
        .bind(session_id)
        .bind(chunk.seq_from)
        .bind(chunk.seq_to)
        .bind(chunk.payload.as_str())
        .bind(at)
        .execute(&mut *conn)
        .await?;
        note_unstored(session_id, chunk, Self::rows_affected(&done));
        Ok(())
    }

    async fn write_batch(conn: &mut Self::Connection, writes: &[SessionWrite]) -> Result<(), sqlx::Error> {
        let update = format!(
            "UPDATE sessions SET
                last_seq = {greatest}(last_seq, $2),
                updated_at = {greatest}(updated_at, $3),
                message_count = message_count + $4,
                title = COALESCE($5, title, $6)
             WHERE id = $1",
            greatest = Self::GREATEST
        );
        for w in writes {
            if let Some(chunk) = &w.chunk {
                Self::insert_chunk(&mut *conn, &w.session_id, chunk, w.updated_at).await?;
            }
            sqlx::query(&update)
                .bind(&*w.session_id)
                .bind(w.chunk.as_ref().map_or(0, |c| c.seq_to))
                .bind(w.updated_at)
                .bind(w.prompts)
                .bind(w.agent_title.as_deref())
                .bind(w.prompt_title.as_deref())
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }

    /// Up to `max_chunks` chunks of `owner`'s session `id` holding updates after `after_seq`.
    async fn read_events<'c>(
        e: impl Executor<'c, Database = Self>,
        owner: &str,
        id: &str,
        after_seq: i64,
        max_chunks: u32,
    ) -> Result<Vec<EventChunk>, sqlx::Error> {
        sqlx::query_as(
            "SELECT e.seq_from, e.seq_to, e.payload FROM session_events e
             JOIN sessions s ON s.id = e.session_id
             WHERE e.session_id = $1 AND s.owner = $2 AND e.seq_to > $3
             ORDER BY e.seq_from LIMIT $4",
        )
        .bind(id)
        .bind(owner)
        .bind(after_seq)
        .bind(i64::from(max_chunks))
        .fetch_all(e)
        .await
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

    fn rows_affected(done: &Self::QueryResult) -> u64 {
        done.rows_affected()
    }
}

impl Sql for Postgres {
    const GREATEST: &'static str = "GREATEST";
    const LIKE: &'static str = "ILIKE";

    fn rows_affected(done: &Self::QueryResult) -> u64 {
        done.rows_affected()
    }
}

/// The `session/list` query, the same on both backends but for `like`, the backend's
/// case-insensitive `LIKE` operator. `prefix` goes before `SELECT` (`EXPLAIN` in the benchmark,
/// which shows the plan of exactly this query; empty otherwise).
pub fn list_query<'a, DB>(
    prefix: &str,
    owner: &'a str,
    filter: &'a ListFilter,
    after: Option<Position<'a>>,
    limit: u32,
    like: &str,
) -> sqlx::QueryBuilder<'a, DB>
where
    DB: sqlx::Database,
    &'a str: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    String: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
{
    let mut q = sqlx::QueryBuilder::new(format!("{prefix}SELECT {SESSION_COLUMNS} FROM sessions WHERE owner = "));
    q.push_bind(owner);
    if let Some(cwd) = &filter.cwd {
        q.push(" AND cwd = ").push_bind(cwd.as_str());
    }
    if let Some(t) = filter.created_after {
        q.push(" AND created_at > ").push_bind(t);
    }
    if let Some(t) = filter.created_before {
        q.push(" AND created_at < ").push_bind(t);
    }
    if let Some(t) = filter.updated_after {
        q.push(" AND updated_at > ").push_bind(t);
    }
    if let Some(s) = &filter.search {
        let pattern = like_pattern(s);
        q.push(format!(" AND (title {like} ")).push_bind(pattern.clone());
        q.push(format!(" ESCAPE '\\' OR meta {like} "))
            .push_bind(pattern)
            .push(" ESCAPE '\\')");
    }
    if let Some(pos) = after {
        // A row-value comparison: both databases start the index scan at the cursor with it
        // (the equivalent OR form makes them filter every row before it).
        q.push(" AND (updated_at, id) < (")
            .push_bind(pos.updated_at)
            .push(", ")
            .push_bind(pos.id)
            .push(")");
    }
    q.push(" ORDER BY updated_at DESC, id DESC LIMIT ")
        .push_bind(i64::from(limit));
    q
}

/// Logs a transcript chunk the database did not take. Such a chunk is skipped, never retried: a
/// batch that failed on it would block every session's transcript behind it.
fn note_unstored(session: &str, chunk: &EventChunk, rows: u64) {
    if rows == 0 {
        tracing::warn!(
            session,
            seq_from = chunk.seq_from,
            seq_to = chunk.seq_to,
            "transcript chunk not stored: the session was deleted, or another replica already stored these sequence numbers"
        );
    }
}

/// Escapes `%`, `_` and `\` for a `LIKE ... ESCAPE '\'` pattern and wraps it in `%`.
fn like_pattern(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('%');
    for c in s.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('%');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn like_escapes_wildcards() {
        assert_eq!(like_pattern("a%b_c\\"), "%a\\%b\\_c\\\\%");
    }
}
