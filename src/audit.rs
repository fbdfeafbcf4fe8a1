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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::store::{AuditEntry, Store, now_micros};

/// Entries queued for the store, at most.
const QUEUE: usize = 4096;
/// Entries written per batch, at most.
const BATCH: usize = 256;
/// A cap refusal of one user is recorded once per this.
const CAP_EVERY: Duration = Duration::from_secs(60);

/// What happened.
#[derive(Debug, Default)]
pub struct Event<'a> {
    /// Who acted (`""` when nobody was signed in).
    pub actor: &'a str,
    /// What they did.
    pub action: &'static str,
    /// What it was done to.
    pub target: Option<&'a str>,
    /// `ok`, `refused` or `failed`.
    pub outcome: &'static str,
    /// More (never a secret).
    pub detail: Option<serde_json::Value>,
    /// The WebSocket connection.
    pub connection: Option<&'a str>,
    /// The client's address.
    pub client: Option<String>,
}

/// The audit log's front door.
#[derive(Debug)]
pub struct Audit {
    tx: mpsc::Sender<AuditEntry>,
    replica: String,
    caps: Mutex<HashMap<(String, &'static str), Instant>>,
}

impl Audit {
    /// The log, and its writer task, which flushes what is queued when `stop` fires (after the
    /// connections have ended: await it then).
    pub fn spawn(
        store: Arc<dyn Store>,
        replica: String,
        retention_days: u64,
        stop: CancellationToken,
    ) -> (Arc<Self>, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let task = tokio::spawn(write(store, rx, retention_days, stop));
        let audit = Arc::new(Self {
            tx,
            replica,
            caps: Mutex::default(),
        });
        (audit, task)
    }

    /// Records `e`: a log line now, a row soon.
    pub fn record(&self, e: Event<'_>) {
        let detail = e.detail.map(|d| d.to_string());
        tracing::info!(
            target: "audit",
            actor = %e.actor, action = e.action, target_id = ?e.target, outcome = e.outcome,
            detail = ?detail, connection = ?e.connection, client = ?e.client, replica = %self.replica,
            "audit"
        );
        let entry = AuditEntry {
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
        };
        if self.tx.try_send(entry).is_err() {
            metrics::counter!(crate::metrics::AUDIT_DROPPED).increment(1);
        }
    }

    /// Records that `user` was refused at `cap` (at most once per user, cap and minute).
    pub fn cap_refused(&self, user: &str, cap: &'static str, connection: Option<&str>) {
        {
            let mut seen = self.caps.lock().unwrap_or_else(|e| e.into_inner());
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
            ..Event::default()
        });
    }
}

/// Appends queued entries in batches until `stop`, then what is left; prunes hourly.
async fn write(
    store: Arc<dyn Store>,
    mut rx: mpsc::Receiver<AuditEntry>,
    retention_days: u64,
    stop: CancellationToken,
) {
    let mut prune = tokio::time::interval(Duration::from_secs(3600));
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        tokio::select! {
            n = rx.recv_many(&mut batch, BATCH) => {
                if n == 0 {
                    return;
                }
                flush(&*store, &mut batch).await;
            }
            _ = prune.tick() => {
                if retention_days > 0 {
                    let before = now_micros() - (retention_days as i64) * 86_400_000_000;
                    if let Err(e) = store.prune_audit(before).await {
                        tracing::warn!(error = %e, "cannot prune the audit log");
                    }
                }
            }
            () = stop.cancelled() => {
                while let Ok(entry) = rx.try_recv() {
                    batch.push(entry);
                }
                flush(&*store, &mut batch).await;
                return;
            }
        }
    }
}

async fn flush(store: &dyn Store, batch: &mut Vec<AuditEntry>) {
    if let Err(e) = store.append_audit(batch).await {
        tracing::error!(error = %e, entries = batch.len(), "cannot write audit entries (they are in the log above)");
        metrics::counter!(crate::metrics::AUDIT_DROPPED).increment(batch.len() as u64);
    }
    batch.clear();
}
