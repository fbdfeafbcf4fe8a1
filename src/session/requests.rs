//! Requests from an agent to its client (`session/request_permission`, `fs/*`, `terminal/*`):
//! asked of the session's attached clients, settled by the first answer; the others are told
//! with `$/cancel_request`. With no client attached a request waits for one. Either way it has a
//! deadline (`permission_wait_secs`): then the agent is answered `cancelled` (an error for other
//! methods), the clients asked are told, and the request is forgotten.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use axum::extract::ws::Utf8Bytes;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use super::LiveSession;
use super::client::Client;
use crate::pool::AgentProcess;
use crate::protocol::{self, RpcError};

/// One agent request and who has been asked it.
pub struct AgentRequest {
    /// The session it concerns (weak: a request never keeps a session in memory).
    session: Weak<LiveSession>,
    /// The process that asked; its answer goes there.
    process: Weak<AgentProcess>,
    /// The agent's id for the request, raw.
    agent_id: Box<RawValue>,
    /// `session/request_permission` goes to every attached client, anything else to the newest.
    method: String,
    /// Its params, with the gateway's session id.
    params: String,
    /// Set by the first answer, or by the deadline.
    done: AtomicBool,
    /// Clients asked, with the id each was asked under.
    asked: Mutex<Vec<(Weak<Client>, u64)>>,
    /// Cancels the deadline once the request is settled.
    settled: CancellationToken,
}

impl AgentRequest {
    /// A request not yet asked of anyone; it gives up by itself after `wait`.
    pub(crate) fn new(
        session: &Arc<LiveSession>,
        process: &Arc<AgentProcess>,
        agent_id: Box<RawValue>,
        method: &str,
        params: String,
        wait: Duration,
    ) -> Arc<Self> {
        let request = Arc::new(Self {
            session: Arc::downgrade(session),
            process: Arc::downgrade(process),
            agent_id,
            method: method.to_string(),
            params,
            done: AtomicBool::new(false),
            asked: Mutex::new(Vec::new()),
            settled: CancellationToken::new(),
        });
        let weak = Arc::downgrade(&request);
        let settled = request.settled.clone();
        // Ends when the request is settled or gives up: one short-lived timer per request.
        tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(wait) => {
                    if let Some(r) = weak.upgrade() {
                        r.give_up().await;
                    }
                }
                () = settled.cancelled() => {}
            }
        });
        request
    }

    /// Whether it is asked of every attached client (a permission request) or of the newest.
    pub(crate) fn asks_everyone(&self) -> bool {
        self.method == "session/request_permission"
    }

    /// Whether it has been answered or given up on.
    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Asks `targets` (each under an id of its own connection). Never waits: a client whose
    /// queue is full is closed, and the request waits for the next client.
    pub(crate) fn ask(self: &Arc<Self>, targets: &[Arc<Client>]) {
        for client in targets {
            if self.is_done() {
                return;
            }
            let out_id = client.ask(self.clone());
            self.asked
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((Arc::downgrade(client), out_id));
            client
                .outbox
                .push(Utf8Bytes::from(protocol::request(out_id, &self.method, &self.params)));
            crate::metrics::message_out(crate::metrics::Peer::Client, &self.method, 1);
        }
    }

    /// Marks it settled; `false` if it already was.
    fn settle(&self) -> bool {
        if self.done.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.settled.cancel();
        if let Some(session) = self.session.upgrade() {
            session.forget_waiting(self);
        }
        true
    }

    /// `from` answered: the first answer goes to the agent, the other clients are told.
    pub async fn answer(&self, from: &Client, result: Option<&RawValue>, error: Option<&RawValue>) {
        if !self.settle() {
            return;
        }
        let frame = match (result, error) {
            (Some(r), _) => protocol::response(self.agent_id.get(), r.get()),
            (None, Some(e)) => protocol::error_passthrough(self.agent_id.get(), e.get()),
            (None, None) => protocol::error(
                Some(self.agent_id.get()),
                &RpcError::internal("client sent an empty response"),
            ),
        };
        self.tell_others(Some(from));
        if let Some(p) = self.process.upgrade() {
            let _ = p.send_line(frame).await;
        }
    }

    /// Sends `$/cancel_request` to every client asked (but `except`).
    fn tell_others(&self, except: Option<&Client>) {
        let asked: Vec<(Weak<Client>, u64)> = self.asked.lock().unwrap_or_else(|e| e.into_inner()).drain(..).collect();
        for (client, out_id) in asked {
            let Some(client) = client.upgrade() else {
                continue;
            };
            if except.is_some_and(|e| std::ptr::eq(&*client, e)) {
                continue;
            }
            client.forget_asked(out_id);
            let params = format!(r#"{{"requestId":{out_id}}}"#);
            client
                .outbox
                .push(Utf8Bytes::from(protocol::notification("$/cancel_request", &params)));
            crate::metrics::message_out(crate::metrics::Peer::Client, "$/cancel_request", 1);
        }
    }

    /// A client that was asked has left: if no one else can answer, wait for the next client.
    pub fn client_gone(self: &Arc<Self>, gone: &Client) {
        if self.is_done() {
            return;
        }
        let anyone_left = {
            let mut asked = self.asked.lock().unwrap_or_else(|e| e.into_inner());
            asked.retain(|(c, _)| c.upgrade().is_some_and(|c| !std::ptr::eq(&*c, gone) && !c.is_closed()));
            !asked.is_empty()
        };
        if !anyone_left && let Some(session) = self.session.upgrade() {
            session.dispatch_agent_request(self.clone());
        }
    }

    /// No client answered in time: a permission request is answered `cancelled`, anything else
    /// with an error; the clients asked are told.
    pub(crate) async fn give_up(&self) {
        if !self.settle() {
            return;
        }
        tracing::info!(method = %self.method, "no client answered the agent's request in time");
        self.tell_others(None);
        let frame = if self.asks_everyone() {
            protocol::response(self.agent_id.get(), r#"{"outcome":{"outcome":"cancelled"}}"#)
        } else {
            protocol::error(
                Some(self.agent_id.get()),
                &RpcError::internal("no client answered this request in time"),
            )
        };
        if let Some(p) = self.process.upgrade() {
            let _ = p.send_line(frame).await;
        }
    }
}
