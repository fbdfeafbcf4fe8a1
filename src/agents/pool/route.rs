//! What an agent process hands a session: the pool's side of the bargain, implemented by the
//! session layer above it, so that the pool never imports what sits on top of it.

use std::sync::Arc;

use axum::extract::ws::Utf8Bytes;
use serde_json::value::RawValue;

use super::AgentProcess;
use crate::infra::outbox::Outbox;

/// A session as its agent process sees it.
#[async_trait::async_trait]
pub trait SessionRoute: Send + Sync {
    /// The gateway's id for the session (agent requests are rewritten to it).
    fn session_id(&self) -> &str;

    /// The agent sent an update for the session (`update` and its `_meta`, raw). Waits only
    /// while the transcript writer's queue is full: the database's pace, never a client's.
    async fn publish(&self, update: &RawValue, meta: Option<&RawValue>);

    /// Updates the agent wrote at once for the session (`update` and `_meta` each), in order,
    /// handed on together; `more`: another update, already read, follows the last. Each is
    /// published as [`Self::publish`] would; a session may take them in one go.
    async fn publish_burst(&self, updates: &[(&RawValue, Option<&RawValue>)], more: bool) {
        for ((update, meta), follows) in super::process::with_follows(updates, more) {
            super::process::with_more_lines(follows, self.publish(update, *meta)).await;
        }
    }

    /// The agent asks the session's clients something (`session/request_permission`, `fs/*`,
    /// `terminal/*`); the answer goes back to `process` under `id`. Never waits.
    fn agent_request(self: Arc<Self>, process: &Arc<AgentProcess>, id: Box<RawValue>, method: &str, params: String);

    /// The answer (`frame`) to a client's request (`client_id`) forwarded to the agent, for `to`:
    /// delivered after every update of the session the agent sent before it (or, if those can
    /// never be stored, replaced by an error under `client_id`). Never waits.
    fn respond(&self, to: &Outbox, client_id: &RawValue, frame: Utf8Bytes);

    /// The process with this id no longer serves the session (it died or was stopped).
    fn unbound(&self, process_id: u64);
}
