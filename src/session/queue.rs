//! Messages typed while a session's agent is busy: kept by the gateway, one queue per session,
//! so every tab and device of its owner sees the same queue and a reload keeps it. They are sent
//! in order as turns end, one turn at a time. A turn that ends cancelled or failed holds the
//! queue (the user stopped the agent: it is not started again behind their back) until they add
//! another message or send the next one themselves.
//!
//! The state goes to the session's clients as a `_gateway/queue` notification on every change
//! (see [`PromptQueue::notice`]).

use std::collections::VecDeque;

use serde_json::value::RawValue;

use crate::protocol::RpcError;

/// The notification that carries a session's queue to its clients.
pub const NOTICE: &str = crate::protocol::method::ext::QUEUE;

/// Most messages one session holds queued.
pub const MAX_QUEUED: usize = 20;

/// One queued message.
#[derive(Debug, Clone)]
pub struct Queued {
    /// Its id within the session (never reused while the session is in memory).
    pub id: u64,
    /// ACP `ContentBlock[]`, raw, as the client sent it.
    pub prompt: Box<RawValue>,
    /// The teammate who queued it (a controller by share), `None` for the owner: it is sent
    /// only while a share still lets them in.
    pub by: Option<String>,
}

/// A session's queued messages and whether a turn runs.
#[derive(Debug, Default)]
pub struct PromptQueue {
    items: VecDeque<Queued>,
    last_id: u64,
    /// `session/prompt`s sent to the agent and not answered yet.
    turns: u32,
    /// A queued message is on its way to the agent (taken, not yet sent).
    sending: bool,
    /// The last turn was cancelled or failed: nothing is sent until the user says so.
    held: bool,
    /// Why the last queued message could not be sent, until the queue next changes.
    error: Option<String>,
    /// Whether the last notice said a turn runs (its end must then be told too).
    told_running: bool,
    /// How the last turn ended: the agent's answer to its `session/prompt`, `{"result": …}` or
    /// `{"error": …}`, so a client that lost its connection meanwhile (`acp-gateway connect`)
    /// can answer the prompt it had sent.
    last_answer: Option<Box<RawValue>>,
}

fn unknown(id: u64) -> RpcError {
    RpcError::invalid_params(format!(
        "no queued message {id} in this session (it was sent or removed)"
    ))
}

impl PromptQueue {
    /// Queues `prompt`, from teammate `by` or (`None`) the owner; its id. `-32602` when the
    /// session already holds [`MAX_QUEUED`].
    pub fn add(&mut self, prompt: Box<RawValue>, by: Option<String>) -> Result<u64, RpcError> {
        if self.items.len() >= MAX_QUEUED {
            return Err(RpcError::invalid_params(format!(
                "this session already holds {MAX_QUEUED} queued messages; wait for the agent or remove one"
            )));
        }
        self.last_id += 1;
        self.items.push_back(Queued {
            id: self.last_id,
            prompt,
            by,
        });
        // A message added is the user saying "go on".
        self.held = false;
        self.error = None;
        Ok(self.last_id)
    }

    /// Replaces the prompt of queued message `id`, now written by teammate `by` or (`None`) the
    /// owner: whoever wrote what is sent is who it is checked for (an owner's message a teammate
    /// rewrote goes only while a share still lets them control the session).
    pub fn edit(&mut self, id: u64, prompt: Box<RawValue>, by: Option<String>) -> Result<(), RpcError> {
        let item = self.items.iter_mut().find(|q| q.id == id).ok_or_else(|| unknown(id))?;
        item.prompt = prompt;
        item.by = by;
        Ok(())
    }

    /// Removes queued message `id`.
    pub fn remove(&mut self, id: u64) -> Result<(), RpcError> {
        let at = self.items.iter().position(|q| q.id == id).ok_or_else(|| unknown(id))?;
        self.items.remove(at);
        if self.items.is_empty() {
            self.held = false;
            self.error = None;
        }
        Ok(())
    }

