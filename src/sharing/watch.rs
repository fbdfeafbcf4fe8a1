//! Closes the clients a share let in once it no longer does: at its expiry (checked every
//! [`Cadence::tick`] against the clock), when it is revoked on this replica (at once), or on another
//! replica, or its session is deleted (checked against the store every [`Cadence::recheck`], every watched
//! teammate in one statement per 200). And forgets ended shares every [`Cadence::purge`] (an ended share
//! lets nobody in; without this its row stays until its session's next share).

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{CLOSE_SHARE_ENDED, Shares, Watched};
use crate::infra::auditing::{Event, Recorder};
use crate::session::Sessions;

/// How often the watcher looks: the intervals it keeps, apart from what it does when it looks.
#[derive(Debug, Clone, Copy)]
pub struct Cadence {
    /// How often expiries are checked.
    pub tick: Duration,
    /// How often every watched share is checked in the store (a revocation on another replica).
    pub recheck: Duration,
    /// How often ended shares are purged (and once at start).
    pub purge: Duration,
}

impl Default for Cadence {
    fn default() -> Self {
        Self {
            tick: Duration::from_secs(1),
            recheck: Duration::from_secs(2),
            purge: Duration::from_secs(3600),
        }
    }
}

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
    /// How often it looks.
    pub cadence: Cadence,
}

impl ShareWatch {
    /// Runs until shutdown.
    pub async fn run(self) {
        self.tracker.spawn(self.clone().purge());
        let mut schedule = Schedule::new(self.cadence);
        while let Some(recheck) = schedule
            .next(&self.shares.revoked, &self.shutdown, || self.shares.any_expired())
            .await
        {
            let lost = self.shares.lost(recheck).await;
            if !lost.is_empty() {
                self.end(&lost);
            }
        }
    }

    /// Purges ended shares every [`Cadence::purge`] until shutdown (each replica: deleting twice
    /// is harmless).
    async fn purge(self) {
        let mut tick = tokio::time::interval(self.cadence.purge);
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

/// When the watcher looks, and whether it asks the store then: the timing of [`ShareWatch::run`]
/// apart from what it does, so that it is tested with paused time.
#[derive(Debug)]
struct Schedule {
    /// Every [`Cadence::tick`], a tick late never made up twice.
    tick: tokio::time::Interval,
    /// How often the store is asked whatever happens.
    recheck: Duration,
    /// When the store was last asked.
    last_recheck: tokio::time::Instant,
}

impl Schedule {
    fn new(cadence: Cadence) -> Self {
        let mut tick = tokio::time::interval(cadence.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self {
            tick,
            recheck: cadence.recheck,
            last_recheck: tokio::time::Instant::now(),
        }
    }

    /// Waits for the next look (a tick, or a revocation on this replica) and says whether the
    /// store is asked: at a revocation, every [`Cadence::recheck`], and when `expired` says a
    /// watched share has expired (another share may still let its client in). `None` at shutdown.
    async fn next(
        &mut self,
        revoked: &tokio::sync::Notify,
        shutdown: &CancellationToken,
        expired: impl FnOnce() -> bool,
    ) -> Option<bool> {
        let revoked_here = tokio::select! {
            biased;
            () = shutdown.cancelled() => return None,
            () = revoked.notified() => true,
            _ = self.tick.tick() => false,
        };
        let recheck = revoked_here || self.last_recheck.elapsed() >= self.recheck || expired();
        if recheck {
            self.last_recheck = tokio::time::Instant::now();
        }
        Some(recheck)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::Notify;
    use tokio::time::Instant;

    /// Each look as (milliseconds since start, whether the store is asked).
    async fn looks(
        schedule: &mut Schedule,
        revoked: &Notify,
        shutdown: &CancellationToken,
        n: usize,
    ) -> Vec<(u128, bool)> {
        let start = Instant::now();
        let mut out = Vec::new();
        for _ in 0..n {
            let recheck = schedule.next(revoked, shutdown, || false).await.expect("not shut down");
            out.push((start.elapsed().as_millis(), recheck));
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn ticks_and_asks_the_store_every_recheck() {
        let (revoked, shutdown) = (Notify::new(), CancellationToken::new());
        let mut schedule = Schedule::new(Cadence::default());
        assert_eq!(
            looks(&mut schedule, &revoked, &shutdown, 6).await,
            [
                (0, false),
                (1000, false),
                (2000, true),
                (3000, false),
                (4000, true),
                (5000, false)
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_revocation_is_looked_at_at_once_and_restarts_the_recheck() {
        let (revoked, shutdown) = (Notify::new(), CancellationToken::new());
        let mut schedule = Schedule::new(Cadence::default());
        assert_eq!(looks(&mut schedule, &revoked, &shutdown, 1).await, [(0, false)]);
        tokio::time::advance(Duration::from_millis(1500)).await;
        revoked.notify_one();
        let start = Instant::now();
        assert_eq!(schedule.next(&revoked, &shutdown, || false).await, Some(true));
        assert_eq!(start.elapsed(), Duration::ZERO, "a revocation waits for no tick");
        // The tick due at 1 s comes at once, then the ticks keep their pace from there; the store
        // is asked again 2 s after the revocation, not 2 s after the last time before it.
        assert_eq!(
            looks(&mut schedule, &revoked, &shutdown, 4).await,
            [(0, false), (1000, false), (2000, true), (3000, false)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_expiry_asks_the_store_and_shutdown_ends_it() {
        let (revoked, shutdown) = (Notify::new(), CancellationToken::new());
        let mut schedule = Schedule::new(Cadence {
            tick: Duration::from_millis(100),
            recheck: Duration::from_secs(60),
            purge: Duration::from_secs(60),
        });
        assert_eq!(schedule.next(&revoked, &shutdown, || false).await, Some(false));
        let start = Instant::now();
        assert_eq!(schedule.next(&revoked, &shutdown, || true).await, Some(true));
        assert_eq!(start.elapsed(), Duration::from_millis(100));
        shutdown.cancel();
        assert_eq!(schedule.next(&revoked, &shutdown, || false).await, None);
    }
}
