//! Users' sealed rows: their agent keys and sealed lists (`user_secrets`) and their completed
//! agent logins (`agent_logins`), as [`SealedRows`], with the statements written once for both
//! databases. The store never sees a value: only what the gateway's sealer
//! (`infra::sealing::Sealer`) made of it. A user's settings, push subscriptions and agent sign-ins
//! all keep rows here, so it sits below those features rather than in one of them.

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Postgres, Sqlite, Type};

use super::{Backend, Db, StoreError};

/// One sealed key as stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct StoredSecret {
    /// The agent it is for.
    pub agent: String,
    /// The environment variable.
    pub name: String,
    /// Fingerprint of the key that sealed it.
    pub key_id: String,
    /// Its nonce.
    pub nonce: Vec<u8>,
    /// Ciphertext and tag.
    pub ciphertext: Vec<u8>,
    /// When it was set (epoch µs).
    pub updated_at: i64,
}

/// A sign-in a user completed on an agent (the credentials stay in their `HOME`).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct StoredLogin {
    /// The agent.
    pub agent: String,
    /// The auth method's id.
    pub method_id: String,
    /// When (epoch µs).
    pub signed_in_at: i64,
}

const COLUMNS: &str = "agent, name, key_id, nonce, ciphertext, updated_at";

/// The `user_secrets` statements, for any database that can run them.
pub(crate) trait SecretSql: Database
where
    for<'q> Self::Arguments<'q>: IntoArguments<'q, Self>,
    for<'c> &'c mut Self::Connection: Executor<'c, Database = Self>,
    for<'q> &'q str: Encode<'q, Self> + Type<Self>,
    for<'q> &'q [u8]: Encode<'q, Self> + Type<Self>,
    for<'q> i64: Encode<'q, Self> + Type<Self>,
    for<'r> StoredSecret: FromRow<'r, Self::Row>,
    for<'r> StoredLogin: FromRow<'r, Self::Row>,
{
    /// Sets (or replaces) one of `owner`'s keys.
    async fn put_secret<'c>(
        e: impl Executor<'c, Database = Self>,
        owner: &str,
        s: &StoredSecret,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO user_secrets (owner, agent, name, key_id, nonce, ciphertext, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (owner, agent, name) DO UPDATE SET key_id = excluded.key_id, nonce = excluded.nonce,
                 ciphertext = excluded.ciphertext, updated_at = excluded.updated_at",
        )
        .bind(owner)
        .bind(s.agent.as_str())
        .bind(s.name.as_str())
        .bind(s.key_id.as_str())
        .bind(s.nonce.as_slice())
        .bind(s.ciphertext.as_slice())
        .bind(s.updated_at)
        .execute(e)
        .await?;
        Ok(())
    }

    /// `owner`'s keys for `agent`, by name.
    async fn secrets_for<'c>(
        e: impl Executor<'c, Database = Self>,
        owner: &str,
        agent: &str,
    ) -> Result<Vec<StoredSecret>, sqlx::Error> {
        let sql = format!("SELECT {COLUMNS} FROM user_secrets WHERE owner = $1 AND agent = $2 ORDER BY name");
        sqlx::query_as(&sql).bind(owner).bind(agent).fetch_all(e).await
    }

    /// Every key of `owner`, by agent and name.
    async fn all_secrets<'c>(
        e: impl Executor<'c, Database = Self>,
        owner: &str,
    ) -> Result<Vec<StoredSecret>, sqlx::Error> {
        let sql = format!("SELECT {COLUMNS} FROM user_secrets WHERE owner = $1 ORDER BY agent, name");
        sqlx::query_as(&sql).bind(owner).fetch_all(e).await
    }

    /// Removes `owner`'s keys for `agent`; how many there were.
    async fn delete_secrets<'c>(
        e: impl Executor<'c, Database = Self>,
        owner: &str,
        agent: &str,
    ) -> Result<u64, sqlx::Error> {
        // RETURNING: sqlx's result types share no trait for the count.
        let sql = format!("DELETE FROM user_secrets WHERE owner = $1 AND agent = $2 RETURNING {COLUMNS}");
        let gone: Vec<StoredSecret> = sqlx::query_as(&sql).bind(owner).bind(agent).fetch_all(e).await?;
        Ok(gone.len() as u64)
    }

    /// Records that `owner` signed in to `agent` with `method_id` (replacing an earlier one).
    async fn put_login<'c>(
        e: impl Executor<'c, Database = Self>,
        owner: &str,
        login: &StoredLogin,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO agent_logins (owner, agent, method_id, signed_in_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (owner, agent) DO UPDATE SET method_id = excluded.method_id, signed_in_at = excluded.signed_in_at",
        )
        .bind(owner)
        .bind(login.agent.as_str())
        .bind(login.method_id.as_str())
        .bind(login.signed_in_at)
        .execute(e)
        .await?;
        Ok(())
    }

    /// Every completed login of `owner`, by agent.
    async fn logins<'c>(e: impl Executor<'c, Database = Self>, owner: &str) -> Result<Vec<StoredLogin>, sqlx::Error> {
        sqlx::query_as("SELECT agent, method_id, signed_in_at FROM agent_logins WHERE owner = $1 ORDER BY agent")
            .bind(owner)
            .fetch_all(e)
            .await
    }

    /// Forgets `owner`'s login to `agent` (they signed out).
    async fn delete_login<'c>(
        e: impl Executor<'c, Database = Self>,
        owner: &str,
        agent: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM agent_logins WHERE owner = $1 AND agent = $2")
            .bind(owner)
            .bind(agent)
            .execute(e)
            .await?;
        Ok(())
    }
}

