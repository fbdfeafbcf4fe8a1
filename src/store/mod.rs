//! Where sessions and their transcripts live: one [`Store`] trait, a SQLite and a Postgres
//! implementation, and the [`persister`] that batches transcript writes.
//!
//! The transcript is stored as *chunks*: one row holds a run of consecutive updates of one session
//! (`seq_from..=seq_to`, one JSON object per line). A streaming agent's thousands of updates a
//! second become a handful of rows per flush, and `afterSeq` replays start at the chunk that holds
//! the first missing update.

mod admin;
pub(crate) mod cursor;
mod db;
mod lifecycle;
mod list_sql;
pub mod persister;
mod pg_roles;
pub(crate) mod postgres;
pub mod sealed_list;
mod sql;
pub(crate) mod sqlite;
pub mod sqlite_writer;
mod user_secrets;

use std::sync::Arc;

use async_trait::async_trait;

pub use admin::UserOverview;
pub(crate) use db::statement;
pub use db::{Backend, Db};
pub use lifecycle::StaleSession;
pub use list_sql::{SEARCH_PROBE, SearchBy, SearchIndex, list_query};
pub use postgres::PgDb;
pub use user_secrets::{SealedRows, StoredLogin, StoredSecret};

/// How many chunks a replay, an export or a fork's copy asks [`Store::read_events`] for at most.
/// Human-paced prompts store about one update per chunk: pages of a few chunks made a Postgres
/// replay wait a round trip per handful of updates (2,000 updates/s).
pub const READ_PAGE_CHUNKS: u32 = 1024;

/// About how many bytes of transcript one [`Store::read_events`] page holds (one chunk more at
/// most): a replay's memory stays flat whatever the size of its chunks.
pub const READ_PAGE_BYTES: i64 = 256 << 10;

/// Longest wait for a pooled connection: a database that does not answer fails a request well
/// within the contract's 5 s, and pools open new connections once it is back.
pub const ACQUIRE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// Longest one store call on a request's path may take (a request as a whole waits at most
/// the contract's 5 s).
pub const CALL_LIMIT: std::time::Duration = std::time::Duration::from_secs(4);

/// Runs one store call a request waits on, answering [`StoreError::Timeout`] when it takes
/// longer than [`CALL_LIMIT`], so a client hears `-32603` instead of waiting on a database that
/// does not answer. Transcript writes are not bounded: a write given up on might still commit,
/// and the writer retries.
pub async fn in_time<T>(f: impl std::future::Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
    within_limit(CALL_LIMIT, f).await
}

/// Runs `f`, answering [`StoreError::Timeout`] when it takes longer than `limit`.
async fn within_limit<T>(
    limit: std::time::Duration,
    f: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(limit, f)
        .await
        .unwrap_or(Err(StoreError::Timeout(limit)))
}

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
    /// Postgres: the gateway's role cannot act as the request role (docs/operations.md, "Postgres roles and
    /// row-level security"); the message says what an operator must run.
    #[error("database roles: {0}")]
    Roles(String),
    /// The database did not answer in time (unreachable, stopped, or the writer is stuck).
    #[error("database did not answer within {0:?}")]
    Timeout(std::time::Duration),
    /// SQLite refused or failed, on the transcript writer's own connection.
    #[error("database error: {message} (SQLite code {code})")]
    Sqlite {
        /// SQLite's extended result code.
        code: i32,
        /// What it said.
        message: String,
    },
}

impl StoreError {
    /// Whether trying the same thing again later may succeed: the database is unreachable, busy,
    /// out of room, restarting, or refusing writes by its own rule for now. Everything else (a
    /// constraint this data breaks, an encoding error) fails the same way every time.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Timeout(_) => true,
            StoreError::Db(e) => db_error_is_transient(e),
            StoreError::Sqlite { code, .. } => sqlite_code_is_transient(*code),
            StoreError::Migrate(_) | StoreError::UnsupportedUrl(_) | StoreError::Roles(_) => false,
        }
    }
}

