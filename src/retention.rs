//! Retention: sessions not updated for `[retention] days` are deleted with their transcripts, in
//! the background, a bounded batch per transaction with a pause between batches, so that traffic
//! never queues long behind it. Each replica runs it; deleting twice is harmless. A session in
//! this replica's memory, or (Postgres) held by a live replica's lease, is left for a later pass.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::infra::auditing::{Event, Recorder};
use crate::infra::config::RetentionConfig;
use crate::session::Sessions;
use crate::store::{StaleSession, in_time, now_micros};

/// Between two batches of one pass.
const BATCH_PAUSE: Duration = Duration::from_millis(50);

/// Most transcript one batch deletes (a bigger session is deleted alone): a SQLite transaction
/// holds the database's one writer while it runs.
const MAX_BATCH_BYTES: i64 = 64 << 20;

const DAY_MICROS: i64 = 24 * 3600 * 1_000_000;

/// What retention works with.
#[derive(Debug)]
pub struct Retention {
    /// `[retention]`.
    pub config: RetentionConfig,
    /// The sessions it deletes (those in memory are stepped over).
    pub sessions: Arc<Sessions>,
    /// Each deleted session is recorded.
    pub audit: Arc<dyn Recorder>,
    /// Ends the passes.
    pub shutdown: CancellationToken,
}

impl Retention {
    /// Runs passes every `[retention] interval_secs` (the first at once) until shutdown.
    pub async fn run(self) {
        let config = self.config.clone();
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
                () = self.shutdown.cancelled() => return,
            }
            let before = now_micros().saturating_sub(i64::from(config.days).saturating_mul(DAY_MICROS));
            let deleted = self.pass(before, i64::from(config.batch_size)).await;
            if deleted > 0 {
                tracing::info!(sessions = deleted, "retention: stale sessions deleted");
            }
        }
    }

    /// Deletes the sessions last updated before `before`, oldest first, at most `batch` sessions
    /// and [`MAX_BATCH_BYTES`] of transcript (or one session) per transaction; how many it deleted.
    /// Sessions in use are stepped over (a later pass takes them). Stops at shutdown, or on a store
    /// failure (logged; the next pass tries again).
    pub async fn pass(&self, before: i64, batch: i64) -> u64 {
        let store = self.sessions.store();
        let mut total = 0;
        let mut after: Option<(i64, String)> = None;
        loop {
            let cursor = after.as_ref().map(|(t, id)| (*t, id.as_str()));
            let stale = match in_time(store.stale_sessions(before, cursor, batch)).await {
                Ok(stale) => stale,
                Err(e) => {
                    tracing::error!(error = %e, "retention: cannot look for stale sessions");
                    return total;
                }
            };
            let Some(last) = stale.last() else {
                return total;
            };
            after = Some((last.updated_at, last.id.clone()));
            let found = stale.len() as i64;
            for group in byte_bounded(stale) {
                // Checked again just before: a session opened meanwhile stays.
                let idle: Vec<StaleSession> = group
                    .into_iter()
                    .filter(|s| self.sessions.any_live(&s.id).is_none())
                    .collect();
                if idle.is_empty() {
                    continue;
                }
                match in_time(store.delete_stale(&idle, before)).await {
                    Ok(deleted) => total += self.deleted_batch(&deleted),
                    Err(e) => {
                        tracing::error!(error = %e, "retention: cannot delete stale sessions");
                        return total;
                    }
                }
                tokio::select! {
                    () = tokio::time::sleep(BATCH_PAUSE) => {}
                    () = self.shutdown.cancelled() => return total,
                }
            }
            if found < batch {
                return total;
            }
        }
    }

    /// Counts, audits and forgets what one transaction deleted; how many.
    fn deleted_batch(&self, deleted: &[StaleSession]) -> u64 {
        metrics::counter!(crate::infra::metrics::RETENTION_BATCHES).increment(1);
        metrics::counter!(crate::infra::metrics::RETENTION_SESSIONS).increment(deleted.len() as u64);
        let bytes: i64 = deleted.iter().map(|s| s.stored_bytes).sum();
        metrics::counter!(crate::infra::metrics::RETENTION_BYTES).increment(u64::try_from(bytes).unwrap_or(0));
        for s in deleted {
            self.sessions.forget_stored(&s.owner, &s.id);
            self.audit.record(Event {
                actor: "(retention)",
                action: "session_expire",
                target: Some(&s.id),
                outcome: "ok",
                detail: Some(serde_json::json!({ "owner": s.owner, "storedBytes": s.stored_bytes })),
                connection: None,
                client: None,
            });
        }
        deleted.len() as u64
    }
}

/// `stale` in groups of at most [`MAX_BATCH_BYTES`] of transcript (a bigger session alone).
fn byte_bounded(stale: Vec<StaleSession>) -> Vec<Vec<StaleSession>> {
    let mut groups: Vec<Vec<StaleSession>> = Vec::new();
    let mut bytes = 0;
    for s in stale {
        match groups.last_mut() {
            Some(group) if bytes + s.stored_bytes <= MAX_BATCH_BYTES => {
                bytes += s.stored_bytes;
                group.push(s);
            }
            _ => {
                bytes = s.stored_bytes;
                groups.push(vec![s]);
            }
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stale(id: &str, bytes: i64) -> StaleSession {
        StaleSession {
            owner: "u".into(),
            id: id.into(),
            stored_bytes: bytes,
            updated_at: 0,
        }
    }

    #[test]
    fn batches_are_bounded_in_bytes_and_a_big_session_goes_alone() {
        let half = MAX_BATCH_BYTES / 2;
        let groups = byte_bounded(vec![
            stale("a", half),
            stale("b", half),
            stale("c", 1),
            stale("huge", 3 * MAX_BATCH_BYTES),
            stale("d", 10),
        ]);
        let ids: Vec<Vec<&str>> = groups
            .iter()
            .map(|g| g.iter().map(|s| s.id.as_str()).collect())
            .collect();
        assert_eq!(ids, [vec!["a", "b"], vec!["c"], vec!["huge"], vec!["d"]]);
    }
}
