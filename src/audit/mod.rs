//! The audit log: who did what. Sign-ins and sign-outs (and refusals), sessions created, loaded
//! and deleted, agent sign-ins (method type and outcome, never a value), admin actions and cap
//! refusals, each with its time, user, connection, replica and client address.
//!
//! [`Audit::record`] never waits: an entry is written as a structured log line (target `audit`,
//! for log shippers) and queued for the store, where a writer task appends it in batches. A full
//! queue drops the entry from the store (never the log line), counted in
//! `acp_gateway_audit_dropped_total`. Entries older than `audit.retention_days` are pruned hourly.
//! Cap refusals are recorded once per user, cap and minute, so a client hammering a cap cannot
//! fill the table.
//!
//! What nobody signed in did (a bad login code, a refused token, a failed callback from the
//! identity provider) costs its sender nothing, so it is aggregated: the first of a kind from a
//! client address in a minute is recorded at once, the rest are counted, and when the minute is
//! over one more row says how many (`detail.repeated`). Past [`ANONYMOUS_KEYS`] addresses in a
//! minute, the others share one count. These rows go through a queue of their own
//! ([`ANONYMOUS_QUEUE`]), so anonymous noise can never push out what a signed-in person did.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::store::{CALL_LIMIT, StoreError, now_micros};

mod store;

pub use store::{AuditEntry, AuditFilter, AuditLog};

/// Entries queued for the store, at most.
const QUEUE: usize = 4096;
/// Entries of people not signed in queued for the store, at most (apart from [`QUEUE`]).
const ANONYMOUS_QUEUE: usize = 256;
/// Entries written per batch, at most.
const BATCH: usize = 256;
/// A cap refusal of one user is recorded once per this.
const CAP_EVERY: Duration = Duration::from_secs(60);
/// Anonymous entries of one kind from one address are counted over this, then summed up.
const ANONYMOUS_EVERY: Duration = Duration::from_secs(60);
/// Addresses counted apart in one window, at most; the rest share one count.
const ANONYMOUS_KEYS: usize = 1024;
/// How often windows that are over are summed up.
const SUM_UP_EVERY: Duration = Duration::from_secs(10);

pub use crate::infra::auditing::Event;

