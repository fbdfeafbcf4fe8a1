//! Which session an agent's update goes to: the routes from the agent's session ids to live
//! sessions, and the updates held for ids no session has taken yet.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use serde_json::value::RawValue;

use super::super::child::lock;
use super::super::early::Held;
use super::super::route::SessionRoute;
use super::{AgentProcess, EarlyUpdates};

/// Live sessions on a process, by the agent's session id, and the updates held for ids that
/// have no route yet (or whose new session has not taken them yet).
#[derive(Default)]
pub(super) struct Routes {
    pub(super) sessions: HashMap<Arc<str>, Arc<dyn SessionRoute>>,
    pub(super) held: Held,
}

/// Where the reader sends an update.
pub(super) enum Destination {
    /// Its session.
    Session(Arc<dyn SessionRoute>),
    /// Nowhere yet: held (or, for an id no session claims, dropped when there was no room).
    Held,
    /// Its new session is taking what was held for it: wait, then look again.
    Wait,
    /// A session being created claims it and there is no room to hold it: wait until a claim
    /// hands on or ends ([`AgentProcess::claim_room`]), then look again.
    Room,
}

impl AgentProcess {
    /// Routes the agent's updates and requests for `agent_session_id` to `session`. Refused
    /// (`false`) when that id already routes to another session: an agent that answers with an
    /// id it already gave out (or one a client chose) must not divert a live session.
    ///
    /// Updates held for the id are forgotten, unless a session being created claims it
    /// ([`AgentProcess::hold_updates`]; it takes them with [`EarlyUpdates::hand_on`]): a restore
    /// binds after the agent's `session/load` (or resume) answer, and what the agent replayed
    /// before answering is history the gateway already has. What such an agent says between
    /// its answer and this binding goes with it (telling the two apart would need the reader to
    /// know which answer it read when).
    pub fn bind_session(&self, agent_session_id: Arc<str>, session: Arc<dyn SessionRoute>) -> bool {
        let mut routes = lock(&self.routes);
        let routes = &mut *routes;
        match routes.sessions.get(&agent_session_id) {
            Some(bound) if !Arc::ptr_eq(bound, &session) => false,
            _ => {
                if !routes.held.is_claimed(&agent_session_id) {
                    let dropped = routes.held.forget(&agent_session_id);
                    if dropped > 0 {
                        tracing::debug!(agent = %self.agent, process = self.id, dropped, "updates the agent sent before a restore's binding (its replay) dropped");
                    }
                }
                routes.sessions.insert(agent_session_id, session);
                true
            }
        }
    }

    /// Claims `agent_session_id`, just given in the agent's answer to `session/new`, for the
    /// session being created: what the agent sent for it (the reader may have read past the
    /// answer already) and sends from now on is held for that session, past its binding, until
    /// [`EarlyUpdates::hand_on`], so that its creator can answer its client first. Claims
    /// nothing when the id already routes to a session (an agent reusing an id: that binding
    /// will be refused, and the live session's updates must not wait).
    pub fn hold_updates(self: &Arc<Self>, agent_session_id: Arc<str>) -> EarlyUpdates {
        let mut routes = lock(&self.routes);
        let claimed = !routes.sessions.contains_key(&agent_session_id);
        if claimed {
            routes.held.claim(agent_session_id.clone());
        }
        EarlyUpdates {
            process: self.clone(),
            agent_session_id,
            claimed,
        }
    }

    /// Stops routing for a session and frees its slot.
    pub fn unbind_session(&self, agent_session_id: &str) {
        if lock(&self.routes).sessions.remove(agent_session_id).is_some() {
            self.release();
        }
    }

    pub(super) fn session(&self, agent_session_id: &str) -> Option<Arc<dyn SessionRoute>> {
        lock(&self.routes).sessions.get(agent_session_id).cloned()
    }

    /// The session an update for `agent_session_id` goes to at once: bound, and not being
    /// created (whose updates [`Self::destination`] holds until its creator hands them on).
    pub(super) fn bound_session(&self, agent_session_id: &str) -> Option<Arc<dyn SessionRoute>> {
        let routes = lock(&self.routes);
        if routes.held.is_claimed(agent_session_id) {
            return None;
        }
        routes.sessions.get(agent_session_id).cloned()
    }

    /// Where an update for `agent_session_id` goes now; holds it when that is nowhere yet.
    /// A bound, unclaimed id (every update of a streaming session) costs what a lookup did
    /// before anything was held: one lock, one map lookup, one empty-list check.
    pub(super) fn destination(
        &self,
        agent_session_id: &str,
        update: &RawValue,
        meta: Option<&RawValue>,
    ) -> Destination {
        let mut routes = lock(&self.routes);
        let routes = &mut *routes;
        let claimed = routes.held.is_claimed(agent_session_id);
        if let Some(session) = routes.sessions.get(agent_session_id) {
            if !claimed {
                return Destination::Session(session.clone());
            }
            // Bound and claimed: held until its creator hands on, or (while that runs) wait.
            if routes.held.handing(agent_session_id) {
                return Destination::Wait;
            }
        }
        if !routes.held.park(agent_session_id, update, meta, Instant::now()) {
            if claimed {
                // Its client may have the session's id already (and be prompting): the update
                // waits for room, as a bound session's does for the transcript writer.
                tracing::debug!(agent = %self.agent, process = self.id, "no room to hold an update of a session being created; waiting for it to be handed on");
                return Destination::Room;
            }
            tracing::debug!(agent = %self.agent, process = self.id, "update for a session with no route, and no room to hold it; dropped");
        }
        Destination::Held
    }
}
