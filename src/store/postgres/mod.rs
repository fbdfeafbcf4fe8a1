//! The shared production store: Postgres, which several replicas can use at once.
//!
//! Row-level security is a second wall behind the owner conditions in every query (migration
//! `…_request_role`, docs/operations.md "Postgres roles and row-level security"):
//! - request work, what the gateway does for one user, runs in a transaction that first switches
//!   to the role `acp_gateway_request` and names the user with an identity signed by the
//!   database's key ([`RequestIdentity`]), in one round trip. That role cannot bypass the
//!   policies, and they admit only the rows of the user whose signature checks out. With
//!   `request_database_url` its connections log in as a role of their own, so a statement that
//!   reset the role would be that login, not the tables' owner;
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
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions};
use sqlx::{Postgres, Transaction};

use super::admin::AdminSql;
use super::audit::AuditSql;
use super::identities::IdentitySql;
use super::lifecycle::LifecycleSql;
use super::list_sql::{RunList, SearchBy};
use super::pg_roles::{ACT_FOR_USER, RequestIdentity, check_roles};
use super::shares::ShareSql;
use super::sql::Sql;
use super::usage::UsageSql;
use super::user_secrets::SecretSql;
use super::web_sessions::WebSessionSql;
use transcript::{SETTLE_ALL_BEHIND, is_chunk_only};

mod transcript;

use super::{
    AuditEntry, AuditFilter, ChunksStored, EventChunk, ListFilter, NewSession, Position, SessionRecord, SessionWrite,
    Store, StoreError, StoredLogin, StoredSecret, WEB_SESSIONS_KEPT_SECS, WebSession,
};

/// Longest wait for a pooled connection (see [`super::ACQUIRE_TIMEOUT`]).
const ACQUIRE_TIMEOUT: Duration = super::ACQUIRE_TIMEOUT;

/// A Postgres-backed [`Store`].
#[derive(Debug, Clone)]
pub struct PgStore {
    /// System work's connections, as the login role (the tables' owner): each method borrows one
    /// for one transaction.
    pool: PgPool,
    /// Request work's connections when `request_database_url` gives it a login of its own (a
    /// member of `acp_gateway_request` and nothing more); else request work uses `pool`. Each
    /// transaction's role and identity end with it.
    requests: Option<PgPool>,
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
    /// Signs the user a request transaction acts for.
    identity: RequestIdentity,
}

/// Awaits `$start` (taking a connection, beginning a transaction on it) once more when it failed
/// because the connection was dead: after Postgres restarts, the pool finds its old connections
/// dead and opens a new one, and that first connect may be reset while the server comes up
/// (sqlx retries a refused connect within the pool's wait, not a reset one). Nothing has been
/// written at this point, so running it again is safe; a connection lost later, mid-statement,
/// is the caller's error, since a write may or may not have happened.
macro_rules! once_more_if_dead {
    ($start:expr) => {
        match $start.await {
            Err(e) if connection_lost(&e) => {
                tracing::info!(error = %e, "a Postgres connection was found dead; trying a new one");
                $start.await
            }
            done => done,
        }
    };
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
            pool,
            requests,
            writes,
            writer: Arc::default(),
            search_index,
            identity,
        })
    }

    /// A transaction of request work: as the request role, row-level security shows it only
    /// `owner`'s rows.
    async fn as_user(&self, owner: &str) -> Result<Transaction<'static, Postgres>, StoreError> {
        let pool = self.requests.as_ref().unwrap_or(&self.pool);
        let identity = self.identity.sign(owner);
        let begin = async || -> Result<_, sqlx::Error> {
            let mut tx = pool.begin().await?;
            sqlx::query(ACT_FOR_USER).bind(&identity).execute(&mut *tx).await?;
            Ok(tx)
        };
        Ok(once_more_if_dead!(begin())?)
    }

    /// A transaction of system work, done for every user (transcript writes, the cursor key): as
    /// the login role, the tables' owner, which row-level security does not apply to.
    async fn as_system(&self) -> Result<Transaction<'static, Postgres>, StoreError> {
        Ok(once_more_if_dead!(self.pool.begin())?)
    }

    /// A connection of system work for statements that run on their own.
    async fn conn(&self) -> Result<PoolConnection<Postgres>, StoreError> {
        Ok(once_more_if_dead!(self.pool.acquire())?)
    }
}

