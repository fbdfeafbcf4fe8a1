//! Sessions shared with other replicas through Postgres (see [`super::replicas`]): who serves a
//! session, and what this replica does with the bus's notices.

use std::sync::Arc;

use super::asks::Asks;
use super::replicas::{Holder, Note, Replicas};
use super::requests::AgentRequest;
use super::{LiveSession, Sessions};
use crate::protocol::RpcError;

impl Sessions {
    /// This replica's leases and bus, when several share the database.
    pub fn replica(&self) -> Option<&Arc<dyn Replicas>> {
        self.context.replica.as_ref()
    }

    /// The replica that serves `session` when it is not this one: `None` means this replica
    /// holds its lease (taking it if it was free, expired, or its holder is gone; then the
    /// session first takes in whatever the previous holder committed).
    pub async fn serving_elsewhere(&self, session: &LiveSession) -> Result<Option<String>, RpcError> {
        self.take_lease(session, false).await
    }

    /// [`Self::serving_elsewhere`]; `new`: the session was created here just now.
    async fn take_lease(&self, session: &LiveSession, new: bool) -> Result<Option<String>, RpcError> {
        let Some(replica) = self.replica() else {
            return Ok(None);
        };
        let held_before = replica.holds(&session.id);
        let holder = if new {
            replica.acquire_new(&session.id).await?
        } else {
            replica.acquire(&session.id).await?
        };
        match holder {
            Holder::Me => {
                if !held_before {
                    session.take_over(&**self.store()).await;
                    tracing::info!(session = %session.id, replica = %replica.id(), "took the session's lease");
                }
                Ok(None)
            }
            Holder::Other(holder) => Ok(Some(holder)),
        }
    }

    /// Takes the lease of a session this replica has just created.
    pub async fn lease_new(&self, session: &LiveSession) -> Result<(), RpcError> {
        match self.take_lease(session, true).await? {
            None => Ok(()),
            Some(_) => Err(RpcError::internal("a new session is served by another replica")),
        }
    }

    /// Bus: another replica committed `session`'s updates up to `seq`.
    pub fn committed_elsewhere(&self, session: &str, seq: u64) {
        let Some(s) = self.registry.get(session) else {
            self.spawn_unfollow(session);
            return;
        };
        if self.replica().is_some_and(|r| r.holds(session)) {
            return;
        }
        if s.committed_elsewhere(seq) {
            self.spawn_catch_up(s);
        }
    }

    /// Bus: notices may have been missed; every session in memory that another replica serves
    /// reads what it has not handed out yet. This replica may have been gone from the database
    /// long enough for another to sweep its rows: those of the sessions with clients here are
    /// written again (and their leases asked to announce) before that read.
    pub fn resync(&self) {
        let Some(replica) = self.replica().cloned() else { return };
        for s in self.registry.all() {
            if replica.holds(&s.id) {
                continue;
            }
            let (replica, store) = (replica.clone(), self.store().clone());
            self.context.tracker.spawn(async move {
                if s.clients_attached() > 0 {
                    replica.forget_following(&s.id);
                    if let Err(e) = replica.follow(&s.id, false).await {
                        tracing::warn!(session = %s.id, error = %e, "cannot note again that this replica follows the session");
                    }
                }
                s.catch_up(&*store).await;
            });
        }
    }

    /// `session` is announced to this replica but no longer in its memory (its clients left):
    /// it stops following it, unless a client attached meanwhile.
    fn spawn_unfollow(&self, session: &str) {
        let Some(replica) = self.replica().filter(|r| r.follows(session)).cloned() else {
            return;
        };
        let (registry, session) = (self.registry.clone(), session.to_string());
        self.context.tracker.spawn(async move {
            let unattended = || registry.get(&session).is_none_or(|s| s.clients_attached() == 0);
            if let Err(e) = replica.unfollow(&session, &unattended).await {
                tracing::warn!(session, error = %e, "cannot stop following a session");
            }
        });
    }

    /// Reads and hands out what another replica committed of `session`.
    pub fn spawn_catch_up(&self, session: Arc<LiveSession>) {
        let store = self.store().clone();
        self.context
            .tracker
            .spawn(async move { session.catch_up(&*store).await });
    }

    /// Whether this replica serves `session` on an agent process right now.
    pub fn serving(&self, session: &str) -> bool {
        self.registry.get(session).is_some_and(|s| s.is_bound_now())
    }

    /// Agent requests asked across replicas, when several share the database.
    pub fn asks(&self) -> Option<&Arc<Asks>> {
        self.context.asks.as_ref()
    }

    /// A client of this replica attached to `session` (`controls`: one that may answer its
    /// agent's requests). The first time, the serving replica (if another) is asked to announce
    /// the session's commits, and what it committed before is read here; the first time a
    /// controller comes, other replicas may ask it their agents' requests from now on, and the
    /// serving replica is told, so it asks what its agent already waits on.
    pub async fn followed(&self, session: &Arc<LiveSession>, controls: bool) {
        let Some(replica) = self.replica() else { return };
        let followed = match replica.follow(&session.id, controls).await {
            Ok(Some(followed)) => followed,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(session = %session.id, error = %e, "cannot note that this replica follows the session");
                return;
            }
        };
        let Some(served) = followed.served_by else { return };
        // Commits announced from now on; the ones before are in the store.
        self.spawn_catch_up(session.clone());
        if !followed.new_watcher || !served.current {
            return;
        }
        let note = Note::Watching {
            session: session.id.to_string(),
        };
        if let Err(e) = replica.tell(&served.replica, note).await {
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
            self.context.tracker.spawn(async move {
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
            self.context.permission_wait,
        );
        asks.adopt(Arc::from(from), key, &request);
        s.ask_after(after_seq, request);
        if s.released() < after_seq {
            self.spawn_catch_up(s);
        }
    }

    /// Another replica took `session`'s lease: its clients here are fed from the store now (the
    /// new holder is asked to announce its commits, and what it committed before is read).
    pub fn lease_lost(&self, session: &str) {
        let Some(s) = self.registry.get(session) else { return };
        s.leave();
        let Some(replica) = self.replica().cloned() else { return };
        let store = self.store().clone();
        self.context.tracker.spawn(async move {
            if let Err(e) = replica.announce(&s.id).await {
                tracing::warn!(session = %s.id, error = %e, "cannot ask the new serving replica to announce commits");
            }
            s.catch_up(&*store).await;
        });
    }
}
