//! The embedded default: a SQLite file in WAL mode. The statements are in [`super::sql`].

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Sqlite;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::admin::AdminSql;
use super::lifecycle::LifecycleSql;
use super::list_sql::{RunList, SearchBy};
use super::sql::{Sql, chunk_key, chunk_of};
use super::{EventChunk, ListFilter, NewSession, Position, SessionRecord, SessionWrite, Store, StoreError};

/// A SQLite-backed [`Store`].
#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// Connections to the file (WAL: readers never block the transcript writer).
    pool: SqlitePool,
    /// The file, for the transcript writer's own connection (`None` in memory).
    path: Option<String>,
}

impl SqliteStore {
    /// Opens (creating if needed) the file named by `url` and migrates it.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let path = url.trim_start_matches("sqlite://").trim_start_matches("sqlite:");
        let path = path.split('?').next().unwrap_or(path);
        let on_disk = !path.is_empty() && path != ":memory:" && !url.contains("mode=memory");
        if on_disk {
            private_files(Path::new(path)).map_err(|e| StoreError::Db(sqlx::Error::Io(e)))?;
        }
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .acquire_timeout(super::ACQUIRE_TIMEOUT)
            // A file on this host has no network to fail: pinging a connection before every use
            // would add a round trip to the writer thread to every commit.
            .test_before_acquire(false)
            .connect_with(options)
            .await?;
        sqlx::migrate!("./migrations/sqlite").run(&pool).await?;
        let behind = sqlx::query(ADVANCE_SESSIONS_BEHIND)
            .execute(&pool)
            .await?
            .rows_affected();
        if behind > 0 {
            tracing::info!(
                sessions = behind,
                "sessions advanced past chunks stored before the last stop"
            );
        }
        Ok(Self {
            pool,
            path: on_disk.then(|| path.to_string()),
        })
    }

    /// The same database, for the features' repositories.
    pub fn db(&self) -> super::Db {
        super::Db::new(super::Backend::Sqlite(self.pool.clone()))
    }
}

