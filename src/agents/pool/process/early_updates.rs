//! Updates the agent sends for a session it has just created, held until that session is bound
//! (see [`early`](super::super::early)).

use std::sync::Arc;

use super::super::child::lock;
use super::AgentProcess;

/// What the agent sends for a session it has just created, from its `session/new` answer on,
/// kept for that session ([`AgentProcess::hold_updates`]). [`EarlyUpdates::hand_on`] gives it
/// to the session once bound; dropped unused (the creation failed), it is forgotten.
#[must_use = "dropping it forgets what the agent sent for the new session"]
pub struct EarlyUpdates {
    /// Where they are held.
    pub(super) process: Arc<AgentProcess>,
    /// The agent's id of the new session.
    pub(super) agent_session_id: Arc<str>,
    /// Whether this holds a claim (not when the id was already bound to another session).
    pub(super) claimed: bool,
}

impl EarlyUpdates {
    /// Gives the session now bound to the id what the agent sent for it so far, in the order
    /// sent, then lets the reader route the id as any other; returns how many.
    ///
    /// Order: until the claim ends, the reader holds the id's updates (it hands on none; with
    /// no room left it waits for `claim_room`), and once this has taken them it waits on
    /// `handing_early` instead, which this holds until after the claim has ended. So everything
    /// held is numbered before anything later.
    ///
    /// Nothing here waits on the reader (the lock is held only by others handing on, publishing
    /// waits only on the transcript writer), so the reader may wait on this.
    pub async fn hand_on(mut self) -> usize {
        if !self.claimed {
            return 0;
        }
        let process = self.process.clone();
        let _handing = process.handing_early.lock().await;
        let (session, held) = {
            let mut routes = lock(&process.routes);
            let held = routes.held.take_for_handing(&self.agent_session_id);
            (routes.sessions.get(&self.agent_session_id).cloned(), held)
        };
        // Room again, for this claim's id (the reader then waits on the lock) and others'.
        process.claim_room.notify_one();
        let n = match session {
            Some(session) => {
                for entry in &held {
                    session.publish(&entry.update, entry.meta.as_deref()).await;
                }
                held.len()
            }
            // Not bound (the process died meanwhile): nobody to give them to.
            None => 0,
        };
        lock(&process.routes).held.unclaim(&self.agent_session_id, true);
        self.claimed = false;
        process.claim_room.notify_one();
        if n > 0 {
            tracing::debug!(agent = %process.agent, process = process.id, updates = n, "updates sent before the session was bound handed on");
        }
        n
    }
}

impl Drop for EarlyUpdates {
    fn drop(&mut self) {
        if self.claimed {
            // Not handed on: the session was not created (or the task ended); an early drop,
            // cancelled while handing on, lets the reader go on too.
            let mut routes = lock(&self.process.routes);
            let handing = routes.held.handing(&self.agent_session_id);
            routes.held.forget(&self.agent_session_id);
            routes.held.unclaim(&self.agent_session_id, handing);
            drop(routes);
            self.process.claim_room.notify_one();
        }
    }
}

impl std::fmt::Debug for EarlyUpdates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EarlyUpdates")
            .field("process", &self.process.id)
            .field("agent_session_id", &self.agent_session_id)
            .field("claimed", &self.claimed)
            .finish()
    }
}
