//! Sessions shared with other replicas through Postgres (see [`crate::replica`]): who serves a
//! session, and what this replica does with the bus's notices.

use std::sync::Arc;

use super::asks::Asks;
use super::requests::AgentRequest;
use super::{LiveSession, Sessions};
use crate::protocol::RpcError;
use crate::replica::lease::Holder;
use crate::replica::{Message, Replica};

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

    /// Agent requests asked across replicas, when several share the database.
    pub fn asks(&self) -> Option<&Arc<Asks>> {
        self.options.asks.as_ref()
    }

    /// A client of this replica attached to `session`: other replicas may now ask it their
    /// agents' requests. The first time, the row is written and the serving replica (if
    /// another) is told, so it asks what its agent already waits on.
    pub async fn watched(&self, session: &LiveSession) {
        let Some(replica) = self.replica() else { return };
        match replica.watch(&session.id).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::warn!(session = %session.id, error = %e, "cannot note that this replica watches the session");
                return;
            }
        }
        let Ok(Some(holder)) = replica.holder(&session.id).await else {
            return;
        };
        if holder == *replica.id {
            return;
        }
        let message = Message::Watching {
            from: replica.id.to_string(),
            session: session.id.to_string(),
        };
        if let Err(e) = replica.send(&holder, &message).await {
            tracing::warn!(session = %session.id, error = %e, "cannot tell the serving replica about a new watcher");
        }
    }

    /// Bus: replica `from`'s agent asks `session`'s clients something (its number `key`):
    /// asked of the clients here once the updates it followed are handed out, or kept until
    /// one attaches. A session no longer in memory here has no clients here: this replica
    /// stops watching it.
    pub fn ask_from_replica(&self, from: &str, key: u64, session: &str, method: &str, params: String, after_seq: u64) {
        let (Some(asks), Some(replica)) = (self.asks(), self.replica()) else {
            return;
        };
        let Some(s) = self.registry.get(session) else {
            let replica = replica.clone();
            let session = session.to_string();
            tokio::spawn(async move {
                if let Err(e) = replica.unwatch(&session).await {
                    tracing::warn!(session, error = %e, "cannot stop watching a session");
                }
            });
            return;
        };
        let request = AgentRequest::from_replica(
            &s,
            asks.clone(),
            Arc::from(from),
            key,
            method,
            params,
            self.options.permission_wait,
        );
        asks.adopt(Arc::from(from), key, &request);
        s.ask_after(after_seq, request);
        if s.released() < after_seq {
            self.spawn_catch_up(s);
        }
    }

    /// Another replica took `session`'s lease.
    pub fn lease_lost(&self, session: &str) {
        if let Some(s) = self.registry.get(session) {
            s.leave();
        }
    }
}
