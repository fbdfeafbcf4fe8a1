//! A session's life after its last prompt, written once for both databases: archiving (hidden
//! from the default list, restorable) and retention (sessions not updated for a while, deleted
//! in bounded batches across users).

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Postgres, Sqlite, Type};

/// A session retention may delete.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct StaleSession {
    /// Its user.
    pub owner: String,
    /// Its id.
    pub id: String,
    /// Bytes of its stored transcript (what deleting it frees).
    pub stored_bytes: i64,
    /// When it was last updated (epoch µs): with `id`, where the next batch starts.
    pub updated_at: i64,
}

/// The statements, for any database that can run them.
pub(crate) trait LifecycleSql: Database
where
    for<'q> Self::Arguments<'q>: IntoArguments<'q, Self>,
    for<'c> &'c mut Self::Connection: Executor<'c, Database = Self>,
    for<'q> &'q str: Encode<'q, Self> + Type<Self>,
    for<'q> i64: Encode<'q, Self> + Type<Self>,
    for<'q> Option<i64>: Encode<'q, Self> + Type<Self>,
    for<'r> StaleSession: FromRow<'r, Self::Row>,
    for<'r> (i64,): FromRow<'r, Self::Row>,
{
    /// What else keeps a session from retention: Postgres, a live replica's lease on it.
    const NOT_HELD: &'static str;

    /// Archives (`Some(at)`) or restores (`None`) `owner`'s session `id`; whether there was one.
    async fn set_archived<'c>(
        e: impl Executor<'c, Database = Self>,
        owner: &str,
        id: &str,
        at: Option<i64>,
    ) -> Result<bool, sqlx::Error> {
        let done: Option<(i64,)> = sqlx::query_as(
            "UPDATE sessions SET archived_at = $3 WHERE id = $1 AND owner = $2 RETURNING CAST(1 AS BIGINT)",
        )
        .bind(id)
        .bind(owner)
        .bind(at)
        .fetch_optional(e)
        .await?;
        Ok(done.is_some())
    }

    /// Up to `limit` sessions of any user last updated before `before`, oldest first, after
    /// the session `after` (its `updated_at` and id) when given.
    async fn stale_sessions<'c>(
        e: impl Executor<'c, Database = Self>,
        before: i64,
        after: Option<(i64, &str)>,
        limit: i64,
    ) -> Result<Vec<StaleSession>, sqlx::Error> {
        let (t, id) = after.unwrap_or((i64::MIN, ""));
        sqlx::query_as(
            "SELECT owner, id, stored_bytes, updated_at FROM sessions
             WHERE updated_at < $1 AND (updated_at > $2 OR (updated_at = $2 AND id > $3))
             ORDER BY updated_at, id LIMIT $4",
        )
        .bind(before)
        .bind(t)
        .bind(id)
        .bind(limit)
        .fetch_all(e)
        .await
    }

    /// Deletes those of `sessions` still not updated since `before` that nobody holds, with
    /// their transcripts (Postgres's `ON DELETE CASCADE`, SQLite's trigger), on `conn` (the
    /// caller's transaction); the ones deleted.
    async fn delete_stale(
        conn: &mut Self::Connection,
        sessions: &[StaleSession],
        before: i64,
    ) -> Result<Vec<StaleSession>, sqlx::Error> {
        let mut deleted = Vec::new();
        for s in sessions {
            if Self::delete_one_stale(&mut *conn, s, before).await? {
                deleted.push(s.clone());
            }
        }
        Ok(deleted)
    }

    /// Deletes `s` if it is still not updated since `before` and nobody holds it; whether it was.
    async fn delete_one_stale(conn: &mut Self::Connection, s: &StaleSession, before: i64) -> Result<bool, sqlx::Error> {
        let sql = format!(
            "DELETE FROM sessions WHERE id = $1 AND owner = $2 AND updated_at < $3 {} RETURNING CAST(1 AS BIGINT)",
            Self::NOT_HELD
        );
        let done: Option<(i64,)> = sqlx::query_as(&sql)
            .bind(s.id.as_str())
            .bind(s.owner.as_str())
            .bind(before)
            .fetch_optional(&mut *conn)
            .await?;
        Ok(done.is_some())
    }
}

impl LifecycleSql for Sqlite {
    const NOT_HELD: &'static str = "";
}

impl LifecycleSql for Postgres {
    const NOT_HELD: &'static str = "AND NOT EXISTS (SELECT 1 FROM session_leases l
        WHERE l.session_id = sessions.id AND l.expires_at > now())";
}
