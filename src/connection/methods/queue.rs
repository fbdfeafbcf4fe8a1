//! Messages typed mid-turn (see [`crate::session::queue`]): the client's
//! `_gateway/queue/add|edit|remove|send` requests, the route that sees a turn end, and the
//! sending of the next queued message on the owner's behalf.
//!
//! - `_gateway/queue/add` `{sessionId, prompt}` → `{id}`: queued (checked as a prompt is: the
//!   agent's `promptCapabilities`, attachment and storage caps); sent at once when no turn runs.
//!   An agent that queues prompts itself (`agentCapabilities._meta.claudeCode.promptQueueing`)
//!   gets it at once instead → `{sent: true}`.
//! - `_gateway/queue/edit` `{sessionId, id, prompt}`, `_gateway/queue/remove` `{sessionId, id}`
//!   → `{}`; `-32602` once it was sent.
//! - `_gateway/queue/send` `{sessionId}` → `{}`: a queue held after a cancelled or failed turn
//!   goes on.
//!
//! Every change reaches the session's attached clients as a `_gateway/queue` notification.

use super::*;
use crate::session::queue::Queued;

/// The methods' common prefix.
pub(super) const PREFIX: &str = crate::protocol::method::ext::QUEUE_PREFIX;

/// The params the queue methods read (besides `sessionId`).
#[derive(Deserialize)]
struct Op {
    #[serde(default)]
    id: Option<u64>,
    #[serde(default)]
    prompt: Option<Box<RawValue>>,
}

impl Ctx {
    /// Handles `_gateway/queue/{op}` for `session`, served here; the answer goes to `to`.
    pub(super) async fn queue_op(
        &self,
        session: &Arc<LiveSession>,
        op: &str,
        id: &RawValue,
        params: &RawValue,
        to: &crate::infra::outbox::Outbox,
    ) -> Handled {
        let p: Op = serde_json::from_str(params.get())
            .map_err(|e| RpcError::invalid_params(format!("invalid {PREFIX}{op} params: {e}")))?;
        let need_id = || {
            p.id.ok_or_else(|| RpcError::invalid_params(format!("{PREFIX}{op} needs `id`")))
        };
        let prompt = || {
            p.prompt.clone().filter(|p| p.get().starts_with('[')).ok_or_else(|| {
                RpcError::invalid_params(format!("{PREFIX}{op} needs `prompt`, an array of content blocks"))
            })
        };
        // A teammate (a controller by share), or `None` for the owner: who wrote a message.
        let author = || (*self.client.user != *session.owner).then(|| self.client.user.to_string());
        let result = match op {
            "add" => {
                let prompt = prompt()?;
                if self.agent_queues_prompts(session).await? {
                    self.send_now(session, prompt).await?;
                    json!({"sent": true})
                } else {
                    json!({"id": session.queue().add(prompt, author())?})
                }
            }
            "edit" => {
                session.queue().edit(need_id()?, prompt()?, author())?;
                json!({})
            }
            "remove" => {
                session.queue().remove(need_id()?)?;
                json!({})
            }
            "send" => json!({}),
            other => {
                let ops = crate::protocol::method::ext::QUEUE_OPS.map(|op| format!("{PREFIX}{op}"));
                return Err(RpcError::method_not_found(&format!(
                    "{PREFIX}{other} (the queue takes {})",
                    ops.join(", ")
                )));
            }
        };
        let next = if op == "send" {
            session.queue().release()
        } else {
            session.queue().take_due()
        };
        session.tell_queue();
        if let Some(next) = next {
            send_queued(&self.gw, session, next);
        }
        to.push(Utf8Bytes::from(protocol::response(id.get(), &result.to_string())));
        Ok(Reply::Forwarded)
    }

    /// Whether the session's agent takes a prompt while one runs and queues it itself
    /// (claude-agent-acp's `_meta.claudeCode.promptQueueing`).
    async fn agent_queues_prompts(&self, session: &LiveSession) -> Result<bool, RpcError> {
        let pool = self
            .pool_of(session)
            .ok_or_else(|| RpcError::internal(format!("agent {} is no longer configured", session.agent)))?;
        let info = pool.info_for(&session.owner).await?;
        Ok(info
            .capabilities
            .get("_meta")
            .and_then(|m| m.get("claudeCode"))
            .and_then(|c| c.get("promptQueueing"))
            .and_then(Value::as_bool)
            .unwrap_or(false))
    }

    /// Sends `prompt` to the session's agent now, on the owner's behalf; its answer (the turn's
    /// end) reaches the clients as a `_gateway/queue` notification.
    async fn send_now(&self, session: &Arc<LiveSession>, prompt: Box<RawValue>) -> Result<(), RpcError> {
        send_for_owner(&self.gw, session, &prompt, "sent").await
    }
}

