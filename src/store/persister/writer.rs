//! The writer's store side: a write attempted and retried until it is stored, split by session
//! when it fails for good, and the writes put off until the queue is quiet (held-back metadata,
//! session rows left behind their stored chunks).

use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::batch::merge_metadata;
use super::health::Health;
use crate::store::sqlite_writer::BatchWriter;
use crate::store::{ChunksStored, SessionWrite, Store, StoreError, now_micros};

/// Attempts at a write failing with a permanent error before it is given up on.
const PERMANENT_ATTEMPTS: u32 = 3;
/// Longest pause between attempts at a failing write.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// What an attempt at a write came to.
enum Attempt {
    Stored,
    /// Shutdown gave up on it (the database was unreachable).
    GaveUp,
    /// It failed with a permanent error [`PERMANENT_ATTEMPTS`] times.
    Failed(StoreError),
}

/// The writer's store, shutdown signal and health.
pub(super) struct Writer<'a> {
    store: &'a dyn Store,
    cancel: &'a CancellationToken,
    health: &'a Health,
    /// This replica, when sessions are leased ([`Persister::spawn_leased`](super::Persister::spawn_leased)).
    holder: Option<&'a str>,
    /// Sessions whose chunks the store refused (their lease is another replica's), since the
    /// last batch's commit notices.
    refused: Mutex<HashSet<Arc<str>>>,
    /// The store's connection for this thread ([`Store::transcript_writer`]), if it has one
    /// (shared with the [`Stage`](super::stage::Stage)).
    direct: Option<Arc<Mutex<Box<dyn BatchWriter>>>>,
    /// Sessions whose rows the store has not advanced past their stored chunks yet
    /// ([`Store::write_chunks_unsettled`]).
    unsettled: Mutex<Unsettled>,
}

/// Sessions left for [`Store::settle_sessions`], since when, and when to try again after a
/// settle failed.
#[derive(Default)]
struct Unsettled {
    sessions: HashSet<Arc<str>>,
    since: Option<Instant>,
    not_before: Option<Instant>,
}

/// How long a failed settle waits before the next (the rows only lag; nobody waits on them).
const SETTLE_RETRY: Duration = Duration::from_secs(1);

impl<'a> Writer<'a> {
    /// A writer through `store`, or through its connection `direct` when it has one.
    pub(super) fn new(
        store: &'a dyn Store,
        cancel: &'a CancellationToken,
        health: &'a Health,
        holder: Option<&'a str>,
        direct: Option<Arc<Mutex<Box<dyn BatchWriter>>>>,
    ) -> Self {
        Self {
            store,
            cancel,
            health,
            holder,
            refused: Mutex::new(HashSet::new()),
            direct,
            unsettled: Mutex::default(),
        }
    }

    /// The sessions the store refused since the last call (their lease is another replica's).
    pub(super) fn take_refused(&self) -> HashSet<Arc<str>> {
        std::mem::take(&mut *self.refused.lock())
    }

    /// Since when writes were put off (the store's own connection's, the sessions left for
    /// [`Store::settle_sessions`]), if any are.
    pub(super) fn unsettled_since(&self) -> Option<Instant> {
        let own = {
            let u = self.unsettled.lock();
            u.since.filter(|_| u.not_before.is_none_or(|t| Instant::now() >= t))
        };
        let direct = self.direct.as_ref().and_then(|d| d.lock().unsettled_since());
        own.into_iter().chain(direct).min()
    }

    /// What a write through the store came to: the sessions it refused are told they were fenced,
    /// the ones whose chunks it stored are left for [`Store::settle_sessions`] if it left their
    /// rows behind.
    fn stored(&self, writes: &[SessionWrite], stored: ChunksStored) {
        let ChunksStored { refused, rows_behind } = stored;
        if rows_behind {
            let mut u = self.unsettled.lock();
            for w in writes
                .iter()
                .filter(|w| w.chunk.is_some() && !refused.contains(&w.session_id))
            {
                if !u.sessions.contains(&w.session_id) {
                    u.sessions.insert(w.session_id.clone());
                }
                u.since.get_or_insert_with(Instant::now);
            }
        }
        if refused.is_empty() {
            return;
        }
        tracing::warn!(sessions = ?refused, "updates refused: another replica holds these sessions now");
        // Only sessions whose updates were in this batch are told they were fenced (a refused
        // controls-only write has no update waiting on it).
        let with_updates = |s: &Arc<str>| writes.iter().any(|w| w.session_id == *s && w.chunk.is_some());
        self.refused.lock().extend(refused.into_iter().filter(with_updates));
    }