impl SecretSql for Sqlite {}
impl SecretSql for Postgres {}

/// Users' sealed rows and agent logins, in the database. Every call is request work for one
/// user: on Postgres it runs as the request role, under row-level security.
#[derive(Debug, Clone)]
pub struct SealedRows {
    db: Db,
}

/// Runs `$body` in a transaction of `$owner`'s (`$tx`: SQLite's, or Postgres's as the request
/// role), commits it, and gives back what `$body` gave.
macro_rules! as_owner {
    ($rows:expr, $owner:expr, |$db:ident, $tx:ident| $body:expr) => {{
        let rows = &$rows;
        rows.db
            .within(async {
                match rows.db.backend() {
                    Backend::Sqlite(pool) => {
                        type $db = Sqlite;
                        let mut $tx = pool.begin().await?;
                        let out = $body;
                        $tx.commit().await?;
                        Ok(out)
                    }
                    Backend::Postgres(pg) => {
                        type $db = Postgres;
                        let mut $tx = pg.as_user($owner).await?;
                        let out = $body;
                        $tx.commit().await?;
                        Ok(out)
                    }
                }
            })
            .await
    }};
}

impl SealedRows {
    /// The rows in `db`.
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    /// The same rows, each call answering within `limit` (see [`Db::bounded`]).
    pub fn bounded(&self, limit: std::time::Duration) -> Self {
        Self::new(self.db.bounded(limit))
    }

    /// Sets (or replaces) `owner`'s sealed rows, all in one transaction.
    pub async fn put(&self, owner: &str, secrets: &[StoredSecret]) -> Result<(), StoreError> {
        as_owner!(self, owner, |D, tx| {
            for s in secrets {
                D::put_secret(&mut *tx, owner, s).await?;
            }
        })
    }

    /// `owner`'s sealed rows for `agent`, or for every agent (`None`).
    pub async fn get(&self, owner: &str, agent: Option<&str>) -> Result<Vec<StoredSecret>, StoreError> {
        as_owner!(self, owner, |D, tx| match agent {
            Some(agent) => D::secrets_for(&mut *tx, owner, agent).await?,
            None => D::all_secrets(&mut *tx, owner).await?,
        })
    }

    /// Signs `owner` out of `agent`: removes their rows for it and the record of their login
    /// there, in one transaction; how many rows there were.
    pub async fn delete(&self, owner: &str, agent: &str) -> Result<u64, StoreError> {
        as_owner!(self, owner, |D, tx| {
            let n = D::delete_secrets(&mut *tx, owner, agent).await?;
            D::delete_login(&mut *tx, owner, agent).await?;
            n
        })
    }

    /// Records a sign-in `owner` completed on an agent (replacing the agent's earlier one).
    pub async fn put_login(&self, owner: &str, login: &StoredLogin) -> Result<(), StoreError> {
        as_owner!(self, owner, |D, tx| D::put_login(&mut *tx, owner, login).await?)
    }

    /// `owner`'s completed logins, by agent.
    pub async fn logins(&self, owner: &str) -> Result<Vec<StoredLogin>, StoreError> {
        as_owner!(self, owner, |D, tx| D::logins(&mut *tx, owner).await?)
    }
}