    /// Forgets what teammate `user` queued (no share lets them in any more); whether anything was.
    pub fn forget_by(&mut self, user: &str) -> bool {
        let before = self.items.len();
        self.items.retain(|q| q.by.as_deref() != Some(user));
        if self.items.is_empty() {
            self.held = false;
            self.error = None;
        }
        self.items.len() != before
    }

    /// The message [`PromptQueue::take_due`] gave is not sent after all (whoever queued it may
    /// no longer reach the session), and the queue's clients are told `why` when given; the next
    /// one to send.
    pub fn dropped(&mut self, why: Option<String>) -> Option<Queued> {
        self.sending = false;
        if why.is_some() {
            self.error = why;
        }
        self.take_due()
    }

    /// Whether a turn runs (or a queued message is on its way to start one).
    pub fn running(&self) -> bool {
        self.turns > 0 || self.sending
    }

    /// Whether nothing is queued and no turn runs (no client needs to hear of it).
    pub fn is_idle(&self) -> bool {
        self.items.is_empty() && !self.running()
    }

    /// A `session/prompt` was sent to the agent.
    pub fn turn_started(&mut self) {
        self.turns += 1;
    }

    /// A `session/prompt` was answered; `stopped` when it ended cancelled or failed (the queue
    /// is then held). The next message to send, if it is time.
    pub fn turn_ended(&mut self, stopped: bool) -> Option<Queued> {
        self.turns = self.turns.saturating_sub(1);
        if stopped && !self.items.is_empty() {
            self.held = true;
        }
        self.take_due()
    }

