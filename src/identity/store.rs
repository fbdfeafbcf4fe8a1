//! Identity's tables: sign-ins through the identity provider (`web_sessions`) and the provider
//! accounts user names are bound to (`user_identities`), as [`WebSessions`], with their statements
//! written once for both databases. The provider's tokens are only ever stored sealed
//! (`infra::sealing::Sealer`). This is the gateway's own bookkeeping: on Postgres it runs as the
//! gateway's login role, never as a user's request.

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Postgres, Sqlite, Type};

use crate::infra::clock::now_secs;
use crate::store::{Backend, Db, StoreError, statement};

/// How long an ended sign-in through the identity provider is kept (seconds), so that every
/// replica sees it ended before it is forgotten.
pub const WEB_SESSIONS_KEPT_SECS: i64 = 7 * 24 * 3600;

/// One sign-in as stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct WebSession {
    /// The `sid` in the gateway's cookie.
    pub id: String,
    /// Who signed in.
    pub owner: String,
    /// Fingerprint of the key that sealed `sealed`.
    pub key_id: String,
    /// Its nonce.
    pub nonce: Vec<u8>,
    /// The provider's tokens (refresh and ID token), sealed.
    pub sealed: Vec<u8>,
    /// When (epoch seconds) it began, ends, and was last checked with the provider.
    pub created_at: i64,
    /// When it ends.
    pub expires_at: i64,
    /// When the provider last said the person may stay.
    pub checked_at: i64,
    /// When it was ended (sign-out, or the provider no longer lets the person in).
    pub revoked_at: Option<i64>,
}

const COLUMNS: &str = "id, owner, key_id, nonce, sealed, created_at, expires_at, checked_at, revoked_at";

/// The `web_sessions` statements, for any database that can run them.
pub(crate) trait WebSessionSql: Database
where
    for<'q> Self::Arguments<'q>: IntoArguments<'q, Self>,
    for<'c> &'c mut Self::Connection: Executor<'c, Database = Self>,
    for<'q> &'q str: Encode<'q, Self> + Type<Self>,
    for<'q> &'q [u8]: Encode<'q, Self> + Type<Self>,
    for<'q> i64: Encode<'q, Self> + Type<Self>,
    for<'r> WebSession: FromRow<'r, Self::Row>,
{
    /// Stores a new sign-in, or what a check changed (tokens, `checked_at`) in one.
    async fn put_web_session<'c>(e: impl Executor<'c, Database = Self>, s: &WebSession) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO web_sessions (id, owner, key_id, nonce, sealed, created_at, expires_at, checked_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (id) DO UPDATE SET key_id = excluded.key_id, nonce = excluded.nonce,
                 sealed = excluded.sealed, checked_at = excluded.checked_at",
        )
        .bind(s.id.as_str())
        .bind(s.owner.as_str())
        .bind(s.key_id.as_str())
        .bind(s.nonce.as_slice())
        .bind(s.sealed.as_slice())
        .bind(s.created_at)
        .bind(s.expires_at)
        .bind(s.checked_at)
        .execute(e)
        .await?;
        Ok(())
    }

    /// The sign-in `id`.
    async fn web_session<'c>(
        e: impl Executor<'c, Database = Self>,
        id: &str,
    ) -> Result<Option<WebSession>, sqlx::Error> {
        let sql = format!("SELECT {COLUMNS} FROM web_sessions WHERE id = $1");
        sqlx::query_as(&sql).bind(id).fetch_optional(e).await
    }

    /// Ends the sign-in `id` (kept, revoked, so every replica sees it ended).
    async fn revoke_web_session<'c>(
        e: impl Executor<'c, Database = Self>,
        id: &str,
        at: i64,
        reason: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE web_sessions SET revoked_at = $2, revoked_reason = $3 WHERE id = $1 AND revoked_at IS NULL",
        )
        .bind(id)
        .bind(at)
        .bind(reason)
        .execute(e)
        .await?;
        Ok(())
    }

    /// Live sign-ins last checked before `checked_before`, oldest first, at most `limit`.
    async fn due_web_sessions<'c>(
        e: impl Executor<'c, Database = Self>,
        checked_before: i64,
        now: i64,
        limit: i64,
    ) -> Result<Vec<WebSession>, sqlx::Error> {
        let sql = format!(
            "SELECT {COLUMNS} FROM web_sessions WHERE revoked_at IS NULL AND checked_at < $1 AND expires_at > $2
             ORDER BY checked_at LIMIT $3"
        );
        sqlx::query_as(&sql)
            .bind(checked_before)
            .bind(now)
            .bind(limit)
            .fetch_all(e)
            .await
    }

    /// Takes the sign-in `id` for a check: moves `checked_at` from `seen` to `now`; false when
    /// another replica took it first (its `checked_at` moved already).
    async fn claim_web_session<'c>(
        e: impl Executor<'c, Database = Self>,
        id: &str,
        seen: i64,
        now: i64,
    ) -> Result<bool, sqlx::Error> {
        let taken: Vec<WebSession> = sqlx::query_as(&format!(
            "UPDATE web_sessions SET checked_at = $3 WHERE id = $1 AND checked_at = $2 AND revoked_at IS NULL RETURNING {COLUMNS}"
        ))
        .bind(id)
        .bind(seen)
        .bind(now)
        .fetch_all(e)
        .await?;
        Ok(!taken.is_empty())
    }

    /// Forgets sign-ins that ended before `before` (revoked or expired).
    async fn prune_web_sessions<'c>(e: impl Executor<'c, Database = Self>, before: i64) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM web_sessions WHERE expires_at < $1 OR revoked_at < $1")
            .bind(before)
            .execute(e)
            .await?;
        Ok(())
    }
}

