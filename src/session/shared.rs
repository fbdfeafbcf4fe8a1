//! Sessions shared with other replicas through Postgres (see [`crate::replica`]): who serves a
//! session, and what this replica does with the bus's notices.

use std::sync::Arc;

use super::{LiveSession, Sessions};
use crate::protocol::RpcError;
use crate::replica::Replica;
use crate::replica::lease::Holder;

impl Sessions {
    /// This replica's leases and bus, when several share the database.
    pub fn replica(&self) -> Option<&Arc<Replica>> {
        self.options.replica.as_ref()
    }

    /// The replica that serves `session` when it is not this one: `None` means this replica
    /// holds its lease (taking it if it was free, expired, or its holder is gone; then the
    /// session first takes in whatever the previous holder committed).
    pub async fn serving_elsewhere(&self, session: &LiveSession) -> Result<Option<String>, RpcError> {
        let Some(replica) = self.replica() else {
            return Ok(None);
        };
        let held_before = replica.holds(&session.id);
        match replica.acquire(&session.id).await? {
            Holder::Me => {
                if !held_before {
                    session.take_over(&**self.store()).await;
                    tracing::info!(session = %session.id, replica = %replica.id, "took the session's lease");
                }
                Ok(None)
            }
            Holder::Other(holder) => Ok(Some(holder)),
        }
    }

    /// Takes the lease of a session this replica has just created.
    pub async fn lease_new(&self, session: &LiveSession) -> Result<(), RpcError> {
        match self.serving_elsewhere(session).await? {
            None => Ok(()),
            Some(_) => Err(RpcError::internal("a new session is served by another replica")),
        }
    }

    /// Bus: another replica committed `session`'s updates up to `seq`.
    pub fn committed_elsewhere(&self, session: &str, seq: u64) {
        let Some(s) = self.registry.get(session) else { return };
        if self.replica().is_some_and(|r| r.holds(session)) {
            return;
        }
        if s.committed_elsewhere(seq) {
            self.spawn_catch_up(s);
        }
    }

    /// Bus: notices may have been missed; every session in memory that another replica serves
    /// reads what it has not handed out yet.
    pub fn resync(&self) {
        for s in self.registry.all() {
            if !self.replica().is_some_and(|r| r.holds(&s.id)) {
                self.spawn_catch_up(s);
            }
        }
    }

    /// Reads and hands out what another replica committed of `session`.
    pub fn spawn_catch_up(&self, session: Arc<LiveSession>) {
        let store = self.store().clone();
        tokio::spawn(async move { session.catch_up(&*store).await });
    }

    /// Whether this replica serves `session` on an agent process right now.
    pub fn serving(&self, session: &str) -> bool {
        self.registry.get(session).is_some_and(|s| s.is_bound_now())
    }

    /// Another replica took `session`'s lease.
    pub fn lease_lost(&self, session: &str) {
        if let Some(s) = self.registry.get(session) {
            s.leave();
        }
    }
}
