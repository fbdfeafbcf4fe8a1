//! The shared production store: Postgres, which several replicas can use at once.
//!
//! Row-level security is a second wall behind the owner conditions in every query (migration
//! `…_request_role`, docs/operations.md "Postgres roles and row-level security"):
//! - request work, what the gateway does for one user, runs in a transaction that first switches
//!   to the role `acp_gateway_request` and names the user with an identity signed by the
//!   database's key ([`RequestIdentity`](super::pg_roles::RequestIdentity)), in one round
//!   trip. That role cannot bypass the policies, and they admit only the rows of the user whose
//!   signature checks out. With `request_database_url` its connections log in as a role of their
//!   own, so a statement that reset the role would be that login, not the tables' owner;
//! - system work (the transcript writer, the cursor key, and the replicas' leases and
//!   messages) runs as the login role, the tables' owner, which row-level security does
//!   not apply to: it sets nothing.
//!
//! Both settings are transaction-local, so a pooled connection never carries one user's identity,
//! or the request role, into the next transaction. The statements themselves are in
//! [`super::sql`]; this file only picks the transaction each one runs in. The transcript's
//! writes, which every update waits on, are Postgres's own: [`transcript`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Postgres;
use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions};

use super::admin::AdminSql;
use super::lifecycle::LifecycleSql;
use super::list_sql::{RunList, SearchBy};
use super::pg_roles::check_roles;
use super::sql::Sql;
use transcript::{SETTLE_ALL_BEHIND, is_chunk_only};

mod db;
mod transcript;

pub use db::PgDb;

use super::{
    ChunksStored, EventChunk, ListFilter, NewSession, Position, SessionRecord, SessionWrite, Store, StoreError,
};

/// Longest wait for a pooled connection (see [`super::ACQUIRE_TIMEOUT`]).
const ACQUIRE_TIMEOUT: Duration = super::ACQUIRE_TIMEOUT;

/// A Postgres-backed [`Store`].
#[derive(Debug, Clone)]
pub struct PgStore {
    /// The transactions of request work and of system work, which the features' tables share.
    db: PgDb,
    /// The transcript writer's connections: taken without the ping the request pool makes
    /// before handing one out (a round trip, ~150 µs on a busy 2-core machine, on the commit
    /// every update waits for). A connection that died meanwhile fails the write with an error
    /// the writer retries, on a new one.
    writes: PgPool,
    /// The connection the transcript writer keeps between its writes, and when it last wrote
    /// (see [`transcript`]).
    writer: Arc<transcript::KeptWriter>,
    /// Whether `session/list` searches can start from the pg_trgm indexes on `session_search`:
    /// they exist (pg_trgm could be created), and this role owns the table, so it can read it
    /// without row-level security, which keeps `ILIKE` from any index.
    search_index: bool,
}

