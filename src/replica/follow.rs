//! Which replicas have clients of a session (`session_followers`), so that the replica serving
//! it announces its commits (`NOTIFY acp_session_committed`) only when another one listens.
//!
//! A NOTIFY is not free: Postgres takes a database-wide lock to queue it at commit and wakes
//! every listening replica, ~70 µs of each prompt's round trip on a gateway nobody else follows.
//! So a lease says whether to announce (`session_leases.announce`), and a replica whose client
//! attaches to a session it does not serve:
//! 1. writes its row in `session_followers` (committed before step 2 reads anything);
//! 2. sets `announce` on the lease. That `UPDATE` waits for the holder's writes in flight (each
//!    holds the lease row `FOR SHARE` until it commits), and a write that waited for it reads
//!    the row again and announces;
//! 3. reads the store once (`Sessions::followed` in the session layer): every commit not
//!    announced to it committed before step 2, so that read has it.
//!
//! A replica taking the lease sets `announce` from the other replicas' rows, and reads them
//! again once the lease has committed when someone could have started following meanwhile (see
//! [`Replica::acquire`]): a follower whose row it did not see finds the lease in step 2.
//! A replica that hears of a commit of a session it noted as followed but no longer has in
//! memory (its clients left) stops following it ([`Replica::unfollow`]): it deletes its row and,
//! holding the lease row `FOR UPDATE` (so the holder's writes in flight finish first, and a
//! follower's step 2 waits or is seen), clears `announce` unless another replica's row remains;
//! a statement begun after the lock sees every follower whose step 2 came first. Starting and
//! stopping to follow are serialized in a process, so a client attaching meanwhile follows
//! again afterwards. Rows also go with their session, or with their replica once it is gone
//! from the database ([`Replica::sweep_dead`]).

use super::Replica;
use crate::store::StoreError;

pub use crate::session::{Followed, Served};

impl Replica {
    /// A client of this replica attached to `session` (`controls`: one that may answer its
    /// agent's requests). The first time for this process (and the first time a controller
    /// comes), its rows are written and the serving replica is asked to announce commits;
    /// `None` when there was nothing new to note.
    pub async fn follow(&self, session: &str, controls: bool) -> Result<Option<Followed>, StoreError> {
        let _follows = self.follows.lock().await;
        let new_follower = self.following.note(session);
        let new_watcher = controls && self.watching.note(session);
        if !new_follower && !new_watcher {
            return Ok(None);
        }
        let forget = || {
            if new_follower {
                self.following.forget(session);
            }
            if new_watcher {
                self.watching.forget(session);
            }
        };
        let written = sqlx::query(
            "WITH f AS (
                 INSERT INTO session_followers (session_id, replica) VALUES ($1, $2)
                 ON CONFLICT (session_id, replica) DO UPDATE SET since = now()
             )
             INSERT INTO session_watchers (session_id, replica) SELECT $1, $2 WHERE $3
             ON CONFLICT (session_id, replica) DO UPDATE SET since = now()",
        )
        .bind(session)
        .bind(&*self.id)
        .bind(new_watcher)
        .execute(&self.pool)
        .await;
        if let Err(e) = written {
            forget();
            return Err(e.into());
        }
        // The session this replica serves announces nothing to itself (if it loses the lease,
        // [`Self::announce`] runs then).
        let served_by = if self.holds(session) {
            None
        } else {
            match self.announce(session).await {
                Ok(served) => served,
                Err(e) => {
                    forget();
                    return Err(e);
                }
            }
        };
        Ok(Some(Followed { served_by, new_watcher }))
    }

    /// Asks the replica serving `session` (if another) to announce its commits, once every
    /// commit before is in the store: the serving replica, if another.
    pub async fn announce(&self, session: &str) -> Result<Option<Served>, StoreError> {
        let served: Option<(String, bool)> = sqlx::query_as(
            "UPDATE session_leases SET announce = true WHERE session_id = $1 AND replica <> $2
             RETURNING replica, expires_at > now()",
        )
        .bind(session)
        .bind(&*self.id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(served.map(|(replica, current)| Served { replica, current }))
    }

    /// Whether this process has noted `session` as followed.
    pub fn follows(&self, session: &str) -> bool {
        self.following.contains(session)
    }

    /// This process stops following `session`, if it noted it as followed and `unattended()`
    /// still says none of its clients has the session (checked once no follow is under way):
    /// its row goes and the lease stops announcing unless another replica follows. Whether it
    /// stopped.
    pub async fn unfollow(&self, session: &str, unattended: impl FnOnce() -> bool) -> Result<bool, StoreError> {
        let _follows = self.follows.lock().await;
        if !self.following.contains(session) || !unattended() {
            return Ok(false);
        }
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM session_followers WHERE session_id = $1 AND replica = $2")
            .bind(session)
            .bind(&*self.id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("SELECT 1 FROM session_leases WHERE session_id = $1 FOR UPDATE")
            .bind(session)
            .execute(&mut *tx)
            .await?;
        // A statement of its own: its snapshot is taken once the lock is held.
        sqlx::query(
            "UPDATE session_leases l SET announce = EXISTS (
                 SELECT 1 FROM session_followers f WHERE f.session_id = l.session_id AND f.replica <> l.replica)
             WHERE l.session_id = $1 AND l.announce",
        )
        .bind(session)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        self.following.forget(session);
        Ok(true)
    }

    /// Forgets that this process noted `session` as followed, so the next [`Self::follow`]
    /// writes its row again (after a lost listening connection, when another replica may have
    /// swept it). The other sessions stay noted: a row still there is then deleted by
    /// [`Self::unfollow`], and one swept makes that a no-op.
    pub fn forget_following(&self, session: &str) {
        self.following.forget(session);
    }
}
