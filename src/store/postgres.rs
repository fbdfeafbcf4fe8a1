//! The shared production store: Postgres, which several replicas can use at once.
//!
//! Row-level security (migration `…02_row_level_security`) is a second wall behind the owner
//! conditions in every query: each method runs in a transaction that first names the user it acts
//! for (`acp_gateway.user`) or, for the transcript writer and the cursor key, declares itself
//! system work (`acp_gateway.system`). The settings are transaction-local, so a pooled connection
//! never carries one user's identity into the next transaction. The statements themselves are in
//! [`super::sql`]; this file only picks the transaction each one runs in.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Postgres, Transaction};

use super::sql::Sql;
use super::{EventChunk, ListFilter, NewSession, Position, SessionRecord, SessionWrite, Store, StoreError};

/// Longest wait for a pooled connection (see [`super::ACQUIRE_TIMEOUT`]).
const ACQUIRE_TIMEOUT: Duration = super::ACQUIRE_TIMEOUT;

/// A Postgres-backed [`Store`].
#[derive(Debug, Clone)]
pub struct PgStore {
    /// Each method borrows one connection for one transaction, whose row-level security setting
    /// ends with it.
    pool: PgPool,
}

impl PgStore {
    /// Connects to `url` and migrates the database.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(16)
            // A database that does not answer fails a request in time (the contract's 5 s)
            // instead of queueing it; connections are opened again once it is back.
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect(url)
            .await?;
        sqlx::migrate!("./migrations/postgres").run(&pool).await?;
        let bypass: Option<bool> =
            sqlx::query_scalar("SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user")
                .fetch_optional(&pool)
                .await?;
        if bypass == Some(true) {
            tracing::warn!(
                "the database role is a superuser or has BYPASSRLS, so row-level security does not \
                 apply to it; run the gateway as an ordinary role (the owner of its tables)"
            );
        }
        Ok(Self { pool })
    }

    /// A transaction in which row-level security shows only `owner`'s rows.
    async fn as_user(&self, owner: &str) -> Result<Transaction<'static, Postgres>, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT set_config('acp_gateway.user', $1, true)")
            .bind(owner)
            .execute(&mut *tx)
            .await?;
        Ok(tx)
    }

    /// A transaction for work done for every user (transcript writes, settings).
    async fn as_system(&self) -> Result<Transaction<'static, Postgres>, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT set_config('acp_gateway.system', 'on', true)")
            .execute(&mut *tx)
            .await?;
        Ok(tx)
    }
}

#[async_trait]
impl Store for PgStore {
    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn create_session(&self, s: &NewSession<'_>) -> Result<(), StoreError> {
        let mut tx = self.as_user(s.owner).await?;
        Postgres::insert_session(&mut *tx, s).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn get_session(&self, owner: &str, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        let mut tx = self.as_user(owner).await?;
        let record = Postgres::get_session(&mut *tx, owner, id).await?;
        tx.commit().await?;
        Ok(record)
    }

    async fn list_sessions(
        &self,
        owner: &str,
        filter: &ListFilter,
        after: Option<Position<'_>>,
        limit: u32,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        let mut tx = self.as_user(owner).await?;
        let mut q = super::list_query::<Postgres>("", owner, filter, after, limit, Postgres::LIKE);
        let records = q.build_query_as().fetch_all(&mut *tx).await?;
        tx.commit().await?;
        Ok(records)
    }

    async fn delete_session(&self, owner: &str, id: &str) -> Result<bool, StoreError> {
        let mut tx = self.as_user(owner).await?;
        // The transcript goes with it: Postgres always enforces the ON DELETE CASCADE (its
        // referential actions run as the tables' owner, outside row-level security).
        let deleted = Postgres::delete_session(&mut *tx, owner, id).await?;
        tx.commit().await?;
        Ok(deleted)
    }

    async fn write_batch(&self, writes: &[SessionWrite]) -> Result<(), StoreError> {
        let mut tx = self.as_system().await?;
        Postgres::write_batch(&mut tx, writes).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn read_events(
        &self,
        owner: &str,
        id: &str,
        after_seq: i64,
        max_chunks: u32,
    ) -> Result<Vec<EventChunk>, StoreError> {
        let mut tx = self.as_user(owner).await?;
        let chunks = Postgres::read_events(&mut *tx, owner, id, after_seq, max_chunks).await?;
        tx.commit().await?;
        Ok(chunks)
    }

    async fn cursor_key(&self) -> Result<Vec<u8>, StoreError> {
        let mut tx = self.as_system().await?;
        let key = Postgres::cursor_key(&mut tx).await?;
        tx.commit().await?;
        Ok(key)
    }
}