fn db_error_is_transient(e: &sqlx::Error) -> bool {
    use sqlx::Error as E;
    match e {
        E::Io(_) | E::Tls(_) | E::Protocol(_) | E::PoolTimedOut | E::PoolClosed | E::WorkerCrashed => true,
        E::Database(db) => {
            let code = db.code().unwrap_or_default();
            if let Ok(sqlite) = code.parse::<i32>() {
                sqlite_code_is_transient(sqlite)
            } else {
                // Postgres SQLSTATE classes: 08 connection, 40 serialization/deadlock, 53
                // insufficient resources (disk full), 55 lock not available, 57 operator
                // intervention (shutdown, starting up), 58 system I/O; P0001 is RAISE in a function.
                ["08", "40", "53", "55", "57", "58"].iter().any(|c| code.starts_with(c)) || code == "P0001"
            }
        }
        _ => false,
    }
}

/// SQLite (numeric extended result codes): BUSY, LOCKED, NOMEM, READONLY, INTERRUPT, IOERR,
/// FULL, CANTOPEN, PROTOCOL; and a RAISE() in a trigger (SQLITE_CONSTRAINT_TRIGGER): a rule of
/// the database's operator, not this row's.
fn sqlite_code_is_transient(code: i32) -> bool {
    matches!(code & 0xff, 5..=10 | 13..=15) || code == 1811
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
    /// When its owner archived it (epoch µs): hidden from the default `session/list`.
    pub archived_at: Option<i64>,
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
    /// Archived sessions: left out (the default), only them, or both.
    pub archived: Archived,
}

/// Which sessions a list shows by their archive state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Archived {
    /// Sessions not archived.
    #[default]
    Hidden,
    /// Archived sessions only.
    Only,
    /// Both.
    Any,
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
    /// When it was stored (epoch µs: when the newest of its updates was received). Read back by
    /// [`Store::read_events`]; writers store the write's `updated_at` and leave this `0`.
    #[sqlx(default)]
    pub stored_at: i64,
}

impl EventChunk {
    /// Its updates with their sequence numbers, in order.
    pub fn updates(&self) -> impl Iterator<Item = (u64, &str)> {
        (u64::try_from(self.seq_from).unwrap_or(0)..).zip(self.payload.split('\n'))
    }
}

/// What [`Store::write_chunks_unsettled`] did.
#[derive(Debug, Default)]
pub struct ChunksStored {
    /// Sessions whose chunks were refused: their lease is another replica's.
    pub refused: Vec<Arc<str>>,
    /// Whether the rows of the sessions whose chunks were stored were left behind them, for
    /// [`Store::settle_sessions`] (otherwise they were advanced in the same transaction).
    pub rows_behind: bool,
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
    /// The agent's session controls (`modes`, `configOptions`, `models`), a JSON object: replaces
    /// the stored ones.
    pub controls: Option<String>,
    /// When the newest update was received (epoch µs).
    pub updated_at: i64,
}

