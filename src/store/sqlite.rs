//! The embedded default: a SQLite file in WAL mode.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};

use super::{
    EventChunk, ListFilter, NewSession, Position, SESSION_COLUMNS, SessionRecord, SessionWrite, Store, StoreError,
};

/// A SQLite-backed [`Store`].
#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// Connections to the file (WAL: readers never block the transcript writer).
    pool: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating if needed) the file named by `url` and migrates it.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let path = url.trim_start_matches("sqlite://").trim_start_matches("sqlite:");
        let path = path.split('?').next().unwrap_or(path);
        if !path.is_empty() && path != ":memory:" && !url.contains("mode=memory") {
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
            .connect_with(options)
            .await?;
        sqlx::migrate!("./migrations/sqlite").run(&pool).await?;
        Ok(Self { pool })
    }
}

/// The database holds every transcript and the cursor key: its directory is created 0700, the
/// file itself 0600 before SQLite opens it (SQLite gives its `-wal` and `-shm` the same mode), and
/// existing files that other users can read are made 0600 with a warning.
fn private_files(db: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(dir) = db.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
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
        make_private(Path::new(&name))?;
    }
    Ok(())
}

/// Changes a group- or world-accessible file to 0600, with a warning; a missing file is fine.
fn make_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = match std::fs::metadata(path) {
        Ok(m) => m.permissions().mode(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if mode & 0o077 != 0 {
        tracing::warn!(
            file = %path.display(),
            mode = format!("{:o}", mode & 0o777),
            "database file was readable by other users; changing its mode to 0600"
        );
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

fn record(row: &sqlx::sqlite::SqliteRow) -> Result<SessionRecord, sqlx::Error> {
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
impl Store for SqliteStore {
    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn create_session(&self, s: &NewSession<'_>) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO sessions (id, owner, agent, agent_session_id, cwd, additional_dirs, meta, created_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8)",
        )
        .bind(s.id)
        .bind(s.owner)
        .bind(s.agent)
        .bind(s.agent_session_id)
        .bind(s.cwd)
        .bind(s.additional_dirs)
        .bind(s.meta)
        .bind(s.now)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn get_session(&self, owner: &str, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ?1 AND owner = ?2"
        ))
        .bind(id)
        .bind(owner)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.as_ref().map(record).transpose()?)
    }

    async fn list_sessions(
        &self,
        owner: &str,
        filter: &ListFilter,
        after: Option<Position<'_>>,
        limit: u32,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        let mut q = super::list_query::<sqlx::Sqlite>("", owner, filter, after, limit, "LIKE");
        let rows = q.build().fetch_all(&self.pool).await?;
        Ok(rows.iter().map(record).collect::<Result<_, _>>()?)
    }

    async fn delete_session(&self, owner: &str, id: &str) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query("DELETE FROM sessions WHERE id = ?1 AND owner = ?2")
            .bind(id)
            .bind(owner)
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() > 0 {
            // ON DELETE CASCADE covers this; deleting explicitly keeps it true even for a
            // connection opened without foreign keys.
            sqlx::query("DELETE FROM session_events WHERE session_id = ?1")
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(done.rows_affected() > 0)
    }

    async fn write_batch(&self, writes: &[SessionWrite]) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        for w in writes {
            if let Some(chunk) = &w.chunk {
                let done = sqlx::query(
                    "INSERT INTO session_events (session_id, seq_from, seq_to, payload, created_at)
                     SELECT ?1, ?2, ?3, ?4, ?5 WHERE EXISTS (SELECT 1 FROM sessions WHERE id = ?1)
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
                    last_seq = MAX(last_seq, ?2),
                    updated_at = MAX(updated_at, ?3),
                    message_count = message_count + ?4,
                    title = COALESCE(?5, title, ?6)
                 WHERE id = ?1",
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
        let rows = sqlx::query(
            "SELECT e.seq_from, e.seq_to, e.payload FROM session_events e
             JOIN sessions s ON s.id = e.session_id
             WHERE e.session_id = ?1 AND s.owner = ?2 AND e.seq_to > ?3
             ORDER BY e.seq_from LIMIT ?4",
        )
        .bind(id)
        .bind(owner)
        .bind(after_seq)
        .bind(i64::from(max_chunks))
        .fetch_all(&self.pool)
        .await?;
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
        sqlx::query("INSERT OR IGNORE INTO gateway_settings (name, value) VALUES ('cursor_key', ?1)")
            .bind(fresh.as_slice())
            .execute(&self.pool)
            .await?;
        let row = sqlx::query("SELECT value FROM gateway_settings WHERE name = 'cursor_key'")
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get(0)?)
    }
}