/// Advances each session whose row lags its stored chunks (the transcript writer advances rows
/// after their chunks, see [`super::sqlite_writer`]; a gateway killed in between leaves them so):
/// the chunks above its `last_seq` are the ones its `stored_bytes` does not count yet. In SQLite
/// every expression of an `UPDATE` reads the row as it was.
const ADVANCE_SESSIONS_BEHIND: &str = concat!(
    "UPDATE sessions SET
        stored_bytes = stored_bytes + (SELECT COALESCE(SUM(octet_length(payload)), 0) FROM session_events e
            WHERE e.key > ",
    chunk_key!("sessions", "sessions.last_seq"),
    " AND e.key <= ",
    chunk_key!("sessions", last),
    "),
        updated_at = MAX(updated_at, (SELECT COALESCE(MAX(created_at), 0) FROM session_events e
            WHERE e.key > ",
    chunk_key!("sessions", "sessions.last_seq"),
    " AND e.key <= ",
    chunk_key!("sessions", last),
    ")),
        last_seq = (SELECT seq_to FROM session_events e WHERE ",
    chunk_of!("e", "sessions"),
    " ORDER BY e.key DESC LIMIT 1)
     WHERE last_seq < COALESCE((SELECT seq_to FROM session_events e WHERE ",
    chunk_of!("e", "sessions"),
    " ORDER BY e.key DESC LIMIT 1), 0)"
);

/// The database holds every transcript and the cursor key: its directory is created 0700, the
/// file itself 0600 before SQLite opens it (SQLite gives its `-wal` and `-shm` the same mode), and
/// existing files that other users can read are made 0600 with a warning.
fn private_files(db: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = db.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::infra::files::private_dir(dir)?;
    }
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(db)
    {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    for suffix in ["", "-wal", "-shm"] {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        crate::infra::files::private_file(Path::new(&name))?;
    }
    Ok(())
}

impl RunList for SqliteConnection {
    async fn run_list(
        &mut self,
        owner: &str,
        filter: &ListFilter,
        after: Option<Position<'_>>,
        limit: u32,
        by: SearchBy,
    ) -> Result<Vec<SessionRecord>, sqlx::Error> {
        let mut q = super::list_query::<Sqlite>("", owner, filter, after, limit, Sqlite::LIKE, by);
        q.build_query_as()
            .persistent(filter.search.is_none())
            .fetch_all(self)
            .await
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn create_session(&self, s: &NewSession<'_>) -> Result<(), StoreError> {
        Ok(Sqlite::insert_session(&self.pool, s).await?)
    }

    async fn get_session(&self, owner: &str, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        Ok(Sqlite::get_session(&self.pool, owner, id).await?)
    }

    async fn session_controls(&self, owner: &str, id: &str) -> Result<Option<String>, StoreError> {
        Ok(Sqlite::session_controls(&self.pool, owner, id).await?)
    }

    async fn list_sessions(
        &self,
        owner: &str,
        filter: &ListFilter,
        after: Option<Position<'_>>,
        limit: u32,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let index = Some(Sqlite::SEARCH_INDEX);
        Ok(Sqlite::list_sessions(&mut conn, owner, filter, after, limit, index).await?)
    }

    async fn set_archived(&self, owner: &str, id: &str, at: Option<i64>) -> Result<bool, StoreError> {
        Ok(Sqlite::set_archived(&self.pool, owner, id, at).await?)
    }

    async fn stale_sessions(
        &self,
        before: i64,
        after: Option<(i64, &str)>,
        limit: i64,
    ) -> Result<Vec<super::StaleSession>, StoreError> {
        Ok(Sqlite::stale_sessions(&self.pool, before, after, limit).await?)
    }

    async fn delete_stale(
        &self,
        sessions: &[super::StaleSession],
        before: i64,
    ) -> Result<Vec<super::StaleSession>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let deleted = Sqlite::delete_stale(&mut tx, sessions, before).await?;
        tx.commit().await?;
        Ok(deleted)
    }

    async fn delete_session(&self, owner: &str, id: &str) -> Result<bool, StoreError> {
        // Its chunks go with the row (a trigger: `…_chunks_keyed_by_session_number`).
        Ok(Sqlite::delete_session(&self.pool, owner, id).await?)
    }

    async fn write_batch(&self, writes: &[SessionWrite]) -> Result<(), StoreError> {
        // Through the pool (an in-memory database; a file uses the transcript writer's own
        // connection, [`Self::transcript_writer`]): a chunk and the row it advances in one
        // transaction; a lone metadata write is a single statement, atomic on its own.
        if let [only] = writes
            && only.chunk.is_none()
        {
            Sqlite::write_batch(&mut *self.pool.acquire().await?, writes).await?;
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        Sqlite::write_batch(&mut tx, writes).await?;
        tx.commit().await?;
        Ok(())
    }

    fn transcript_writer(&self) -> Option<Result<Box<dyn super::sqlite_writer::BatchWriter>, StoreError>> {
        let path = self.path.as_deref()?;
        Some(
            super::sqlite_writer::SqliteWriter::open(path)
                .map(|w| Box::new(w) as Box<dyn super::sqlite_writer::BatchWriter>),
        )
    }

    async fn read_events(
        &self,
        owner: &str,
        id: &str,
        after_seq: i64,
        max_chunks: u32,
    ) -> Result<Vec<EventChunk>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        Ok(Sqlite::read_events(&mut conn, owner, id, after_seq, max_chunks).await?)
    }

    async fn cursor_key(&self) -> Result<Vec<u8>, StoreError> {
        Ok(Sqlite::cursor_key(&mut *self.pool.acquire().await?).await?)
    }

    async fn stored_bytes(&self, owner: &str) -> Result<u64, StoreError> {
        let bytes = Sqlite::stored_bytes(&self.pool, owner).await?;
        Ok(u64::try_from(bytes).unwrap_or(0))
    }

    async fn users_overview(&self, limit: i64) -> Result<Vec<super::UserOverview>, StoreError> {
        Ok(Sqlite::users_overview(&self.pool, limit).await?)
    }
}