/// Sends queued message `item` on its own task; it goes back first in line, and the queue holds,
/// if it cannot be sent.
pub(super) fn send_queued(gw: &Gateway, session: &Arc<LiveSession>, item: Queued) {
    let (gw, session) = (gw.clone(), session.clone());
    gw.life.tracker.clone().spawn(async move {
        if let Some(by) = &item.by {
            // Their share ended (revoked or expired, here or on another replica) while it waited,
            // or the agent now carries secrets of the owner's that their share does not lend.
            let refused = if gw.shares.controls(by, &session.id).await {
                super::withheld::teammate_may_prompt(&gw, &session, by, None).await.err()
            } else {
                Some(RpcError::session_not_found())
            };
            if let Some(e) = refused {
                tracing::info!(session = %session.id, user = %by, reason = %e.message, "a teammate's queued message not sent");
                let why = (e.code != codes::RESOURCE_NOT_FOUND)
                    .then(|| format!("{by}'s queued message was not sent: {}", e.message));
                let next = session.queue().dropped(why);
                if let Some(next) = next {
                    send_queued(&gw, &session, next);
                }
                session.tell_queue();
                return;
            }
        }
        match send_for_owner(&gw, &session, &item.prompt, &item.id.to_string()).await {
            Ok(()) => {
                // Its turn may be over already: then the next one goes now.
                let next = session.queue().sent();
                if let Some(next) = next {
                    send_queued(&gw, &session, next);
                }
            }
            Err(e) => {
                tracing::warn!(session = %session.id, error = %e.message, "a queued message could not be sent; the queue holds");
                session.queue().not_sent(item, e.message.into_owned());
            }
        }
        session.tell_queue();
    });
}

/// Sends `prompt` to `session`'s agent as its owner would (recorded, restoring the session onto
/// a process if needed); the answer goes nowhere (clients see the turn end in the queue's
/// notice). `tag` names it in the request id.
async fn send_for_owner(
    gw: &Gateway,
    session: &Arc<LiveSession>,
    prompt: &RawValue,
    tag: &str,
) -> Result<(), RpcError> {
    let pool = gw
        .agents
        .pools
        .get(&session.agent)
        .cloned()
        .ok_or_else(|| RpcError::internal(format!("agent {} is no longer configured", session.agent)))?;
    // Nobody reads the answer: a closed outbox drops it.
    let (outbox, _) = crate::infra::outbox::outbox(1, 1 << 16);
    outbox.close(1000, "queued prompt");
    let stand_in = Client::new(
        Arc::from(format!("{}-queue", gw.life.replica)),
        session.owner.clone(),
        None,
        outbox.clone(),
    );
    let ctx = Ctx::stand_in(gw.clone(), stand_in, pool);
    let params = format!(r#"{{"sessionId":{},"prompt":{}}}"#, json!(&*session.id), prompt.get());
    let params = RawValue::from_string(params).map_err(|e| RpcError::internal(e.to_string()))?;
    let id = RawValue::from_string(json!(format!("queued-{tag}")).to_string())
        .map_err(|e| RpcError::internal(e.to_string()))?;
    // Boxed: `forward_here` is also what serves the queue methods that call this.
    Box::pin(ctx.forward_here(session, "session/prompt", &id, &params, Some(prompt), outbox, None))
        .await
        .map(|_| ())
}

/// A turn of `session` ended (`stopped`: cancelled or failed): the next queued message goes,
/// and the clients hear of it.
pub(super) fn turn_over(gw: &Gateway, session: &Arc<LiveSession>, stopped: bool) {
    let next = session.queue().turn_ended(stopped);
    session.tell_queue_after_updates();
    if let Some(next) = next {
        send_queued(gw, session, next);
    }
}

/// Where the agent's answer to a `session/prompt` goes: to its client as any answer, and then
/// the session's turn is over.
pub(super) struct PromptAnswer {
    pub(super) session: Arc<LiveSession>,
    pub(super) gw: Gateway,
}

/// Whether a prompt's answer ends the turn cancelled or failed.
fn stopped(frame: &str) -> bool {
    #[derive(Deserialize)]
    struct Answer<'a> {
        #[serde(borrow, default)]
        result: Option<Result_<'a>>,
        #[serde(default)]
        error: Option<serde::de::IgnoredAny>,
    }
    #[derive(Deserialize)]
    struct Result_<'a> {
        #[serde(rename = "stopReason", borrow, default)]
        stop_reason: Option<&'a str>,
    }
    match serde_json::from_str::<Answer<'_>>(frame) {
        Ok(a) => a.error.is_some() || a.result.is_none_or(|r| r.stop_reason == Some("cancelled")),
        Err(_) => true,
    }
}

#[async_trait::async_trait]
impl SessionRoute for PromptAnswer {
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
        let stopped = stopped(&frame);
        self.session.queue().answered(&frame);
        self.session.respond(to, client_id, frame);
        turn_over(&self.gw, &self.session, stopped);
        let event = if stopped {
            crate::session::Attention::TurnFailed
        } else {
            crate::session::Attention::TurnEnded
        };
        self.session.push_if_unwatched(event, None);
    }

    fn unbound(&self, process_id: u64) {
        self.session.unbound(process_id);
    }
}

#[cfg(test)]
mod tests {
    use super::stopped;

    #[test]
    fn a_turn_is_stopped_when_cancelled_or_failed() {
        assert!(!stopped(
            r#"{"jsonrpc":"2.0","id":1,"result":{"stopReason":"end_turn"}}"#
        ));
        assert!(!stopped(
            r#"{"jsonrpc":"2.0","id":1,"result":{"stopReason":"max_tokens"}}"#
        ));
        assert!(stopped(
            r#"{"jsonrpc":"2.0","id":1,"result":{"stopReason":"cancelled"}}"#
        ));
        assert!(stopped(
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"agent process is gone"}}"#
        ));
        assert!(stopped("not json"));
    }
}