impl SessionWrite {
    /// Whether it changes the session's message count, titles or controls.
    pub fn has_metadata(&self) -> bool {
        self.prompts != 0 || self.prompt_title.is_some() || self.agent_title.is_some() || self.controls.is_some()
    }
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
    /// Up to `max_chunks` chunks of `owner`'s session holding updates after `after_seq`, in order,
    /// and no more than [`READ_PAGE_BYTES`] of payload past the first chunk: one query reads many
    /// small chunks (a session of human-paced prompts stores about one update per chunk) and few
    /// large ones.
    async fn read_events(
        &self,
        owner: &str,
        id: &str,
        after_seq: i64,
        max_chunks: u32,
    ) -> Result<Vec<EventChunk>, StoreError>;
    /// The key that signs `session/list` cursors, shared by every replica on this database.
    async fn cursor_key(&self) -> Result<Vec<u8>, StoreError>;
    /// Archives (`Some(at)`, epoch µs) or restores (`None`) `owner`'s session `id`; `false`
    /// when there is none (unknown and foreign ids alike).
    async fn set_archived(&self, owner: &str, id: &str, at: Option<i64>) -> Result<bool, StoreError>;
    /// Up to `limit` sessions of any user last updated before `before` (epoch µs), oldest first,
    /// after `after` (a session's `updated_at` and id) when given: retention's next batch
    /// (system work, across users).
    async fn stale_sessions(
        &self,
        before: i64,
        after: Option<(i64, &str)>,
        limit: i64,
    ) -> Result<Vec<StaleSession>, StoreError>;
    /// Deletes `sessions` with their transcripts in one transaction, each only if it is still not
    /// updated since `before` and no live replica holds it; the ones deleted.
    async fn delete_stale(&self, sessions: &[StaleSession], before: i64) -> Result<Vec<StaleSession>, StoreError>;
    /// [`Store::write_batch`] for replicas sharing the database: stores transcript chunks only of
    /// sessions whose lease `holder` holds (a fence: a replica that lost a session cannot write
    /// over its new holder's numbers), tells the other replicas in the same transaction what was
    /// committed (`NOTIFY acp_session_committed`), and returns the sessions whose chunks were
    /// refused. A store without leases (SQLite: one process) stores everything.
    async fn write_batch_leased(&self, writes: &[SessionWrite], holder: &str) -> Result<Vec<Arc<str>>, StoreError> {
        let _ = holder;
        self.write_batch(writes).await.map(|()| Vec::new())
    }
    /// Stores `writes` as [`Store::write_batch`] (no `holder`) or [`Store::write_batch_leased`]
    /// do, but may leave the rows of the sessions whose chunks it stored behind them (`last_seq`,
    /// `updated_at`, `stored_bytes`) until [`Store::settle_sessions`]: the transcript writer's
    /// commit, which every update waits on, then stores the chunks alone. A session is still
    /// read with its newest chunk's seq meanwhile.
    async fn write_chunks_unsettled(
        &self,
        writes: &[SessionWrite],
        holder: Option<&str>,
    ) -> Result<ChunksStored, StoreError> {
        let refused = match holder {
            Some(holder) => self.write_batch_leased(writes, holder).await?,
            None => self.write_batch(writes).await.map(|()| Vec::new())?,
        };
        Ok(ChunksStored {
            refused,
            rows_behind: false,
        })
    }
    /// Advances `sessions`' rows past the chunks [`Store::write_chunks_unsettled`] stored. It
    /// recounts from the stored chunks, so any replica may settle any session, any number of
    /// times.
    async fn settle_sessions(&self, sessions: &[Arc<str>]) -> Result<(), StoreError> {
        let _ = sessions;
        Ok(())
    }
    /// A connection of the transcript writer's own that writes batches on the caller's thread
    /// (SQLite: the writer then runs on a thread of its own, see [`persister`]); `None` when
    /// batches go through [`Store::write_batch`].
    fn transcript_writer(&self) -> Option<Result<Box<dyn sqlite_writer::BatchWriter>, StoreError>> {
        None
    }
    /// Bytes of `owner`'s stored transcripts: the payloads of every chunk stored for their
    /// sessions (a deleted session no longer counts). Each session keeps its own total as chunks
    /// are stored, so this sums the owner's sessions, not their events.
    async fn stored_bytes(&self, owner: &str) -> Result<u64, StoreError>;
    /// The agent's session controls stored for a session of `owner` (a JSON object, `{}` when
    /// none were), or `None` (unknown and foreign ids alike).
    async fn session_controls(&self, owner: &str, id: &str) -> Result<Option<String>, StoreError>;
    /// Every user with a stored session, most recently active first (the gateway's own work,
    /// across users: for admins; never a transcript).
    async fn users_overview(&self, limit: i64) -> Result<Vec<UserOverview>, StoreError>;
}