    /// Keeps how a turn ended, from the agent's answer frame (its `result` or `error`).
    pub fn answered(&mut self, frame: &str) {
        #[derive(serde::Deserialize)]
        struct Answer<'a> {
            #[serde(borrow, default)]
            result: Option<&'a RawValue>,
            #[serde(borrow, default)]
            error: Option<&'a RawValue>,
        }
        let Ok(answer) = serde_json::from_str::<Answer<'_>>(frame) else {
            return;
        };
        let kept = match (answer.result, answer.error) {
            (_, Some(e)) => format!(r#"{{"error":{}}}"#, e.get()),
            (Some(r), None) => format!(r#"{{"result":{}}}"#, r.get()),
            (None, None) => return,
        };
        self.last_answer = RawValue::from_string(kept).ok();
    }

    /// The turn's state for a client that attaches: `{"running", "lastAnswer"?}`.
    pub fn turn_state(&self) -> serde_json::Value {
        let mut state = serde_json::json!({ "running": self.running() });
        if let Some(last) = &self.last_answer {
            state["lastAnswer"] = serde_json::from_str(last.get()).unwrap_or_default();
        }
        state
    }

    /// The next message to send, taken from the queue: when no turn runs, nothing is on its
    /// way and the queue is not held. The caller sends it and then calls [`PromptQueue::sent`]
    /// or [`PromptQueue::not_sent`].
    pub fn take_due(&mut self) -> Option<Queued> {
        if self.running() || self.held {
            return None;
        }
        let next = self.items.pop_front()?;
        self.sending = true;
        Some(next)
    }

    /// The user asks to send the next message now (a held queue goes on).
    pub fn release(&mut self) -> Option<Queued> {
        self.held = false;
        self.take_due()
    }

    /// The message [`PromptQueue::take_due`] gave was sent (its turn was counted when it was);
    /// the next one to send, if that turn already ended (a fast agent answers before the sender
    /// hears back, and the turn's end found a message still on its way).
    pub fn sent(&mut self) -> Option<Queued> {
        self.sending = false;
        self.error = None;
        self.take_due()
    }

    /// It could not be sent: it goes back first in line, and the queue holds until the user
    /// says to go on.
    pub fn not_sent(&mut self, item: Queued, why: String) {
        self.sending = false;
        self.items.push_front(item);
        self.held = true;
        self.error = Some(why);
    }

    /// Whether a turn's start or end is worth a notice: another client may not know of it
    /// (`many` clients are attached), or the queue is not empty, or a notice said it runs.
    pub fn worth_telling(&self, many: bool) -> bool {
        many || !self.items.is_empty() || self.held || self.told_running
    }

    /// The `_gateway/queue` notification for session `session_id`, as a JSON-RPC frame:
    /// `{sessionId, running, held, queue: [{id, prompt}], error?}`.
    pub fn notice(&mut self, session_id: &str) -> String {
        self.told_running = self.running();
        let queue: Vec<serde_json::Value> = self
            .items
            .iter()
            .map(|q| {
                let prompt: serde_json::Value = serde_json::from_str(q.prompt.get()).unwrap_or_default();
                serde_json::json!({"id": q.id, "prompt": prompt})
            })
            .collect();
        let mut params = serde_json::json!({
            "sessionId": session_id,
            "running": self.running(),
            "held": self.held,
            "queue": queue,
        });
        if let Some(error) = &self.error {
            params["error"] = serde_json::Value::String(error.clone());
        }
        if !self.running()
            && let Some(last) = &self.last_answer
        {
            params["lastAnswer"] = serde_json::from_str(last.get()).unwrap_or_default();
        }
        crate::protocol::notification(NOTICE, &params.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(text: &str) -> Box<RawValue> {
        RawValue::from_string(serde_json::json!([{"type": "text", "text": text}]).to_string()).expect("raw")
    }

    fn text(q: &Queued) -> String {
        let v: serde_json::Value = serde_json::from_str(q.prompt.get()).expect("json");
        v[0]["text"].as_str().unwrap_or_default().to_string()
    }

    /// The agent answers a queued message before its sender hears it went: the turn's end finds
    /// it still on its way, so the next one goes when the sender says it was sent.
    #[test]
    fn a_turn_that_ends_before_its_message_is_reported_sent_does_not_stall_the_queue() {
        let mut q = PromptQueue::default();
        q.turn_started();
        q.add(prompt("a"), None).expect("a");
        q.add(prompt("b"), None).expect("b");
        assert_eq!(text(&q.turn_ended(false).expect("a goes")), "a");
        q.turn_started(); // a is forwarded…
        assert!(q.turn_ended(false).is_none(), "…and answered while still on its way");
        assert_eq!(text(&q.sent().expect("then b goes")), "b");
        q.turn_started();
        assert!(q.sent().is_none(), "b's turn runs");
        assert!(q.turn_ended(false).is_none(), "nothing left");
        assert!(q.is_idle());
    }

    #[test]
    fn messages_wait_for_the_turn_and_go_one_at_a_time_in_order() {
        let mut q = PromptQueue::default();
        q.turn_started();
        let a = q.add(prompt("a"), None).expect("a");
        let b = q.add(prompt("b"), None).expect("b");
        assert_ne!(a, b);
        assert!(q.take_due().is_none(), "a turn runs");
        let first = q.turn_ended(false).expect("the turn ended: a goes");
        assert_eq!(text(&first), "a");
        assert!(q.running(), "on its way counts as running");
        assert!(q.take_due().is_none(), "one at a time");
        q.turn_started();
        assert!(q.sent().is_none(), "a's turn runs");
        assert!(q.take_due().is_none());
        assert_eq!(text(&q.turn_ended(false).expect("b goes")), "b");
        q.turn_started();
        assert!(q.sent().is_none());
        assert!(q.turn_ended(false).is_none());
        assert!(q.is_idle());
    }

    #[test]
    fn edits_and_removals_apply_until_a_message_is_sent() {
        let mut q = PromptQueue::default();
        q.turn_started();
        let a = q.add(prompt("a"), None).expect("a");
        let b = q.add(prompt("b"), None).expect("b");
        q.edit(b, prompt("b2"), None).expect("edit");
        q.remove(a).expect("remove");
        assert!(q.remove(a).is_err(), "gone");
        let next = q.turn_ended(false).expect("b2");
        assert_eq!((next.id, text(&next).as_str()), (b, "b2"));
        let err = q.edit(b, prompt("late"), None).expect_err("sent already");
        assert!(err.message.contains("was sent or removed"), "{}", err.message);
    }

    #[test]
    fn a_stopped_turn_holds_the_queue_until_the_user_goes_on() {
        let mut q = PromptQueue::default();
        q.turn_started();
        q.add(prompt("a"), None).expect("a");
        assert!(q.turn_ended(true).is_none(), "cancelled: held");
        q.answered(r#"{"jsonrpc":"2.0","id":3,"result":{"stopReason":"cancelled"}}"#);
        assert_eq!(
            q.turn_state(),
            serde_json::json!({"running": false, "lastAnswer": {"result": {"stopReason": "cancelled"}}})
        );
        assert!(
            q.notice("s")
                .contains(r#""lastAnswer":{"result":{"stopReason":"cancelled"}}"#)
        );
        q.answered(r#"{"jsonrpc":"2.0","id":4,"error":{"code":-32603,"message":"agent timed out"}}"#);
        assert_eq!(q.turn_state()["lastAnswer"]["error"]["code"], -32603);
        assert!(q.take_due().is_none(), "still held");
        assert!(q.notice("s").contains(r#""held":true"#));
        assert_eq!(text(&q.release().expect("released")), "a");
    }

    #[test]
    fn a_message_that_cannot_be_sent_goes_back_first_and_says_why() {
        let mut q = PromptQueue::default();
        q.add(prompt("a"), None).expect("a");
        q.add(prompt("b"), None).expect("b");
        let a = q.take_due().expect("idle: a goes at once");
        q.not_sent(a, "agent process is gone".into());
        assert!(!q.running());
        assert!(q.take_due().is_none(), "held after a failure");
        let notice: serde_json::Value = serde_json::from_str(&q.notice("s")).expect("json");
        assert_eq!(notice["method"], NOTICE);
        assert_eq!(notice["params"]["error"], "agent process is gone");
        assert_eq!(notice["params"]["queue"][0]["prompt"][0]["text"], "a");
        assert_eq!(notice["params"]["queue"].as_array().map(Vec::len), Some(2));
    }

    #[test]
    fn a_session_holds_at_most_max_queued() {
        let mut q = PromptQueue::default();
        q.turn_started();
        for _ in 0..MAX_QUEUED {
            q.add(prompt("x"), None).expect("room");
        }
        let err = q.add(prompt("x"), None).expect_err("full");
        assert!(err.message.contains(&MAX_QUEUED.to_string()), "{}", err.message);
    }

    /// A teammate's messages are forgotten when their share ends; one already taken to be sent
    /// is dropped instead, and the next one goes.
    #[test]
    fn a_teammates_messages_are_forgotten_or_dropped() {
        let mut q = PromptQueue::default();
        q.turn_started();
        q.add(prompt("carol 1"), Some("carol".into())).expect("carol 1");
        q.add(prompt("alice"), None).expect("alice");
        q.add(prompt("carol 2"), Some("carol".into())).expect("carol 2");
        assert!(q.forget_by("carol"));
        assert!(!q.forget_by("carol"), "nothing of hers is left");
        let next = q.turn_ended(false).expect("alice's goes");
        assert_eq!(text(&next), "alice");

        // An owner's message a teammate rewrote is theirs: forgotten with theirs.
        let mut q = PromptQueue::default();
        q.turn_started();
        let alice = q.add(prompt("alice"), None).expect("alice");
        q.edit(alice, prompt("carol's words"), Some("carol".into()))
            .expect("edit");
        assert!(q.forget_by("carol"));
        assert!(q.turn_ended(false).is_none(), "nothing left to send");

        let mut q = PromptQueue::default();
        q.add(prompt("carol"), Some("carol".into())).expect("carol");
        q.add(prompt("alice"), None).expect("alice");
        let taken = q.take_due().expect("carol's is taken");
        assert_eq!(taken.by.as_deref(), Some("carol"));
        let next = q.dropped(None).expect("not sent after all: the next goes");
        assert_eq!(text(&next), "alice");
        assert!(q.running(), "alice's is on its way");
    }
}
