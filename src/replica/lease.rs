//! Session leases in `session_leases`: who serves a session live, until when.

use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::{Handler, LOCK_CLASS, Replica};
use crate::store::StoreError;

/// Renewals between two sweeps of dead replicas' rows (about three lease times).
const SWEEP_EVERY: u32 = 10;
/// A replica message older than this is dropped whoever it is for (replicas read theirs at once).
const MESSAGE_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(600);

pub use crate::session::Holder;

/// A lease this process holds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Held {
    /// When it was taken (a lease unused for a lease time is given up).
    taken: Instant,
    /// When the statement that last took or renewed it was sent: the lease is surely this
    /// process's only until a lease time after that. A replica cut off from the database longer
    /// than that may have lost it meanwhile, to a replica that served the session and gave it
    /// back; taken again, it must first read what that one wrote.
    confirmed: Instant,
}

impl Replica {
    /// Takes `session`'s lease if it is free, expired, this replica's, or its holder is gone from
    /// the database (no connection holds its advisory lock: the process died).
    pub async fn acquire(&self, session: &str) -> Result<Holder, StoreError> {
        self.take(session, true).await
    }

    /// [`Self::acquire`] for a session this replica has just created: nobody knows its id yet,
    /// so no other replica can start following it while the lease is taken.
    pub async fn acquire_new(&self, session: &str) -> Result<Holder, StoreError> {
        self.take(session, false).await
    }