impl WebSessionSql for Sqlite {}
impl WebSessionSql for Postgres {}

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

/// Sign-ins through the identity provider and the accounts user names are bound to, in the
/// database.
#[derive(Debug, Clone)]
pub struct WebSessions {
    db: Db,
}

impl WebSessions {
    /// Identity's tables in `db`.
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    /// Stores a sign-in through the identity provider, or what a check changed in it.
    pub async fn put(&self, s: &WebSession) -> Result<(), StoreError> {
        statement!(self.db, put_web_session(s))
    }

    /// The sign-in `id` (revoked ones too).
    pub async fn get(&self, id: &str) -> Result<Option<WebSession>, StoreError> {
        statement!(self.db, web_session(id))
    }

    /// Ends the sign-in `id`, saying why.
    pub async fn revoke(&self, id: &str, reason: &str) -> Result<(), StoreError> {
        statement!(self.db, revoke_web_session(id, now_secs() as i64, reason))
    }

    /// Live sign-ins last checked before `checked_before` (epoch seconds), oldest first; sign-ins
    /// that ended long ago are forgotten on the way.
    pub async fn due(&self, checked_before: i64, limit: i64) -> Result<Vec<WebSession>, StoreError> {
        let now = now_secs() as i64;
        statement!(self.db, prune_web_sessions(now - WEB_SESSIONS_KEPT_SECS))?;
        statement!(self.db, due_web_sessions(checked_before, now, limit))
    }

    /// Takes the sign-in `id` for a check (`checked_at` from `seen` to `now`); false when another
    /// replica took it first.
    pub async fn claim(&self, id: &str, seen: i64, now: i64) -> Result<bool, StoreError> {
        statement!(self.db, claim_web_session(id, seen, now))
    }

    /// Binds the user name `user` to the provider account `(issuer, subject)` unless it is bound
    /// already; the `(issuer, subject)` it is bound to.
    pub async fn bind_identity(&self, user: &str, issuer: &str, subject: &str) -> Result<(String, String), StoreError> {
        let now = now_secs() as i64;
        self.db
            .within(async {
                Ok(match self.db.backend() {
                    Backend::Sqlite(pool) => Sqlite::bind_identity(pool, user, issuer, subject, now).await?,
                    Backend::Postgres(pg) => Postgres::bind_identity(pg.pool(), user, issuer, subject, now).await?,
                })
            })
            .await
    }
}
