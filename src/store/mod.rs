//! Where sessions and their transcripts live: one [`Store`] trait, a SQLite and a Postgres
//! implementation, and the [`persister`] that batches transcript writes.
//!
//! The transcript is stored as *chunks*: one row holds a run of consecutive updates of one session
//! (`seq_from..=seq_to`, one JSON object per line). A streaming agent's thousands of updates a
//! second become a handful of rows per flush, and `afterSeq` replays start at the chunk that holds
//! the first missing update.

pub(crate) mod cursor;
pub mod persister;
pub(crate) mod postgres;
mod sql;
pub(crate) mod sqlite;

use std::sync::Arc;

use async_trait::async_trait;

pub use sql::list_query;

/// A store failure. Callers log the detail and answer clients with a generic error.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database refused or failed.
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    /// Applying migrations failed.
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The URL names no supported database.
    #[error("unsupported DATABASE_URL {0:?}: expected sqlite://PATH or postgres://...")]
    UnsupportedUrl(String),
}

/// What a client sees when the store fails: a generic internal error. The detail is logged here,
/// once, so callers can use `?` where they answer a client.
impl From<StoreError> for crate::protocol::RpcError {
    fn from(e: StoreError) -> Self {
        tracing::error!(error = %e, "session store failed");
        Self::internal("session store unavailable")
    }
}

/// A session as stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct SessionRecord {
    /// The id clients know it by (the gateway's, not the agent's).
    pub id: String,
    /// The user (`sub`) it belongs to.
    pub owner: String,
    /// Which configured agent (`[agents.NAME]`) runs it, so a reload restores it on the same kind.
    pub agent: String,
    /// The agent's own id for it, when a process has one.
    pub agent_session_id: Option<String>,
    /// The agent's working directory; `session/list` can filter on it.
    pub cwd: String,
    /// `additionalDirectories`, as a JSON array.
    pub additional_dirs: String,
    /// From the first prompt, or the agent's `session_info_update`.
    pub title: Option<String>,
    /// Free-form JSON object (searchable).
    pub meta: String,
    /// Prompts sent in this session.
    pub message_count: i64,
    /// Highest stored transcript sequence number: a reloaded session numbers on from here.
    pub last_seq: i64,
    /// When it was created, in epoch microseconds (a `session/list` filter).
    pub created_at: i64,
    /// When its newest update arrived, in epoch microseconds: `session/list` shows the newest first.
    pub updated_at: i64,
}

/// Filters of `session/list` (ACP v1 plus the seed RFD's extras). Times are epoch microseconds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ListFilter {
    /// Exact working directory.
    pub cwd: Option<String>,
    /// Created strictly after.
    pub created_after: Option<i64>,
    /// Created strictly before.
    pub created_before: Option<i64>,
    /// Updated strictly after.
    pub updated_after: Option<i64>,
    /// Substring of the title or metadata, case-insensitive.
    pub search: Option<String>,
}

/// Keyset position: the last row of the previous page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position<'a> {
    /// Pages run newest `updated_at` first, so the next page starts below this.
    pub updated_at: i64,
    /// Breaks ties between sessions updated in the same microsecond.
    pub id: &'a str,
}

/// A run of consecutive transcript updates of one session.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct EventChunk {
    /// First sequence number in the chunk.
    pub seq_from: i64,
    /// Last sequence number in the chunk.
    pub seq_to: i64,
    /// The updates, one JSON object per line, in order.
    pub payload: String,
}

/// Everything one flush writes for one session.
#[derive(Debug, Clone, Default)]
pub struct SessionWrite {
    /// Which session (an `Arc`, so a flush copies no ids).
    pub session_id: Arc<str>,
    /// The updates; `None` when only metadata changes.
    pub chunk: Option<EventChunk>,
    /// Title from a first prompt: set only if the session has none.
    pub prompt_title: Option<String>,
    /// Title from the agent: always set.
    pub agent_title: Option<String>,
    /// Prompts in this flush, added to `message_count`.
    pub prompts: i64,
    /// When the newest update was received (epoch µs).
    pub updated_at: i64,
}

/// A new session row: the [`SessionRecord`] columns known when a session starts (no title, no
/// prompts, no transcript yet), borrowed.
#[derive(Debug, Clone)]
pub struct NewSession<'a> {
    pub id: &'a str,
    pub owner: &'a str,
    pub agent: &'a str,
    pub agent_session_id: Option<&'a str>,
    pub cwd: &'a str,
    /// A JSON array.
    pub additional_dirs: &'a str,
    /// A JSON object.
    pub meta: &'a str,
    /// Both `created_at` and `updated_at` (epoch µs).
    pub now: i64,
}

/// The storage interface. Every method that reads or deletes a session takes its owner and
/// never touches another user's rows.
#[async_trait]
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// Round-trips to the database (for `/readyz`).
    async fn ping(&self) -> Result<(), StoreError>;
    /// Inserts a session.
    async fn create_session(&self, s: &NewSession<'_>) -> Result<(), StoreError>;
    /// A session of `owner`, or `None` (unknown and foreign ids alike).
    async fn get_session(&self, owner: &str, id: &str) -> Result<Option<SessionRecord>, StoreError>;
    /// One page of `owner`'s sessions, newest `updated_at` first, strictly after `after`.
    async fn list_sessions(
        &self,
        owner: &str,
        filter: &ListFilter,
        after: Option<Position<'_>>,
        limit: u32,
    ) -> Result<Vec<SessionRecord>, StoreError>;
    /// Deletes a session of `owner` and its transcript; `false` when there was none.
    async fn delete_session(&self, owner: &str, id: &str) -> Result<bool, StoreError>;
    /// Writes one flush, atomically. Writes for sessions deleted meanwhile are dropped.
    async fn write_batch(&self, writes: &[SessionWrite]) -> Result<(), StoreError>;
    /// Up to `max_chunks` chunks of `owner`'s session holding updates after `after_seq`, in order.
    async fn read_events(
        &self,
        owner: &str,
        id: &str,
        after_seq: i64,
        max_chunks: u32,
    ) -> Result<Vec<EventChunk>, StoreError>;
    /// The key that signs `session/list` cursors, shared by every replica on this database.
    async fn cursor_key(&self) -> Result<Vec<u8>, StoreError>;
}

/// Opens the store named by `url`, creating a SQLite file (and its directory) when needed, and
/// applies migrations.
pub async fn connect(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(sqlite::SqliteStore::connect(url).await?))
    } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        Ok(Arc::new(postgres::PgStore::connect(url).await?))
    } else {
        Err(StoreError::UnsupportedUrl(url.to_string()))
    }
}

/// Current time in epoch microseconds.
pub fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Epoch microseconds as ISO 8601 (`2026-11-21T19:40:08.123456Z`).
pub fn iso8601(micros: i64) -> String {
    chrono::DateTime::from_timestamp_micros(micros)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// Parses ISO 8601 / RFC 3339 into epoch microseconds.
pub fn parse_iso8601(s: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|d| d.timestamp_micros())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_errors_reach_clients_without_their_detail() {
        let e = crate::protocol::RpcError::from(StoreError::UnsupportedUrl("mysql://secret@host".into()));
        assert_eq!(e.code, crate::protocol::codes::INTERNAL_ERROR);
        assert_eq!(e.message, "session store unavailable");
        assert_eq!(e.data, None);
    }

    #[test]
    fn iso_round_trip() {
        let t = 1_700_000_000_123_456;
        assert_eq!(parse_iso8601(&iso8601(t)), Some(t));
        assert_eq!(parse_iso8601("yesterday"), None);
    }
}