    /// [`Self::acquire`]; `followed_meanwhile`: whether another replica may start following the
    /// session while the lease is taken.
    async fn take(&self, session: &str, followed_meanwhile: bool) -> Result<Holder, StoreError> {
        let sent = Instant::now();
        // A lease announces the session's commits when another replica follows it (taking it
        // over keeps a lease's `announce`: a follower's `UPDATE` and this one's serialize on the
        // row). A fresh row is the one case a follower can miss: its `UPDATE` finds no row yet,
        // and this statement may have read the followers before the follower's row committed.
        let taken: Option<(String, bool)> = sqlx::query_as(
            "INSERT INTO session_leases AS l (session_id, replica, expires_at, announce)
             VALUES ($1, $2, now() + make_interval(secs => $3),
                     EXISTS (SELECT 1 FROM session_followers f WHERE f.session_id = $1 AND f.replica <> $2))
             ON CONFLICT (session_id) DO UPDATE SET replica = EXCLUDED.replica, expires_at = EXCLUDED.expires_at,
                                                    announce = l.announce OR EXCLUDED.announce
             WHERE l.replica = EXCLUDED.replica OR l.expires_at < now()
                OR NOT EXISTS (SELECT 1 FROM pg_locks k WHERE k.locktype = 'advisory' AND k.granted
                               AND k.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                               AND k.classid = $4::oid AND k.objid = hashtext(l.replica)::oid AND k.objsubid = 2)
             RETURNING replica, announce",
        )
        .bind(session)
        .bind(&*self.id)
        .bind(self.ttl.as_secs_f64())
        .bind(LOCK_CLASS)
        .fetch_optional(&self.pool)
        .await?;
        if let Some((_, announce)) = taken {
            if followed_meanwhile && !announce {
                // Read again after the lease committed: a follower whose row this one did not
                // see sets `announce` itself (its `UPDATE` comes after its row, and so after
                // this read or else sees the lease).
                sqlx::query(
                    "UPDATE session_leases SET announce = true
                     WHERE session_id = $1 AND replica = $2 AND NOT announce
                       AND EXISTS (SELECT 1 FROM session_followers f WHERE f.session_id = $1 AND f.replica <> $2)",
                )
                .bind(session)
                .bind(&*self.id)
                .execute(&self.pool)
                .await?;
            }
            let mut held = self.held.lock();
            let lease = held.entry(Arc::from(session)).or_insert(Held {
                taken: sent,
                confirmed: sent,
            });
            lease.confirmed = sent;
            return Ok(Holder::Me);
        }
        let holder: Option<String> = sqlx::query_scalar("SELECT replica FROM session_leases WHERE session_id = $1")
            .bind(session)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match holder {
            Some(h) if *h != *self.id => Holder::Other(h),
            // Released meanwhile (or ours): try again.
            _ => Box::pin(self.take(session, followed_meanwhile)).await?,
        })
    }

    /// Who serves `session` now, if anyone (a replica within its lease).
    pub async fn holder(&self, session: &str) -> Result<Option<String>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT replica FROM session_leases WHERE session_id = $1 AND (expires_at > now() OR replica = $2)",
        )
        .bind(session)
        .bind(&*self.id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Whether `replica` is connected to the database (holds its advisory lock). `pg_locks` shows
    /// the whole server's locks: only this database's count (other databases may have replicas of
    /// the same names).
    pub async fn is_alive(&self, replica: &str) -> Result<bool, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted
                            AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
                            AND classid = $1::oid AND objid = hashtext($2)::oid AND objsubid = 2)",
        )
        .bind(LOCK_CLASS)
        .bind(replica)
        .fetch_one(&self.pool)
        .await?)
    }

    /// Whether this process holds `session`'s lease, confirmed by the database less than a lease
    /// time ago (one not confirmed since may have been someone else's meanwhile).
    pub fn holds(&self, session: &str) -> bool {
        self.held
            .lock()
            .get(session)
            .is_some_and(|h| h.confirmed.elapsed() < self.ttl)
    }

    /// Gives up `session`'s lease.
    pub async fn release(&self, session: &str) -> Result<(), StoreError> {
        self.held.lock().remove(session);
        sqlx::query("DELETE FROM session_leases WHERE session_id = $1 AND replica = $2")
            .bind(session)
            .bind(&*self.id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Gives up every lease (shutdown: the others may take them at once).
    pub async fn release_all(&self) -> Result<(), StoreError> {
        self.held.lock().clear();
        sqlx::query("DELETE FROM session_leases WHERE replica = $1")
            .bind(&*self.id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Renews the leases of sessions still served, in one statement, and gives up the others
    /// (taken more than a lease time ago and no longer on an agent process). A lease another
    /// replica has taken is reported lost.
    async fn renew(&self, handler: &dyn Handler) -> Result<(), StoreError> {
        let (keep, drop): (Vec<Arc<str>>, Vec<Arc<str>>) = {
            let held = self.held.lock();
            held.iter()
                .map(|(s, h)| (s.clone(), h.taken.elapsed() < self.ttl || handler.serving(s)))
                .fold((Vec::new(), Vec::new()), |(mut k, mut d), (s, serving)| {
                    if serving {
                        k.push(s)
                    } else {
                        d.push(s)
                    }
                    (k, d)
                })
        };
        for s in &drop {
            self.release(s).await?;
        }
        if keep.is_empty() {
            return Ok(());
        }
        let ids: Vec<&str> = keep.iter().map(|s| &**s).collect();
        let sent = Instant::now();
        let renewed: Vec<String> = sqlx::query_scalar(
            "UPDATE session_leases SET expires_at = now() + make_interval(secs => $3)
             WHERE replica = $1 AND session_id = ANY($2) RETURNING session_id",
        )
        .bind(&*self.id)
        .bind(&ids)
        .bind(self.ttl.as_secs_f64())
        .fetch_all(&self.pool)
        .await?;
        {
            let mut held = self.held.lock();
            for s in &renewed {
                if let Some(h) = held.get_mut(s.as_str()) {
                    h.confirmed = sent;
                }
            }
        }
        for s in keep.iter().filter(|s| !renewed.iter().any(|r| **r == ***s)) {
            tracing::warn!(session = %s, "another replica took this session's lease; it is no longer served here");
            self.held.lock().remove(&**s);
            handler.lease_lost(s);
        }
        Ok(())
    }

    /// Renews leases every third of the lease time until `stop`; then gives them all up. Every
    /// [`SWEEP_EVERY`] renewals it also removes what dead replicas left behind
    /// ([`Replica::sweep_dead`]).
    pub async fn run_renewals(self: Arc<Self>, handler: Arc<dyn Handler>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.ttl / 3);
        let mut ticks: u32 = 0;
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if let Err(e) = self.renew(&*handler).await {
                        tracing::warn!(error = %e, "cannot renew session leases");
                    }
                    ticks = ticks.wrapping_add(1);
                    if ticks.is_multiple_of(SWEEP_EVERY) {
                        match self.sweep_dead(MESSAGE_MAX_AGE).await {
                            Ok(0) => {}
                            Ok(n) => tracing::info!(rows = n, "removed replica messages and watchers nobody will read"),
                            Err(e) => tracing::warn!(error = %e, "cannot sweep replica messages"),
                        }
                    }
                }
                () = stop.cancelled() => break,
            }
        }
    }
}
