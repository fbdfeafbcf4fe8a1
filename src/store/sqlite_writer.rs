//! SQLite's transcript writer: one connection of its own (rusqlite), used only by the transcript
//! writer on its own thread, with its statements prepared once. A commit is a call on that
//! thread, not a message to a connection's worker thread and back per statement (sqlx's shape):
//! every update waits for a commit before anyone sees it, so that hop was on every client's path.
//!
//! Chunks are stored on their own: a lone chunk is one statement, anything else one `BEGIN
//! IMMEDIATE` transaction, and neither touches the sessions they belong to. Advancing a
//! session's row (`last_seq`, `updated_at`, `stored_bytes`) rewrites the row and both of the
//! owner's list indexes: twice the pages of the chunk itself, on the commit every update waits
//! on. The writer keeps those advances and makes them in one transaction when the queue is quiet
//! ([`BatchWriter::settle`]): nobody waits on them. `last_seq` and `stored_bytes` move together,
//! so after a crash the store accounts for the chunks above a row's `last_seq` when it opens
//! ([`super::sqlite::SqliteStore::connect`]), and a session is read with the newest stored
//! chunk's seq ([`super::sql::Sql::LAST_SEQ`]).
//!
//! Checkpoints (copying the WAL into the database file, with an fsync) are off this connection:
//! SQLite's automatic one runs inside the commit that crosses 1,000 pages, which put a 10 ms
//! fsync on the path of whichever update came then. A thread of its own checkpoints every
//! [`CHECKPOINT_EVERY`] instead (`PASSIVE`: it never waits for, nor blocks, the writer).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags, TransactionBehavior, params};

use super::sql::Sql;
use super::{EventChunk, SessionWrite, StoreError};

/// Inserts a chunk, unless its session is gone (deleted meanwhile) or it is already stored: the
/// statement the store's own pool runs.
const INSERT_CHUNK: &str = <sqlx::Sqlite as Sql>::INSERT_CHUNK;

/// A session's message count, titles and controls (its chunks advance it in [`ADVANCE_SESSION`]).
const UPDATE_SESSION: &str = "UPDATE sessions SET
        updated_at = MAX(updated_at, ?2),
        message_count = message_count + ?3,
        title = COALESCE(?4, title, ?5),
        controls = COALESCE(?6, controls)
     WHERE id = ?1";

/// A session's row after chunks of it were stored: `last_seq` and `stored_bytes` together.
const ADVANCE_SESSION: &str = "UPDATE sessions SET
        last_seq = MAX(last_seq, ?2),
        updated_at = MAX(updated_at, ?3),
        stored_bytes = stored_bytes + ?4
     WHERE id = ?1";

/// A batch writer that runs on the caller's thread (the transcript writer's own).
pub trait BatchWriter: Send {
    /// Writes `writes` atomically.
    fn write_batch(&mut self, writes: &[SessionWrite]) -> Result<(), StoreError>;
    /// Since when this writer has writes it put off (none: `None`): [`Self::settle`] makes them.
    fn unsettled_since(&self) -> Option<Instant> {
        None
    }
    /// Makes the writes put off so far, in one transaction.
    fn settle(&mut self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// How far a session's stored chunks go beyond its row.
#[derive(Debug, Clone, Copy, Default)]
struct Advance {
    last_seq: i64,
    updated_at: i64,
    bytes: i64,
}

impl Advance {
    fn add(&mut self, chunk: &EventChunk, at: i64) {
        self.last_seq = self.last_seq.max(chunk.seq_to);
        self.updated_at = self.updated_at.max(at);
        self.bytes += i64::try_from(chunk.payload.len()).unwrap_or(i64::MAX);
    }
}

/// How often the checkpoint thread copies the WAL into the database file.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(250);

/// The transcript writer's own SQLite connection.
pub struct SqliteWriter {
    conn: Connection,
    /// Sessions whose rows lag their stored chunks, and since when the oldest has.
    unsettled: HashMap<Arc<str>, Advance>,
    unsettled_since: Option<Instant>,
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
            unsettled: HashMap::new(),
            unsettled_since: None,
            _checkpoints: Checkpoints::start(path)?,
        })
    }

    /// Keeps what chunks just committed advance their sessions by, for [`BatchWriter::settle`].
    fn put_off<'w>(&mut self, stored: impl IntoIterator<Item = &'w SessionWrite>) {
        for w in stored {
            if let Some(chunk) = &w.chunk {
                self.unsettled
                    .entry(w.session_id.clone())
                    .or_default()
                    .add(chunk, w.updated_at);
                self.unsettled_since.get_or_insert_with(Instant::now);
            }
        }
    }
}

impl BatchWriter for SqliteWriter {
    fn write_batch(&mut self, writes: &[SessionWrite]) -> Result<(), StoreError> {
        if let [only] = writes
            && let Some(chunk) = &only.chunk
            && !only.has_metadata()
        {
            if insert_chunk(&self.conn, &only.session_id, chunk, only.updated_at)? {
                self.put_off([only]);
            }
            return Ok(());
        }
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sqlite)?;
        let mut stored: Vec<&SessionWrite> = Vec::new();
        for w in writes {
            if let Some(chunk) = &w.chunk
                && insert_chunk(&tx, &w.session_id, chunk, w.updated_at)?
            {
                stored.push(w);
            }
            if w.has_metadata() {
                let mut update = tx.prepare_cached(UPDATE_SESSION).map_err(sqlite)?;
                update
                    .execute(params![
                        &*w.session_id,
                        w.updated_at,
                        w.prompts,
                        w.agent_title.as_deref(),
                        w.prompt_title.as_deref(),
                        w.controls.as_deref(),
                    ])
                    .map_err(sqlite)?;
            }
        }
        tx.commit().map_err(sqlite)?;
        self.put_off(stored);
        Ok(())
    }

    fn unsettled_since(&self) -> Option<Instant> {
        self.unsettled_since
    }

    fn settle(&mut self) -> Result<(), StoreError> {
        if self.unsettled.is_empty() {
            return Ok(());
        }
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sqlite)?;
        for (session, a) in &self.unsettled {
            let mut advance = tx.prepare_cached(ADVANCE_SESSION).map_err(sqlite)?;
            advance
                .execute(params![&**session, a.last_seq, a.updated_at, a.bytes])
                .map_err(sqlite)?;
        }
        tx.commit().map_err(sqlite)?;
        self.unsettled.clear();
        self.unsettled_since = None;
        Ok(())
    }
}

/// Whether the chunk was stored (not: its session is gone, or its seq range already stored).
fn insert_chunk(conn: &Connection, session_id: &str, chunk: &EventChunk, at: i64) -> Result<bool, StoreError> {
    let mut insert = conn.prepare_cached(INSERT_CHUNK).map_err(sqlite)?;
    let rows = insert
        .execute(params![
            session_id,
            chunk.seq_from,
            chunk.seq_to,
            chunk.payload.as_str(),
            at
        ])
        .map_err(sqlite)?;
    Ok(rows > 0)
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
