//! A session's controls (mode, config options, model) as the agent's answers change them.

use super::*;

/// Where the agent's answer to a control request ([`ClientMethod::is_control`]) goes: the session's controls take
/// what it changed (before the client sees the answer, so a `session/load` right after it
/// answers with them), they are stored, and the answer goes on as any other. When other replicas
/// share the database, the answer waits until they are written: a client of another replica
/// that loads the session after the answer reads them from the store.
pub(super) struct ControlsAnswer {
    pub(super) session: Arc<LiveSession>,
    /// The client's method and params (`session/set_mode` answers `{}`: the mode is in them).
    pub(super) method: Box<str>,
    pub(super) params: Box<str>,
    /// Tracks the task that stores them.
    pub(super) gw: Gateway,
}

#[async_trait::async_trait]
impl SessionRoute for ControlsAnswer {
    fn session_id(&self) -> &str {
        self.session.session_id()
    }

    async fn publish(&self, update: &RawValue, meta: Option<&RawValue>) {
        self.session.publish(update, meta).await;
    }

    async fn publish_burst(&self, updates: &[(&RawValue, Option<&RawValue>)], more: bool) {
        self.session.publish_burst(updates, more).await;
    }

    fn agent_request(self: Arc<Self>, process: &Arc<AgentProcess>, id: Box<RawValue>, method: &str, params: String) {
        self.session.clone().agent_request(process, id, method, params);
    }

    fn respond(&self, to: &crate::infra::outbox::Outbox, client_id: &RawValue, frame: Utf8Bytes) {
        #[derive(Deserialize)]
        struct Answer<'a> {
            #[serde(borrow, default)]
            result: Option<&'a RawValue>,
        }
        let result = serde_json::from_str::<Answer<'_>>(&frame).ok().and_then(|a| a.result);
        if let Some(result) = result
            && self
                .session
                .change_controls_now(|c| c.apply_answer(&self.method, &self.params, result.get()))
        {
            let session = self.session.clone();
            if session.replicated() {
                let (to, client_id) = (to.clone(), client_id.to_owned());
                self.gw.life.tracker.spawn(async move {
                    session.store_controls_now().await;
                    session.respond(&to, &client_id, frame);
                });
                return;
            }
            self.gw
                .life
                .tracker
                .spawn(async move { session.store_controls_in_order().await });
        }
        self.session.respond(to, client_id, frame);
    }

    fn unbound(&self, process_id: u64) {
        self.session.unbound(process_id);
    }
}
