//! Retention: sessions not updated for `[retention] days` are deleted with their transcripts, in
//! the background, a bounded batch per transaction with a pause between batches, so that traffic
//! never queues long behind it. Each replica runs it; deleting twice is harmless. A session in
//! this replica's memory, or (Postgres) held by a live replica's lease, is left for a later pass.

use std::sync::Arc;
use std::time::Duration;

use crate::gateway::Gateway;
use crate::store::{StaleSession, now_micros};

/// Between two batches of one pass.
const BATCH_PAUSE: Duration = Duration::from_millis(50);

const DAY_MICROS: i64 = 24 * 3600 * 1_000_000;

/// Runs passes every `[retention] interval_secs` (the first at once) until shutdown.
pub async fn run(gw: Arc<Gateway>) {
    let config = gw.config.retention.clone();
    if !config.enabled() {
        return;
    }
    tracing::info!(
        days = config.days,
        batch_size = config.batch_size,
        "retention: sessions not updated for {} days are deleted",
        config.days
    );
    let mut tick = tokio::time::interval(Duration::from_secs(config.interval_secs));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = gw.shutdown.cancelled() => return,
        }
        let before = now_micros() - i64::from(config.days) * DAY_MICROS;
        let deleted = pass(&gw, before, i64::from(config.batch_size)).await;
        if deleted > 0 {
            tracing::info!(sessions = deleted, "retention: stale sessions deleted");
        }
    }
}

/// Deletes the sessions last updated before `before`, `batch` at a time; how many it deleted.
/// Stops at shutdown, on a store failure (logged; the next pass tries again), or when a batch
/// deletes nothing (none left, or all of the oldest are in use).
pub async fn pass(gw: &Gateway, before: i64, batch: i64) -> u64 {
    let store = gw.sessions.store();
    let mut total = 0;
    loop {
        let stale = match store.stale_sessions(before, batch).await {
            Ok(stale) => stale,
            Err(e) => {
                tracing::error!(error = %e, "retention: cannot look for stale sessions");
                return total;
            }
        };
        let found = stale.len() as i64;
        let idle: Vec<StaleSession> = stale
            .into_iter()
            .filter(|s| gw.sessions.any_live(&s.id).is_none())
            .collect();
        if idle.is_empty() {
            return total;
        }
        let deleted = match store.delete_stale(&idle, before).await {
            Ok(deleted) => deleted,
            Err(e) => {
                tracing::error!(error = %e, "retention: cannot delete stale sessions");
                return total;
            }
        };
        metrics::counter!(crate::metrics::RETENTION_BATCHES).increment(1);
        metrics::counter!(crate::metrics::RETENTION_SESSIONS).increment(deleted.len() as u64);
        let bytes: i64 = deleted.iter().map(|s| s.stored_bytes).sum();
        metrics::counter!(crate::metrics::RETENTION_BYTES).increment(u64::try_from(bytes).unwrap_or(0));
        for s in &deleted {
            gw.sessions.forget_stored(&s.owner, &s.id);
            gw.audit.record(crate::audit::Event {
                actor: "(retention)",
                action: "session_expire",
                target: Some(&s.id),
                outcome: "ok",
                detail: Some(serde_json::json!({ "owner": s.owner, "storedBytes": s.stored_bytes })),
                connection: None,
                client: None,
            });
        }
        total += deleted.len() as u64;
        if deleted.is_empty() || found < batch {
            return total;
        }
        tokio::select! {
            () = tokio::time::sleep(BATCH_PAUSE) => {}
            () = gw.shutdown.cancelled() => return total,
        }
    }
}