/// Whether `e` says the connection is gone: reset or closed under it, or the server shutting
/// down or starting up (SQLSTATE class 08, and 57P01, 57P02, 57P03).
fn connection_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) => true,
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("08") || matches!(&*c, "57P01" | "57P02" | "57P03")),
        _ => false,
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
        if let Some(requests) = &self.requests {
            sqlx::query("SELECT 1").execute(requests).await?;
        }
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

    async fn put_secrets(&self, owner: &str, secrets: &[StoredSecret]) -> Result<(), StoreError> {
        let mut tx = self.as_user(owner).await?;
        for s in secrets {
            Postgres::put_secret(&mut *tx, owner, s).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn secrets(&self, owner: &str, agent: Option<&str>) -> Result<Vec<StoredSecret>, StoreError> {
        let mut tx = self.as_user(owner).await?;
        let rows = match agent {
            Some(agent) => Postgres::secrets_for(&mut *tx, owner, agent).await?,
            None => Postgres::all_secrets(&mut *tx, owner).await?,
        };
        tx.commit().await?;
        Ok(rows)
    }

    async fn delete_secrets(&self, owner: &str, agent: &str) -> Result<u64, StoreError> {
        let mut tx = self.as_user(owner).await?;
        let n = Postgres::delete_secrets(&mut *tx, owner, agent).await?;
        Postgres::delete_login(&mut *tx, owner, agent).await?;
        tx.commit().await?;
        Ok(n)
    }

    async fn put_login(&self, owner: &str, login: &StoredLogin) -> Result<(), StoreError> {
        let mut tx = self.as_user(owner).await?;
        Postgres::put_login(&mut *tx, owner, login).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn logins(&self, owner: &str) -> Result<Vec<StoredLogin>, StoreError> {
        let mut tx = self.as_user(owner).await?;
        let rows = Postgres::logins(&mut *tx, owner).await?;
        tx.commit().await?;
        Ok(rows)
    }

    async fn put_web_session(&self, s: &WebSession) -> Result<(), StoreError> {
        Ok(Postgres::put_web_session(&mut *self.conn().await?, s).await?)
    }

    async fn web_session(&self, id: &str) -> Result<Option<WebSession>, StoreError> {
        Ok(Postgres::web_session(&mut *self.conn().await?, id).await?)
    }

    async fn revoke_web_session(&self, id: &str, reason: &str) -> Result<(), StoreError> {
        Ok(Postgres::revoke_web_session(
            &mut *self.conn().await?,
            id,
            crate::infra::clock::now_secs() as i64,
            reason,
        )
        .await?)
    }

    async fn due_web_sessions(&self, checked_before: i64, limit: i64) -> Result<Vec<WebSession>, StoreError> {
        let now = crate::infra::clock::now_secs() as i64;
        let mut conn = self.conn().await?;
        Postgres::prune_web_sessions(&mut *conn, now - WEB_SESSIONS_KEPT_SECS).await?;
        Ok(Postgres::due_web_sessions(&mut *conn, checked_before, now, limit).await?)
    }

    async fn claim_web_session(&self, id: &str, seen: i64, now: i64) -> Result<bool, StoreError> {
        Ok(Postgres::claim_web_session(&mut *self.conn().await?, id, seen, now).await?)
    }

    async fn bind_identity(&self, user: &str, issuer: &str, subject: &str) -> Result<(String, String), StoreError> {
        let now = crate::infra::clock::now_secs() as i64;
        Ok(Postgres::bind_identity(&self.pool, user, issuer, subject, now).await?)
    }

    async fn append_audit(&self, entries: &[AuditEntry]) -> Result<(), StoreError> {
        Ok(Postgres::append_audit(&self.pool, entries).await?)
    }

    async fn audit_page(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>, StoreError> {
        Ok(Postgres::audit_page(&mut *self.conn().await?, filter).await?)
    }

    async fn users_overview(&self, limit: i64) -> Result<Vec<super::UserOverview>, StoreError> {
        let mut tx = self.as_system().await?;
        let rows = Postgres::users_overview(&mut *tx, limit).await?;
        tx.commit().await?;
        Ok(rows)
    }

    async fn last_sign_ins(&self) -> Result<Vec<(String, i64)>, StoreError> {
        Ok(Postgres::last_sign_ins(&mut *self.conn().await?).await?)
    }

    async fn record_usage(&self, s: &super::UsageSample) -> Result<(), StoreError> {
        let mut tx = self.as_system().await?;
        let last = Postgres::last_cost(&mut *tx, &s.session).await?;
        let delta = match last {
            Some((currency, cost)) if currency == s.currency => (s.cumulative - cost).max(0.0),
            _ => s.cumulative.max(0.0),
        };
        Postgres::set_last_cost(&mut *tx, &s.session, &s.currency, s.cumulative).await?;
        if delta > 0.0 {
            Postgres::add_cost(&mut *tx, s, delta).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn usage(&self, owner: Option<&str>, since: &str) -> Result<Vec<super::UsageRow>, StoreError> {
        Ok(Postgres::usage_rows(&mut *self.conn().await?, owner, since).await?)
    }

    async fn cost_since(&self, owner: &str, since: &str, currency: &str) -> Result<f64, StoreError> {
        Ok(Postgres::cost_since(&mut *self.conn().await?, owner, since, currency).await?)
    }

    async fn prune_audit(&self, before: i64) -> Result<(), StoreError> {
        Ok(Postgres::prune_audit(&mut *self.conn().await?, before).await?)
    }

    async fn create_share(&self, s: &super::NewShare<'_>, max: i64) -> Result<bool, StoreError> {
        // Under Postgres's READ COMMITTED two creates at once would each count the shares the
        // other has not committed yet, and both pass the cap: a lock per session serializes them
        // (an advisory one, which the transcript writer's updates of the session row do not wait
        // for). The second counts in a snapshot taken after the first committed.
        let mut tx = self.as_system().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('session_shares:' || $1, 0))")
            .bind(s.session_id)
            .execute(&mut *tx)
            .await?;
        Postgres::purge_ended_shares(&mut *tx, s.owner, s.session_id, s.created_at).await?;
        let made = Postgres::create_share(&mut *tx, s, max).await?;
        tx.commit().await?;
        Ok(made)
    }

    async fn purge_expired_shares(&self, now: i64, limit: i64) -> Result<u64, StoreError> {
        Ok(Postgres::purge_expired_shares(&mut *self.conn().await?, now, limit).await?)
    }

    async fn shares(&self, owner: &str, session_id: &str, now: i64) -> Result<Vec<super::ShareRow>, StoreError> {
        Ok(Postgres::shares(&mut *self.conn().await?, owner, session_id, now).await?)
    }

    async fn delete_share(&self, owner: &str, session_id: &str, id: &str) -> Result<bool, StoreError> {
        Ok(Postgres::delete_share(&mut *self.conn().await?, owner, session_id, id).await?)
    }

    async fn link_share(&self, hash: &[u8], now: i64) -> Result<Option<super::ShareRow>, StoreError> {
        Ok(Postgres::link_share(&mut *self.conn().await?, hash, now).await?)
    }

    async fn join_share(&self, id: &str, member: &str, now: i64) -> Result<(), StoreError> {
        Ok(Postgres::join_share(&mut *self.conn().await?, id, member, now).await?)
    }

    async fn share_access(&self, user: &str, sid: &str, now: i64) -> Result<Option<super::ShareAccess>, StoreError> {
        Ok(Postgres::share_access(&mut *self.conn().await?, user, sid, now).await?)
    }

    async fn share_accesses(&self, pairs: &[(&str, &str)], now: i64) -> Result<Vec<super::MemberAccess>, StoreError> {
        Ok(Postgres::share_accesses(&mut *self.conn().await?, pairs, now).await?)
    }

    async fn shared_with(&self, user: &str, now: i64, limit: i64) -> Result<Vec<super::SharedSession>, StoreError> {
        Ok(Postgres::shared_with(&mut *self.conn().await?, user, now, limit).await?)
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
            self.as_system().await?
        } else {
            self.as_user(owner).await?
        };
        let records = Postgres::list_sessions(&mut tx, owner, filter, after, limit, index).await?;
        tx.commit().await?;
        Ok(records)
    }

    async fn set_archived(&self, owner: &str, id: &str, at: Option<i64>) -> Result<bool, StoreError> {
        let mut tx = self.as_user(owner).await?;
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
        Ok(Postgres::stale_sessions(&mut *self.conn().await?, before, after, limit).await?)
    }

    async fn delete_stale(
        &self,
        sessions: &[super::StaleSession],
        before: i64,
    ) -> Result<Vec<super::StaleSession>, StoreError> {
        let mut tx = self.as_system().await?;
        let deleted = Postgres::delete_stale(&mut tx, sessions, before).await?;
        tx.commit().await?;
        Ok(deleted)
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