impl PgStore {
    /// Connects to `url`, migrates the database, and checks that request work can run as the
    /// request role (warning about what weakens the wall). Request work logs in through
    /// `request_url` when it is given, and the check refuses a login there that could act as
    /// the tables' owner.
    pub async fn connect(url: &str, request_url: Option<&str>) -> Result<Self, StoreError> {
        // A database that does not answer fails a request in time (the contract's 5 s) instead
        // of queueing it; connections are opened again once it is back.
        let options = || {
            PgPoolOptions::new()
                .max_connections(16)
                .acquire_timeout(ACQUIRE_TIMEOUT)
        };
        let pool = options().connect(url).await?;
        sqlx::migrate!("./migrations/postgres").run(&pool).await?;
        let requests = match request_url {
            Some(r) => Some(options().connect(r).await.map_err(|e| {
                StoreError::Roles(format!(
                    "cannot log in through request_database_url (ACP_GATEWAY_REQUEST_DATABASE_URL): {e}"
                ))
            })?),
            None => None,
        };
        // Opened on the first write: a store that only reads (the CLI's admin commands) opens none.
        let writes = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .test_before_acquire(false)
            .connect_lazy(url)?;
        let identity = check_roles(&pool, requests.as_ref()).await?;
        let behind = sqlx::query(SETTLE_ALL_BEHIND).execute(&pool).await?.rows_affected();
        if behind > 0 {
            tracing::info!(
                sessions = behind,
                "sessions advanced past chunks stored before a gateway stopped"
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
        Ok(Self {
            db: PgDb {
                pool,
                requests,
                identity,
            },
            writes,
            writer: Arc::default(),
            search_index,
        })
    }

    /// The same database, for the features' repositories.
    pub fn db(&self) -> super::Db {
        super::Db::new(super::Backend::Postgres(self.db.clone()))
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
        sqlx::query("SELECT 1").execute(&self.db.pool).await?;
        if let Some(requests) = &self.db.requests {
            sqlx::query("SELECT 1").execute(requests).await?;
        }
        Ok(())
    }

    async fn create_session(&self, s: &NewSession<'_>) -> Result<(), StoreError> {
        let mut tx = self.db.as_user(s.owner).await?;
        Postgres::insert_session(&mut *tx, s).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn get_session(&self, owner: &str, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        let mut tx = self.db.as_user(owner).await?;
        let record = Postgres::get_session(&mut *tx, owner, id).await?;
        tx.commit().await?;
        Ok(record)
    }

    async fn session_controls(&self, owner: &str, id: &str) -> Result<Option<String>, StoreError> {
        let mut tx = self.db.as_user(owner).await?;
        let controls = Postgres::session_controls(&mut *tx, owner, id).await?;
        tx.commit().await?;
        Ok(controls)
    }

    async fn users_overview(&self, limit: i64) -> Result<Vec<super::UserOverview>, StoreError> {
        let mut tx = self.db.as_system().await?;
        let rows = Postgres::users_overview(&mut *tx, limit).await?;
        tx.commit().await?;
        Ok(rows)
    }

    async fn list_sessions(
        &self,
        owner: &str,
        filter: &ListFilter,
        after: Option<Position<'_>>,
        limit: u32,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        let index = self.search_index.then_some(Postgres::SEARCH_INDEX);
        // A search the trigram indexes can take runs as system work, outside the wall: under
        // row-level security Postgres uses no index for `ILIKE` (not LEAKPROOF) ahead of a
        // policy's condition, so the request role could only scan (and it may not read
        // `session_search` at all: its policy would have to admit every owner's rows for the
        // index's count). Every statement of it names the owner itself (`owner = $1`), except
        // the index's count, which only counts, across owners on purpose.
        let searches_index = index.zip(filter.search.as_deref()).is_some_and(|(i, s)| i.can_find(s));
        let mut tx = if searches_index {
            self.db.as_system().await?
        } else {
            self.db.as_user(owner).await?
        };
        let records = Postgres::list_sessions(&mut tx, owner, filter, after, limit, index).await?;
        tx.commit().await?;
        Ok(records)
    }

    async fn set_archived(&self, owner: &str, id: &str, at: Option<i64>) -> Result<bool, StoreError> {
        let mut tx = self.db.as_user(owner).await?;
        let found = Postgres::set_archived(&mut *tx, owner, id, at).await?;
        tx.commit().await?;
        Ok(found)
    }

    async fn stale_sessions(
        &self,
        before: i64,
        after: Option<(i64, &str)>,
        limit: i64,
    ) -> Result<Vec<super::StaleSession>, StoreError> {
        Ok(Postgres::stale_sessions(&mut *self.db.conn().await?, before, after, limit).await?)
    }

    async fn delete_stale(
        &self,
        sessions: &[super::StaleSession],
        before: i64,
    ) -> Result<Vec<super::StaleSession>, StoreError> {
        let mut tx = self.db.as_system().await?;
        let deleted = Postgres::delete_stale(&mut tx, sessions, before).await?;
        tx.commit().await?;
        Ok(deleted)
    }

    async fn delete_session(&self, owner: &str, id: &str) -> Result<bool, StoreError> {
        let mut tx = self.db.as_user(owner).await?;
        // The transcript goes with it: Postgres always enforces the ON DELETE CASCADE (its
        // referential actions run as the tables' owner, outside row-level security).
        let deleted = Postgres::delete_session(&mut *tx, owner, id).await?;
        tx.commit().await?;
        Ok(deleted)
    }

    async fn write_batch(&self, writes: &[SessionWrite]) -> Result<(), StoreError> {
        self.write_settled(writes, None).await.map(|_| ())
    }

    async fn write_batch_leased(&self, writes: &[SessionWrite], holder: &str) -> Result<Vec<Arc<str>>, StoreError> {
        self.write_settled(writes, Some(holder)).await
    }

    async fn write_chunks_unsettled(
        &self,
        writes: &[SessionWrite],
        holder: Option<&str>,
    ) -> Result<ChunksStored, StoreError> {
        let rows_behind = writes.iter().all(is_chunk_only);
        let refused = if rows_behind {
            self.write_chunks(writes, holder).await?
        } else {
            self.write_settled(writes, holder).await?
        };
        Ok(ChunksStored { refused, rows_behind })
    }

    async fn settle_sessions(&self, sessions: &[Arc<str>]) -> Result<(), StoreError> {
        self.settle(sessions).await
    }

    async fn read_events(
        &self,
        owner: &str,
        id: &str,
        after_seq: i64,
        max_chunks: u32,
    ) -> Result<Vec<EventChunk>, StoreError> {
        let mut tx = self.db.as_user(owner).await?;
        let chunks = Postgres::read_events(&mut *tx, owner, id, after_seq, max_chunks).await?;
        tx.commit().await?;
        Ok(chunks)
    }

    async fn cursor_key(&self) -> Result<Vec<u8>, StoreError> {
        let mut tx = self.db.as_system().await?;
        let key = Postgres::cursor_key(&mut tx).await?;
        tx.commit().await?;
        Ok(key)
    }

    async fn stored_bytes(&self, owner: &str) -> Result<u64, StoreError> {
        let mut tx = self.db.as_user(owner).await?;
        let bytes = Postgres::stored_bytes(&mut *tx, owner).await?;
        tx.commit().await?;
        Ok(u64::try_from(bytes).unwrap_or(0))
    }
}