    /// Makes the writes nobody waits on: the held-back metadata, and the session rows put off
    /// (by the store's own connection, [`BatchWriter::settle`], or through the store,
    /// [`Store::settle_sessions`]; kept for the next try if it fails).
    pub(super) async fn put_off_writes(&self, metadata: Vec<SessionWrite>) {
        if !metadata.is_empty() {
            let merged = merge_metadata(metadata);
            self.write(&merged, 0).await;
        }
        if let Some(direct) = &self.direct
            && let Err(e) = direct.lock().settle()
        {
            tracing::warn!(error = %e, "sessions not advanced past their stored chunks yet; trying again when the queue is quiet");
        }
        let sessions: Vec<Arc<str>> = {
            let mut u = self.unsettled.lock();
            u.sessions.drain().collect()
        };
        if sessions.is_empty() {
            return;
        }
        // A write like any other to /readyz: one waiting on the database too long, or failing,
        // makes the writer unhealthy (a frozen database shows here first when the queue is quiet).
        self.health.writing_since.store(now_micros(), Ordering::Release);
        let settled = self.store.settle_sessions(&sessions).await;
        self.health.writing_since.store(0, Ordering::Release);
        match &settled {
            Ok(()) => self.health.succeeded(),
            Err(e) => self.health.failed(e),
        }
        let mut u = self.unsettled.lock();
        match settled {
            Ok(()) => {
                if u.sessions.is_empty() {
                    u.since = None;
                }
                u.not_before = None;
            }
            Err(e) => {
                tracing::warn!(error = %e, sessions = sessions.len(), "sessions not advanced past their stored chunks yet; trying again");
                u.sessions.extend(sessions);
                u.not_before = Some(Instant::now() + SETTLE_RETRY);
            }
        }
    }

    /// Writes `writes`, retrying until it succeeds or shutdown gives up on it (`None`: nobody saw
    /// those updates, they are released only once stored). A batch failing for good is written
    /// session by session; the sessions whose own writes still fail for good are returned
    /// (dropped, logged): everything else is stored.
    pub(super) async fn write(&self, writes: &[SessionWrite], updates: u64) -> Option<HashSet<Arc<str>>> {
        let started = std::time::Instant::now();
        let mut dropped = HashSet::new();
        match self.attempt(writes, updates).await {
            Attempt::Stored => {}
            Attempt::GaveUp => return None,
            Attempt::Failed(e) => {
                let mut sessions: Vec<&Arc<str>> = Vec::new();
                for w in writes {
                    if !sessions.contains(&&w.session_id) {
                        sessions.push(&w.session_id);
                    }
                }
                if sessions.len() > 1 {
                    tracing::warn!(error = %e, sessions = sessions.len(), "transcript batch failed for good; writing each session on its own");
                }
                for session in sessions {
                    let own: Vec<SessionWrite>;
                    let (own, error) = if writes.iter().all(|w| w.session_id == *session) {
                        (writes, Some(&e))
                    } else {
                        own = writes.iter().filter(|w| w.session_id == *session).cloned().collect();
                        (&own[..], None)
                    };
                    let n = own
                        .iter()
                        .filter_map(|w| w.chunk.as_ref())
                        .map(|c| (c.seq_to - c.seq_from + 1) as u64)
                        .sum::<u64>();
                    let failed = match error {
                        Some(e) => e.to_string(),
                        None => match self.attempt(own, n).await {
                            Attempt::Stored => continue,
                            Attempt::GaveUp => return None,
                            Attempt::Failed(e) => e.to_string(),
                        },
                    };
                    self.health.dropped.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!(crate::infra::metrics::TRANSCRIPT_WRITES_DROPPED).increment(1);
                    metrics::counter!(crate::infra::metrics::TRANSCRIPT_UPDATES_DROPPED).increment(n);
                    tracing::error!(
                        session = %session,
                        error = %failed,
                        updates = n,
                        "transcript write failed for good: dropped; this session's updates are never shown"
                    );
                    dropped.insert(session.clone());
                }
                // The writer moves on: it is not failing for what was dropped.
                self.health.succeeded();
            }
        }
        metrics::histogram!(crate::infra::metrics::TRANSCRIPT_COMMIT_SECONDS).record(started.elapsed().as_secs_f64());
        Some(dropped)
    }

    /// Writes `writes` in one go, retrying transient errors with backoff until it succeeds or
    /// shutdown gives up on it, and permanent ones a few times.
    async fn attempt(&self, writes: &[SessionWrite], updates: u64) -> Attempt {
        let mut backoff = Duration::from_millis(50);
        let mut permanent = 0;
        loop {
            self.health.writing_since.store(now_micros(), Ordering::Release);
            let result = match &self.direct {
                Some(direct) => direct.lock().write_batch(writes),
                None => self
                    .store
                    .write_chunks_unsettled(writes, self.holder)
                    .await
                    .map(|stored| self.stored(writes, stored)),
            };
            self.health.writing_since.store(0, Ordering::Release);
            let e = match result {
                Ok(()) => {
                    self.health.succeeded();
                    metrics::counter!(crate::infra::metrics::TRANSCRIPT_UPDATES_STORED).increment(updates);
                    return Attempt::Stored;
                }
                Err(e) => e,
            };
            self.health.failed(&e);
            metrics::counter!(crate::infra::metrics::TRANSCRIPT_WRITE_ERRORS).increment(1);
            if self.cancel.is_cancelled() {
                tracing::error!(error = %e, updates, "shutting down with the database unreachable: not stored");
                return Attempt::GaveUp;
            }
            if !e.is_transient() {
                permanent += 1;
                if permanent >= PERMANENT_ATTEMPTS {
                    return Attempt::Failed(e);
                }
            }
            tracing::warn!(error = %e, transient = e.is_transient(), retry_in_ms = backoff.as_millis() as u64, "transcript write failed; retrying");
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = self.cancel.cancelled() => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}
