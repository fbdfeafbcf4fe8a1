//! The shared production store: Postgres, which several replicas can use at once.
//!
//! Row-level security (migration `…02_row_level_security`) is a second wall behind the owner
//! conditions in every query: each method runs in a transaction that first names the user it acts
//! for (`acp_gateway.user`) or, for the transcript writer and the cursor key, declares itself
//! system work (`acp_gateway.system`). The settings are transaction-local, so a pooled connection
//! never carries one user's identity into the next transaction.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};
use sqlx::{Postgres, Row, Transaction};

use super::{
    EventChunk, ListFilter, NewSession, Position, SESSION_COLUMNS, SessionRecord, SessionWrite, Store, StoreError,
};

/// A Postgres-backed [`Store`].
#[derive(Debug, Clone)]
pub struct PgStore {
    /// Connections to the server.
    pool: PgPool,
}

impl PgStore {
    /// Connects to `url` and migrates the database.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(10))
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

fn record(row: &PgRow) -> Result<SessionRecord, sqlx::Error> {
    Ok(SessionRecord {
        id: row.try_get("id")?,
        owner: row.try_get("owner")?,
        agent: row.try_get("agent")?,
        agent_session_id: row.try_get("agent_session_id")?,
        cwd: row.try_get("cwd")?,
        additional_dirs: row.try_get("additional_dirs")?,
        title: row.try_get("title")?,
        meta: row.try_get("meta")?,
        message_count: row.try_get("message_count")?,
        last_seq: row.try_get("last_seq")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

#[async_trait]
impl Store for PgStore {
    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn create_session(&self, s: &NewSession<'_>) -> Result<(), StoreError> {
        let mut tx = self.as_user(s.owner).await?;
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
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn get_session(&self, owner: &str, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        let mut tx = self.as_user(owner).await?;
        let row = sqlx::query(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE id = $1 AND owner = $2"
        ))
        .bind(id)
        .bind(owner)
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(row.as_ref().map(record).transpose()?)
    }

    async fn list_sessions(
        &self,
        owner: &str,
        filter: &ListFilter,
        after: Option<Position<'_>>,
        limit: u32,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        let mut q = super::list_query::<sqlx::Postgres>("", owner, filter, after, limit, "ILIKE");
        let mut tx = self.as_user(owner).await?;
        let rows = q.build().fetch_all(&mut *tx).await?;
        tx.commit().await?;
        Ok(rows.iter().map(record).collect::<Result<_, _>>()?)
    }

    async fn delete_session(&self, owner: &str, id: &str) -> Result<bool, StoreError> {
        let mut tx = self.as_user(owner).await?;
        // The transcript goes with it: Postgres always enforces the ON DELETE CASCADE (its
        // referential actions run as the tables' owner, outside row-level security).
        let done = sqlx::query("DELETE FROM sessions WHERE id = $1 AND owner = $2")
            .bind(id)
            .bind(owner)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(done.rows_affected() > 0)
    }

    async fn write_batch(&self, writes: &[SessionWrite]) -> Result<(), StoreError> {
        let mut tx = self.as_system().await?;
        for w in writes {
            if let Some(chunk) = &w.chunk {
                let done = sqlx::query(
                    "INSERT INTO session_events (session_id, seq_from, seq_to, payload, created_at)
                     SELECT $1, $2, $3, $4, $5 WHERE EXISTS (SELECT 1 FROM sessions WHERE id = $1)
                     ON CONFLICT (session_id, seq_from) DO NOTHING",
                )
                .bind(&*w.session_id)
                .bind(chunk.seq_from)
                .bind(chunk.seq_to)
                .bind(&chunk.payload)
                .bind(w.updated_at)
                .execute(&mut *tx)
                .await?;
                super::note_unstored(&w.session_id, chunk, done.rows_affected());
            }
            sqlx::query(
                "UPDATE sessions SET
                    last_seq = GREATEST(last_seq, $2),
                    updated_at = GREATEST(updated_at, $3),
                    message_count = message_count + $4,
                    title = COALESCE($5, title, $6)
                 WHERE id = $1",
            )
            .bind(&*w.session_id)
            .bind(w.chunk.as_ref().map_or(0, |c| c.seq_to))
            .bind(w.updated_at)
            .bind(w.prompts)
            .bind(&w.agent_title)
            .bind(&w.prompt_title)
            .execute(&mut *tx)
            .await?;
        }
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
        let rows = sqlx::query(
            "SELECT e.seq_from, e.seq_to, e.payload FROM session_events e
             JOIN sessions s ON s.id = e.session_id
             WHERE e.session_id = $1 AND s.owner = $2 AND e.seq_to > $3
             ORDER BY e.seq_from LIMIT $4",
        )
        .bind(id)
        .bind(owner)
        .bind(after_seq)
        .bind(i64::from(max_chunks))
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        rows.iter()
            .map(|r| {
                Ok(EventChunk {
                    seq_from: r.try_get(0)?,
                    seq_to: r.try_get(1)?,
                    payload: r.try_get(2)?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Into::into)
    }

    async fn cursor_key(&self) -> Result<Vec<u8>, StoreError> {
        let fresh: [u8; 32] = rand::random();
        let mut tx = self.as_system().await?;
        sqlx::query(
            "INSERT INTO gateway_settings (name, value) VALUES ('cursor_key', $1) ON CONFLICT (name) DO NOTHING",
        )
        .bind(fresh.as_slice())
        .execute(&mut *tx)
        .await?;
        let row = sqlx::query("SELECT value FROM gateway_settings WHERE name = 'cursor_key'")
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(row.try_get(0)?)
    }
}
