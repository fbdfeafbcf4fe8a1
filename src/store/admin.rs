//! What the admin routes read of sessions across users, written once for both databases: each
//! user's sessions (count, stored bytes, last activity). Never a transcript.

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Postgres, Sqlite, Type};

/// One user as the store knows them.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct UserOverview {
    /// The user.
    pub owner: String,
    /// Their stored sessions.
    pub sessions: i64,
    /// Bytes of their stored transcripts.
    pub stored_bytes: i64,
    /// When one of their sessions last changed (epoch µs).
    pub last_active: i64,
}

/// The admin statements, for any database that can run them.
pub(crate) trait AdminSql: Database
where
    for<'q> Self::Arguments<'q>: IntoArguments<'q, Self>,
    for<'c> &'c mut Self::Connection: Executor<'c, Database = Self>,
    for<'q> &'q str: Encode<'q, Self> + Type<Self>,
    for<'q> i64: Encode<'q, Self> + Type<Self>,
    for<'r> UserOverview: FromRow<'r, Self::Row>,
{
    /// Every user with a stored session, most recently active first (at most `limit`).
    async fn users_overview<'c>(
        e: impl Executor<'c, Database = Self>,
        limit: i64,
    ) -> Result<Vec<UserOverview>, sqlx::Error> {
        sqlx::query_as(
            "SELECT owner, CAST(COUNT(*) AS BIGINT) AS sessions,
                    CAST(COALESCE(SUM(stored_bytes), 0) AS BIGINT) AS stored_bytes,
                    CAST(MAX(updated_at) AS BIGINT) AS last_active
             FROM sessions GROUP BY owner ORDER BY last_active DESC LIMIT $1",
        )
        .bind(limit)
        .fetch_all(e)
        .await
    }
}

impl AdminSql for Sqlite {}
impl AdminSql for Postgres {}
