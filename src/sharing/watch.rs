//! Closes the clients a share let in once it no longer does: at its expiry (checked every
//! second against the clock), when it is revoked on this replica (at once), or on another
//! replica, or its session is deleted (checked against the store every [`RECHECK`], every watched
//! teammate in one statement per 200). And forgets ended shares every [`PURGE`] (an ended share
//! lets nobody in; without this its row stays until its session's next share).

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{CLOSE_SHARE_ENDED, Shares, Watched};
use crate::infra::auditing::{Event, Recorder};
use crate::session::Sessions;

/// How often expiries are checked.
const TICK: Duration = Duration::from_secs(1);
/// How often every watched share is checked in the store (a revocation on another replica).
const RECHECK: Duration = Duration::from_secs(2);
/// How often ended shares are purged (and once at start).
const PURGE: Duration = Duration::from_secs(3600);

/// What the watcher works with.
#[derive(Debug, Clone)]
pub struct ShareWatch {
    /// The live sessions a lost client is detached from.
    pub sessions: Arc<Sessions>,
    /// The shares watched.
    pub shares: Arc<Shares>,
    /// Each ended share is recorded.
    pub audit: Arc<dyn Recorder>,
    /// Ends the watch.
    pub shutdown: CancellationToken,
    /// Tracks the purge task.
    pub tracker: TaskTracker,
}

impl ShareWatch {
    /// Runs until shutdown.
    pub async fn run(self) {
        self.tracker.spawn(self.clone().purge());
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_recheck = tokio::time::Instant::now();
        loop {
            let revoked_here = tokio::select! {
                () = self.shutdown.cancelled() => return,
                _ = tick.tick() => false,
                () = self.shares.revoked.notified() => true,
            };
            // An expiry is checked in the store too: another share may still let the client in.
            let recheck = revoked_here || last_recheck.elapsed() >= RECHECK || self.shares.any_expired();
            if recheck {
                last_recheck = tokio::time::Instant::now();
            }
            let lost = self.shares.lost(recheck).await;
            if !lost.is_empty() {
                self.end(&lost);
            }
        }
    }

    /// Purges ended shares every [`PURGE`] until shutdown (each replica: deleting twice is harmless).
    async fn purge(self) {
        let mut tick = tokio::time::interval(PURGE);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let purged = self.shares.purge_expired().await;
            if purged > 0 {
                tracing::info!(shares = purged, "ended shares purged");
            }
        }
    }

    /// Detaches and closes each client whose share ended.
    fn end(&self, lost: &[Watched]) {
        for w in lost {
            let Some(client) = w.client.upgrade() else { continue };
            if let Some(session) = self.sessions.any_live(&w.session) {
                session.detach(&client);
                // What they queued is not sent on the owner's behalf now (nor would it be: the
                // sender checks their share again), and the owner's tabs see it go.
                let forgot = session.queue().forget_by(&client.user);
                if forgot {
                    session.tell_queue();
                }
            }
            let expired = w.expires_at.is_some_and(|e| e <= crate::store::now_micros());
            client.outbox.close(
                CLOSE_SHARE_ENDED,
                if expired {
                    "your share of this session has expired"
                } else {
                    "your share of this session was revoked"
                },
            );
            tracing::info!(user = %client.user, session = %w.session, share = %w.share, expired, "share ended; client closed");
            self.audit.record(Event {
                actor: &client.user,
                action: "share_ended",
                target: Some(&w.session),
                outcome: "ok",
                detail: Some(json!({ "share": w.share, "reason": if expired { "expired" } else { "revoked" } })),
                connection: Some(&client.id),
                client: client.addr(),
            });
        }
        self.shares.forget(lost);
    }
}