/// An open database: the session store, and the handle the features' own tables are reached
/// through.
#[derive(Debug, Clone)]
pub struct Database {
    /// Sessions, their transcripts and leases.
    pub sessions: Arc<dyn Store>,
    /// The same database, for the features' repositories.
    pub db: Db,
}

/// Opens the session store named by `url`, creating a SQLite file (and its directory) when
/// needed, and applies migrations.
pub async fn connect(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    Ok(open(url, None).await?.sessions)
}

/// Opens the database named by `url` (see [`connect`]), with Postgres's request work logging in
/// through `request_url` (the setting `request_database_url`) when it is given.
pub async fn open(url: &str, request_url: Option<&str>) -> Result<Database, StoreError> {
    let postgres = url.starts_with("postgres:") || url.starts_with("postgresql:");
    if let Some(r) = request_url
        && !(postgres && (r.starts_with("postgres:") || r.starts_with("postgresql:")))
    {
        return Err(StoreError::Roles(String::from(
            "request_database_url (ACP_GATEWAY_REQUEST_DATABASE_URL) is for Postgres: both it and DATABASE_URL \
             must be postgres://... URLs of one database",
        )));
    }
    if url.starts_with("sqlite:") {
        let store = sqlite::SqliteStore::connect(url).await?;
        Ok(Database {
            db: store.db(),
            sessions: Arc::new(store),
        })
    } else if postgres {
        let store = postgres::PgStore::connect(url, request_url).await?;
        Ok(Database {
            db: store.db(),
            sessions: Arc::new(store),
        })
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

/// Parses ISO 8601 into epoch microseconds: RFC 3339 (`2026-11-21T19:40:08Z`, any offset), and
/// the shorter forms people write, taken as UTC: no offset (`2026-11-21T19:40:08`, `…T19:40`),
/// or only a date (`2026-11-21`, its midnight).
pub fn parse_iso8601(s: &str) -> Option<i64> {
    use chrono::{NaiveDate, NaiveDateTime};
    let s = s.trim();
    if let Ok(d) = chrono::DateTime::parse_from_rfc3339(s) {
        return Some(d.timestamp_micros());
    }
    let naive = ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%dT%H:%M"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(s, f).ok())
        .or_else(|| {
            NaiveDate::parse_from_str(s, "%Y-%m-%d")
                .ok()
                .and_then(|d| d.and_hms_opt(0, 0, 0))
        })?;
    Some(naive.and_utc().timestamp_micros())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso8601_dates_in_their_usual_forms() {
        let at = |s| parse_iso8601(s);
        let noon = at("2026-11-21T12:00:00Z").expect("RFC 3339");
        assert_eq!(at("2026-11-21T13:00:00+01:00"), Some(noon));
        assert_eq!(at("2026-11-21T12:00:00.000Z"), Some(noon));
        assert_eq!(at("2026-11-21T12:00:00"), Some(noon), "no offset: UTC");
        assert_eq!(at("2026-11-21T12:00"), Some(noon));
        assert_eq!(
            at("2026-11-21"),
            Some(noon - 12 * 3_600_000_000),
            "a date: its midnight"
        );
        for bad in ["", "yesterday", "2026-13-01", "2026-11-21T25:00:00Z", "1700000000"] {
            assert_eq!(at(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn transient_and_permanent_errors() {
        assert!(StoreError::Db(sqlx::Error::PoolTimedOut).is_transient());
        assert!(StoreError::Db(sqlx::Error::Io(std::io::ErrorKind::ConnectionRefused.into())).is_transient());
        assert!(StoreError::Timeout(std::time::Duration::from_secs(1)).is_transient());
        assert!(!StoreError::Db(sqlx::Error::Encode("bad".into())).is_transient());
        assert!(!StoreError::Db(sqlx::Error::ColumnNotFound("x".into())).is_transient());
    }

    #[test]
    fn iso_round_trip() {
        let t = 1_700_000_000_123_456;
        assert_eq!(parse_iso8601(&iso8601(t)), Some(t));
        assert_eq!(parse_iso8601("yesterday"), None);
    }
}
