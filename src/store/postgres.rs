//! The shared production store: Postgres, which several replicas can use at once.
//!
//! Row-level security (migration `…02_row_level_security`) is a second wall behind the owner
//! conditions in every query: each method runs in a transaction that first names the user it acts
//! for (`acp_gateway.user`) or, for the transcript writer and the cursor key, declares itself
//! system work (`acp_gateway.system`). The settings are transaction-local, so a pooled connection
//! never carries one user's identity into the next transaction. The statements themselves are in
//! [`super::sql`]; this file only picks the transaction each one runs in.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions};
use sqlx::{Postgres, Transaction};

use super::sql::{RunList, SearchBy, Sql};
use super::{EventChunk, ListFilter, NewSession, Position, SessionRecord, SessionWrite, Store, StoreError};

/// Longest wait for a pooled connection (see [`super::ACQUIRE_TIMEOUT`]).
const ACQUIRE_TIMEOUT: Duration = super::ACQUIRE_TIMEOUT;

/// A Postgres-backed [`Store`].
#[derive(Debug, Clone)]
pub struct PgStore {
    /// Each method borrows one connection for one transaction, whose row-level security setting
    /// ends with it.
    pool: PgPool,
    /// Whether `session/list` searches can start from the pg_trgm indexes on `session_search`:
    /// they exist (pg_trgm could be created), and this role owns the table, so its row-level
    /// security, which keeps `ILIKE` from any index, does not apply to it.
    search_index: bool,
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
        let search_index: bool = sqlx::query_scalar(
            "SELECT to_regclass('session_search_title_trgm') IS NOT NULL
                AND to_regclass('session_search_meta_trgm') IS NOT NULL
                AND EXISTS (SELECT 1 FROM pg_class WHERE oid = to_regclass('session_search')
                            AND pg_has_role(current_user, relowner, 'USAGE'))",
        )
        .fetch_one(&pool)
        .await?;
        if !search_index {
            tracing::warn!(
                "session/list searches scan each user's sessions: the pg_trgm indexes on session_search are \
                 missing (see migration 20261123000001_session_search.sql to add them) or this role does not own it"
            );
        }
        Ok(Self { pool, search_index })
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

impl RunList for PgConnection {
    async fn run_list(
        &mut self,
        owner: &str,
        filter: &ListFilter,
        after: Option<Position<'_>>,
        limit: u32,
        by: SearchBy,
    ) -> Result<Vec<SessionRecord>, sqlx::Error> {
        let mut q = super::list_query::<Postgres>("", owner, filter, after, limit, Postgres::LIKE, by);
        q.build_query_as()
            .persistent(filter.search.is_none())
            .fetch_all(self)
            .await
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

    async fn session_controls(&self, owner: &str, id: &str) -> Result<Option<String>, StoreError> {
        let mut tx = self.as_user(owner).await?;
        let controls = Postgres::session_controls(&mut *tx, owner, id).await?;
        tx.commit().await?;
        Ok(controls)
    }

    async fn list_sessions(
        &self,
        owner: &str,
        filter: &ListFilter,
        after: Option<Position<'_>>,
        limit: u32,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        let mut tx = self.as_user(owner).await?;
        let index = self.search_index.then_some(Postgres::SEARCH_INDEX);
        let records = Postgres::list_sessions(&mut tx, owner, filter, after, limit, index).await?;
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

    async fn write_batch_leased(&self, writes: &[SessionWrite], holder: &str) -> Result<Vec<Arc<str>>, StoreError> {
        let mut tx = self.as_system().await?;
        // One statement: which of these sessions' leases `holder` holds (their rows locked until
        // commit, so a takeover waits for this write and then sees all of it), and a NOTIFY for
        // each, delivered by Postgres only if and when this transaction commits.
        let (ids, seqs): (Vec<&str>, Vec<i64>) = writes
            .iter()
            .filter_map(|w| w.chunk.as_ref().map(|c| (&*w.session_id, c.seq_to)))
            .unzip();
        let held: Vec<String> = if ids.is_empty() {
            Vec::new()
        } else {
            sqlx::query_scalar(
                "SELECT l.session_id, pg_notify('acp_session_committed', l.session_id || ':' || w.seq_to)
                 FROM session_leases l
                 JOIN unnest($1::text[], $2::bigint[]) AS w(session_id, seq_to) ON w.session_id = l.session_id
                 WHERE l.replica = $3
                 FOR SHARE OF l",
            )
            .bind(&ids)
            .bind(&seqs)
            .bind(holder)
            .fetch_all(&mut *tx)
            .await?
        };
        let is_refused = |w: &SessionWrite| w.chunk.is_some() && !held.iter().any(|h| **h == *w.session_id);
        let mut refused: Vec<Arc<str>> = Vec::new();
        for w in writes.iter().filter(|w| is_refused(w)) {
            if !refused.contains(&w.session_id) {
                refused.push(w.session_id.clone());
            }
        }
        if refused.is_empty() {
            Postgres::write_batch(&mut tx, writes).await?;
        } else {
            // Their message counts and titles still count; their updates are not stored.
            let kept: Vec<SessionWrite> = writes
                .iter()
                .map(|w| {
                    if is_refused(w) {
                        SessionWrite {
                            chunk: None,
                            ..w.clone()
                        }
                    } else {
                        w.clone()
                    }
                })
                .collect();
            Postgres::write_batch(&mut tx, &kept).await?;
        }
        tx.commit().await?;
        Ok(refused)
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

    async fn stored_bytes(&self, owner: &str) -> Result<u64, StoreError> {
        let mut tx = self.as_user(owner).await?;
        let bytes = Postgres::stored_bytes(&mut *tx, owner).await?;
        tx.commit().await?;
        Ok(u64::try_from(bytes).unwrap_or(0))
    }
}
