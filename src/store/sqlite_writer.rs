//! SQLite's transcript writer: one connection of its own (rusqlite), used only by the transcript
//! writer on its own thread, with its statements prepared once. A commit is a call on that
//! thread, not a message to a connection's worker thread and back per statement (sqlx's shape):
//! every update waits for a commit before anyone sees it, so that hop was on every client's path.
//!
//! The statements are the ones [`super::sql`] runs for SQLite; the shapes match
//! [`super::sqlite::SqliteStore`]'s `write_batch`: a lone chunk is one statement (the trigger
//! advances its session), anything else one `BEGIN IMMEDIATE` transaction.
//!
//! Checkpoints (copying the WAL into the database file, with an fsync) are off this connection:
//! SQLite's automatic one runs inside the commit that crosses 1,000 pages, which put a 10 ms
//! fsync on the path of whichever update came then. A thread of its own checkpoints every
//! [`CHECKPOINT_EVERY`] instead (`PASSIVE`: it never waits for, nor blocks, the writer).

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, TransactionBehavior, params};

use super::{EventChunk, SessionWrite, StoreError};

/// Inserts a chunk, unless its session is gone (deleted meanwhile) or it is already stored.
const INSERT_CHUNK: &str = "INSERT INTO session_events (session_id, seq_from, seq_to, payload, created_at)
     SELECT ?1, ?2, ?3, ?4, ?5 WHERE EXISTS (SELECT 1 FROM sessions WHERE id = ?1)
     ON CONFLICT (session_id, seq_from) DO NOTHING";

/// A session's row after a batch (its chunk's bytes and `last_seq` are the trigger's).
const UPDATE_SESSION: &str = "UPDATE sessions SET
        last_seq = MAX(last_seq, ?2),
        updated_at = MAX(updated_at, ?3),
        message_count = message_count + ?4,
        title = COALESCE(?5, title, ?6),
        controls = COALESCE(?7, controls)
     WHERE id = ?1";

/// A batch writer that runs on the caller's thread (the transcript writer's own).
pub trait BatchWriter: Send {
    /// Writes `writes` atomically.
    fn write_batch(&mut self, writes: &[SessionWrite]) -> Result<(), StoreError>;
}

/// How often the checkpoint thread copies the WAL into the database file.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(250);

/// The transcript writer's own SQLite connection.
pub struct SqliteWriter {
    conn: Connection,
    _checkpoints: Checkpoints,
}

/// The checkpoint thread; stopped and joined when dropped.
struct Checkpoints {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpoints {
    fn start(path: &str) -> Result<Self, StoreError> {
        let conn = open(path)?;
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("sqlite-checkpoint".into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(CHECKPOINT_EVERY) {
                    if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                        tracing::warn!(error = %e, "SQLite checkpoint failed; the WAL grows until one succeeds");
                    }
                }
            })
            .map_err(|e| StoreError::Sqlite {
                code: 1,
                message: format!("cannot start the checkpoint thread: {e}"),
            })?;
        Ok(Self {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Checkpoints {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A connection to `path` set up as the pool's are: WAL, `synchronous = NORMAL`, foreign keys,
/// a 10 s busy wait.
fn open(path: &str) -> Result<Connection, StoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags(path, flags).map_err(sqlite)?;
    conn.busy_timeout(Duration::from_secs(10)).map_err(sqlite)?;
    conn.pragma_update(None, "journal_mode", "WAL").map_err(sqlite)?;
    conn.pragma_update(None, "synchronous", "NORMAL").map_err(sqlite)?;
    conn.pragma_update(None, "foreign_keys", "ON").map_err(sqlite)?;
    Ok(conn)
}

impl SqliteWriter {
    /// Opens `path` (already created and migrated by the pool) for writing, with automatic
    /// checkpoints off and the checkpoint thread started.
    pub fn open(path: &str) -> Result<Self, StoreError> {
        let conn = open(path)?;
        conn.pragma_update(None, "wal_autocheckpoint", 0).map_err(sqlite)?;
        conn.set_prepared_statement_cache_capacity(8);
        Ok(Self {
            conn,
            _checkpoints: Checkpoints::start(path)?,
        })
    }
}

impl BatchWriter for SqliteWriter {
    fn write_batch(&mut self, writes: &[SessionWrite]) -> Result<(), StoreError> {
        if let [only] = writes
            && let Some(chunk) = &only.chunk
            && !has_metadata(only)
        {
            insert_chunk(&self.conn, &only.session_id, chunk, only.updated_at)?;
            return Ok(());
        }
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sqlite)?;
        for w in writes {
            if let Some(chunk) = &w.chunk {
                insert_chunk(&tx, &w.session_id, chunk, w.updated_at)?;
            }
            let mut update = tx.prepare_cached(UPDATE_SESSION).map_err(sqlite)?;
            update
                .execute(params![
                    &*w.session_id,
                    w.chunk.as_ref().map_or(0, |c| c.seq_to),
                    w.updated_at,
                    w.prompts,
                    w.agent_title.as_deref(),
                    w.prompt_title.as_deref(),
                    w.controls.as_deref(),
                ])
                .map_err(sqlite)?;
        }
        tx.commit().map_err(sqlite)
    }
}

/// Whether a write changes the session's message count, titles or controls.
fn has_metadata(w: &SessionWrite) -> bool {
    w.prompts != 0 || w.agent_title.is_some() || w.prompt_title.is_some() || w.controls.is_some()
}

fn insert_chunk(conn: &Connection, session_id: &str, chunk: &EventChunk, at: i64) -> Result<(), StoreError> {
    let mut insert = conn.prepare_cached(INSERT_CHUNK).map_err(sqlite)?;
    insert
        .execute(params![
            session_id,
            chunk.seq_from,
            chunk.seq_to,
            chunk.payload.as_str(),
            at
        ])
        .map_err(sqlite)?;
    Ok(())
}

/// rusqlite's error as the store's, keeping SQLite's extended result code (so transient
/// failures, a busy or full database, are told from permanent ones the same way as sqlx's).
fn sqlite(e: rusqlite::Error) -> StoreError {
    match e {
        rusqlite::Error::SqliteFailure(code, message) => StoreError::Sqlite {
            code: code.extended_code,
            message: message.unwrap_or_else(|| code.to_string()),
        },
        other => StoreError::Sqlite {
            code: 1,
            message: other.to_string(),
        },
    }
}
