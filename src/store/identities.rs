//! The statements behind `user_identities`: which provider account (`iss`, `sub`) a user name
//! belongs to, bound on its first sign-in through a provider. Written once for both databases;
//! the gateway's own bookkeeping (on Postgres its login role, never a user's request).

use sqlx::{Database, Encode, Executor, IntoArguments, Postgres, Sqlite, Type};

/// The `user_identities` statements, for any database that can run them.
pub(crate) trait IdentitySql: Database
where
    for<'q> Self::Arguments<'q>: IntoArguments<'q, Self>,
    for<'c> &'c mut Self::Connection: Executor<'c, Database = Self>,
    for<'q> &'q str: Encode<'q, Self> + Type<Self>,
    for<'q> i64: Encode<'q, Self> + Type<Self>,
    for<'r> (String, String): sqlx::FromRow<'r, Self::Row>,
{
    /// Binds `user` to `(issuer, subject)` unless it is bound already; the binding in force.
    async fn bind_identity<'c>(
        e: impl Executor<'c, Database = Self> + Copy,
        user: &str,
        issuer: &str,
        subject: &str,
        at: i64,
    ) -> Result<(String, String), sqlx::Error> {
        sqlx::query(
            "INSERT INTO user_identities (user_name, issuer, subject, bound_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (user_name) DO NOTHING",
        )
        .bind(user)
        .bind(issuer)
        .bind(subject)
        .bind(at)
        .execute(e)
        .await?;
        sqlx::query_as("SELECT issuer, subject FROM user_identities WHERE user_name = $1")
            .bind(user)
            .fetch_one(e)
            .await
    }
}

impl IdentitySql for Sqlite {}
impl IdentitySql for Postgres {}