/// The audit log's front door.
#[derive(Debug)]
pub struct Audit {
    /// Entries of signed-in people and of the gateway itself.
    tx: mpsc::Sender<AuditEntry>,
    /// Entries of people not signed in (aggregated first).
    anonymous_tx: mpsc::Sender<AuditEntry>,
    replica: String,
    caps: Mutex<HashMap<(String, &'static str), Instant>>,
    /// The anonymous windows open now.
    anonymous: Mutex<HashMap<AnonymousKey, Window>>,
    /// The stored log as the admin routes read it (each read bounded in time).
    reads: AuditLog,
}

/// What anonymous entries are counted under: client address (`None`: the shared count of
/// addresses past [`ANONYMOUS_KEYS`]), action, outcome and the detail's `method`.
type AnonymousKey = (Option<String>, &'static str, &'static str, Option<String>);

/// One kind of anonymous entry from one address in one window.
#[derive(Debug)]
struct Window {
    /// When its first entry came.
    opened: Instant,
    /// Entries after the first.
    repeated: u64,
    /// The first entry's detail (the summary carries it too).
    detail: Option<serde_json::Value>,
}

impl Audit {
    /// The log, and its writer task, which flushes what is queued when `stop` fires (after the
    /// connections have ended: await it then).
    pub fn spawn(
        store: AuditLog,
        replica: String,
        retention_days: u64,
        stop: CancellationToken,
    ) -> (Arc<Self>, tokio::task::JoinHandle<()>) {
        let (audit, queues) = Self::open(&store, replica);
        #[expect(
            clippy::disallowed_methods,
            reason = "returned: the application awaits it at shutdown"
        )]
        let task = tokio::spawn(write(store, queues, retention_days, stop));
        (audit, task)
    }

    /// The log, and the queues its writer reads.
    fn open(store: &AuditLog, replica: String) -> (Arc<Self>, Queues) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let (anonymous_tx, anonymous_rx) = mpsc::channel(ANONYMOUS_QUEUE);
        let audit = Arc::new(Self {
            tx,
            anonymous_tx,
            replica,
            caps: Mutex::default(),
            anonymous: Mutex::default(),
            reads: store.bounded(CALL_LIMIT),
        });
        let queues = Queues {
            signed_in: rx,
            anonymous: anonymous_rx,
            audit: Arc::downgrade(&audit),
        };
        (audit, queues)
    }

    /// A page of the stored log, newest first.
    pub async fn page(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>, StoreError> {
        self.reads.page(filter).await
    }

    /// Each user's last successful sign-in (epoch µs), as stored.
    pub async fn last_sign_ins(&self) -> Result<Vec<(String, i64)>, StoreError> {
        self.reads.last_sign_ins().await
    }

    /// Records `e`: a log line now, a row soon. What nobody signed in did is aggregated per
    /// client address and minute.
    pub fn record(&self, e: Event<'_>) {
        if e.actor.is_empty() {
            self.anonymous(e);
        } else {
            let entry = self.entry(e);
            if self.tx.try_send(entry).is_err() {
                metrics::counter!(crate::infra::metrics::AUDIT_DROPPED).increment(1);
            }
        }
    }

    /// An anonymous entry: recorded when it opens a window, counted otherwise.
    fn anonymous(&self, e: Event<'_>) {
        let method = e
            .detail
            .as_ref()
            .and_then(|d| d.get("method"))
            .and_then(serde_json::Value::as_str)
            .map(String::from);
        let now = Instant::now();
        let mut summaries = Vec::new();
        let first = {
            let mut open = self.anonymous.lock();
            let mut key = (e.client.clone(), e.action, e.outcome, method);
            if !open.contains_key(&key) && open.len() >= ANONYMOUS_KEYS {
                summaries = close_windows(&mut open, now);
                if open.len() >= ANONYMOUS_KEYS {
                    key.0 = None;
                }
            }
            match open.get_mut(&key) {
                Some(w) if now.duration_since(w.opened) < ANONYMOUS_EVERY => {
                    w.repeated += 1;
                    false
                }
                _ => {
                    if let Some(old) = open.remove(&key) {
                        summaries.push((key.clone(), old));
                    }
                    open.insert(
                        key,
                        Window {
                            opened: now,
                            repeated: 0,
                            detail: e.detail.clone(),
                        },
                    );
                    true
                }
            }
        };
        for (key, window) in summaries {
            self.sum_up(key, window);
        }
        if first {
            let entry = self.entry(e);
            self.queue_anonymous(entry);
        }
    }

    /// Sums up the anonymous windows that are over (`all`: every one, at shutdown).
    fn sum_up_windows(&self, all: bool) {
        let closed = {
            let mut open = self.anonymous.lock();
            if all {
                open.drain().collect()
            } else {
                close_windows(&mut open, Instant::now())
            }
        };
        for (key, window) in closed {
            self.sum_up(key, window);
        }
    }

    /// The row that says how many more came in a window (none when none did).
    fn sum_up(&self, (client, action, outcome, _): AnonymousKey, window: Window) {
        if window.repeated == 0 {
            return;
        }
        let mut detail = match window.detail {
            Some(serde_json::Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        };
        detail.insert("repeated".into(), window.repeated.into());
        detail.insert("windowSecs".into(), ANONYMOUS_EVERY.as_secs().into());
        if client.is_none() {
            detail.insert("addresses".into(), "many".into());
        }
        let entry = self.entry(Event {
            actor: "",
            action,
            target: None,
            outcome,
            detail: Some(serde_json::Value::Object(detail)),
            connection: None,
            client,
        });
        self.queue_anonymous(entry);
    }

    fn queue_anonymous(&self, entry: AuditEntry) {
        if self.anonymous_tx.try_send(entry).is_err() {
            metrics::counter!(crate::infra::metrics::AUDIT_DROPPED).increment(1);
        }
    }

    /// `e` as a row, written as a log line on the way.
    fn entry(&self, e: Event<'_>) -> AuditEntry {
        let detail = e.detail.map(|d| d.to_string());
        tracing::info!(
            target: "audit",
            actor = %e.actor, action = e.action, target_id = ?e.target, outcome = e.outcome,
            detail = ?detail, connection = ?e.connection, client = ?e.client, replica = %self.replica,
            "audit"
        );
        AuditEntry {
            id: 0,
            at: now_micros(),
            actor: e.actor.to_string(),
            action: e.action.to_string(),
            target: e.target.map(String::from),
            outcome: e.outcome.to_string(),
            detail,
            connection: e.connection.map(String::from),
            replica: self.replica.clone(),
            client_addr: e.client,
        }
    }

    /// Records that `user` was refused at `cap` (at most once per user, cap and minute), on
    /// `connection` from the address `client`.
    pub fn cap_refused(&self, user: &str, cap: &'static str, connection: Option<&str>, client: Option<String>) {
        {
            let mut seen = self.caps.lock();
            let now = Instant::now();
            if seen.len() > 10_000 {
                seen.retain(|_, at| now.duration_since(*at) < CAP_EVERY);
            }
            match seen.get(&(user.to_string(), cap)) {
                Some(at) if now.duration_since(*at) < CAP_EVERY => return,
                _ => {
                    seen.insert((user.to_string(), cap), now);
                }
            }
        }
        self.record(Event {
            actor: user,
            action: "cap_refused",
            target: Some(cap),
            outcome: "refused",
            connection,
            client,
            ..Event::default()
        });
    }
}

/// Takes the windows that are over out of `open`.
fn close_windows(open: &mut HashMap<AnonymousKey, Window>, now: Instant) -> Vec<(AnonymousKey, Window)> {
    let over: Vec<AnonymousKey> = open
        .iter()
        .filter(|(_, w)| now.duration_since(w.opened) >= ANONYMOUS_EVERY)
        .map(|(k, _)| k.clone())
        .collect();
    over.into_iter()
        .filter_map(|k| open.remove(&k).map(|w| (k, w)))
        .collect()
}

/// What the writer reads.
struct Queues {
    signed_in: mpsc::Receiver<AuditEntry>,
    anonymous: mpsc::Receiver<AuditEntry>,
    /// To sum up anonymous windows as they end (weak: the writer does not keep the log alive).
    audit: Weak<Audit>,
}

/// Appends queued entries in batches until `stop`, then what is left; prunes hourly; sums up
/// anonymous windows as they end.
async fn write(store: AuditLog, queues: Queues, retention_days: u64, stop: CancellationToken) {
    let Queues {
        signed_in: mut rx,
        anonymous: mut anonymous_rx,
        audit,
    } = queues;
    let mut prune = tokio::time::interval(Duration::from_secs(3600));
    let mut sum_up = tokio::time::interval(SUM_UP_EVERY);
    let mut batch = Vec::with_capacity(BATCH);
    let mut anonymous_batch = Vec::with_capacity(BATCH);
    loop {
        tokio::select! {
            biased;
            n = rx.recv_many(&mut batch, BATCH) => {
                if n == 0 {
                    return;
                }
                flush(&store, &mut batch).await;
            }
            n = anonymous_rx.recv_many(&mut anonymous_batch, BATCH) => {
                if n == 0 {
                    return;
                }
                flush(&store, &mut anonymous_batch).await;
            }
            _ = sum_up.tick() => {
                if let Some(audit) = audit.upgrade() {
                    audit.sum_up_windows(false);
                }
            }
            _ = prune.tick() => {
                if retention_days > 0 {
                    let before = now_micros() - (retention_days as i64) * 86_400_000_000;
                    if let Err(e) = store.prune(before).await {
                        tracing::warn!(error = %e, "cannot prune the audit log");
                    }
                }
            }
            () = stop.cancelled() => {
                if let Some(audit) = audit.upgrade() {
                    audit.sum_up_windows(true);
                }
                while let Ok(entry) = rx.try_recv() {
                    batch.push(entry);
                }
                while let Ok(entry) = anonymous_rx.try_recv() {
                    batch.push(entry);
                }
                flush(&store, &mut batch).await;
                return;
            }
        }
    }
}

async fn flush(store: &AuditLog, batch: &mut Vec<AuditEntry>) {
    if let Err(e) = store.append(batch).await {
        tracing::error!(error = %e, entries = batch.len(), "cannot write audit entries (they are in the log above)");
        metrics::counter!(crate::infra::metrics::AUDIT_DROPPED).increment(batch.len() as u64);
    }
    batch.clear();
}
impl crate::infra::auditing::Recorder for Audit {
    fn record(&self, e: Event<'_>) {
        Audit::record(self, e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::advance;

    /// The log over an in-memory database (nothing here reads it), the clock paused after the
    /// database is open (its pool's waits run on the same clock).
    async fn paused_log() -> (Arc<Audit>, Queues) {
        let db = crate::store::open("sqlite::memory:", None).await.expect("database").db;
        tokio::time::pause();
        Audit::open(&AuditLog::new(db), "r1".into())
    }

    fn drain(rx: &mut mpsc::Receiver<AuditEntry>) -> Vec<AuditEntry> {
        std::iter::from_fn(|| rx.try_recv().ok()).collect()
    }

    #[tokio::test]
    async fn a_cap_refusal_is_recorded_once_per_user_cap_and_minute() {
        let (audit, mut queues) = paused_log().await;
        audit.cap_refused("alice", "max_sessions", None, None);
        audit.cap_refused("alice", "max_sessions", None, None);
        audit.cap_refused("alice", "stored_bytes", None, None);
        audit.cap_refused("bob", "max_sessions", None, None);
        advance(CAP_EVERY - Duration::from_millis(1)).await;
        audit.cap_refused("alice", "max_sessions", None, None);
        let rows: Vec<(String, Option<String>)> = drain(&mut queues.signed_in)
            .into_iter()
            .map(|e| (e.actor, e.target))
            .collect();
        let row = |u: &str, c: &str| (u.to_string(), Some(c.to_string()));
        assert_eq!(
            rows,
            [
                row("alice", "max_sessions"),
                row("alice", "stored_bytes"),
                row("bob", "max_sessions")
            ],
            "once per user and cap within the minute"
        );
        advance(Duration::from_millis(1)).await;
        audit.cap_refused("alice", "max_sessions", None, None);
        assert_eq!(drain(&mut queues.signed_in).len(), 1, "again once the minute is over");
    }

    #[tokio::test]
    async fn anonymous_refusals_are_recorded_once_then_summed_up_when_their_window_ends() {
        let (audit, mut queues) = paused_log().await;
        let refused = |client: &str| Event {
            action: "sign_in",
            outcome: "refused",
            client: Some(client.to_string()),
            ..Event::default()
        };
        for _ in 0..5 {
            audit.record(refused("192.0.2.1"));
        }
        audit.record(refused("192.0.2.2"));
        let first = drain(&mut queues.anonymous);
        assert_eq!(first.len(), 2, "the first of each address at once: {first:?}");
        assert!(
            queues.signed_in.try_recv().is_err(),
            "nobody signed in: not the signed-in queue"
        );

        advance(ANONYMOUS_EVERY - Duration::from_millis(1)).await;
        audit.sum_up_windows(false);
        assert!(drain(&mut queues.anonymous).is_empty(), "the window is not over yet");

        advance(Duration::from_millis(1)).await;
        audit.sum_up_windows(false);
        let sums = drain(&mut queues.anonymous);
        assert_eq!(sums.len(), 1, "one summary, for the address that repeated: {sums:?}");
        let detail: serde_json::Value = serde_json::from_str(sums[0].detail.as_deref().expect("detail")).expect("json");
        assert_eq!(detail["repeated"], 4);
        assert_eq!(detail["windowSecs"], ANONYMOUS_EVERY.as_secs());
        assert_eq!(sums[0].client_addr.as_deref(), Some("192.0.2.1"));

        audit.record(refused("192.0.2.1"));
        assert_eq!(
            drain(&mut queues.anonymous).len(),
            1,
            "a new window records its first at once"
        );
    }
}
