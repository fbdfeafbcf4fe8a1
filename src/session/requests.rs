//! Requests from an agent to its client (`session/request_permission`, `fs/*`, `terminal/*`):
//! asked of every attached client, settled by the first answer. The others are told with
//! `$/cancel_request`. With no client attached, a request waits (bounded) for one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use axum::extract::ws::Utf8Bytes;
use serde_json::value::RawValue;

use super::LiveSession;
use crate::bridge::client::ClientHandle;
use crate::pool::AgentProcess;
use crate::protocol::{self, RpcError};

/// One agent request and who has been asked it.
pub struct Settle {
    /// The session it concerns.
    session: Arc<LiveSession>,
    /// The process that asked (its answer goes there).
    process: Weak<AgentProcess>,
    /// The agent's id for the request, raw.
    agent_id: Box<RawValue>,
    /// The method.
    method: String,
    /// Its params, with the gateway's session id.
    params: String,
    /// Set by the first answer (or by giving up).
    done: AtomicBool,
    /// Clients asked, with the id each was asked under.
    asked: Mutex<Vec<(Weak<ClientHandle>, u64)>>,
}

impl Settle {
    /// A request not yet asked of anyone.
    pub fn new(
        session: Arc<LiveSession>,
        process: &Arc<AgentProcess>,
        agent_id: Box<RawValue>,
        method: &str,
        params: String,
    ) -> Arc<Self> {
        Arc::new(Self {
            session,
            process: Arc::downgrade(process),
            agent_id,
            method: method.to_string(),
            params,
            done: AtomicBool::new(false),
            asked: Mutex::new(Vec::new()),
        })
    }

    /// Whether it has been answered or given up on.
    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Asks `targets` (each under an id of its own connection).
    pub async fn ask(self: &Arc<Self>, targets: &[Arc<ClientHandle>]) {
        for client in targets {
            if self.is_done() {
                return;
            }
            let out_id = client.register_out_request(self.clone());
            self.asked
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((Arc::downgrade(client), out_id));
            client
                .send(Utf8Bytes::from(protocol::request(out_id, &self.method, &self.params)))
                .await;
        }
    }

    /// `from` answered: the first answer goes to the agent, the other clients are told.
    pub async fn answer(&self, from: &ClientHandle, result: Option<&RawValue>, error: Option<&RawValue>) {
        if self.done.swap(true, Ordering::AcqRel) {
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
        if let Some(p) = self.process.upgrade() {
            let _ = p.send_line(frame).await;
        }
        let others: Vec<(Weak<ClientHandle>, u64)> =
            self.asked.lock().unwrap_or_else(|e| e.into_inner()).drain(..).collect();
        for (client, out_id) in others {
            let Some(client) = client.upgrade() else {
                continue;
            };
            if std::ptr::eq(&*client, from) {
                continue;
            }
            client.forget_out_request(out_id);
            let params = format!(r#"{{"requestId":{out_id}}}"#);
            client
                .send(Utf8Bytes::from(protocol::notification("$/cancel_request", &params)))
                .await;
        }
    }

    /// A client that was asked has disconnected: if no one else can answer, wait for the next.
    pub async fn client_gone(self: &Arc<Self>, gone: &ClientHandle) {
        if self.is_done() {
            return;
        }
        let anyone_left = {
            let mut asked = self.asked.lock().unwrap_or_else(|e| e.into_inner());
            asked.retain(|(c, _)| c.upgrade().is_some_and(|c| !std::ptr::eq(&*c, gone) && !c.is_closed()));
            !asked.is_empty()
        };
        if !anyone_left {
            self.session.requeue(self.clone()).await;
        }
    }

    /// No client answered in time: a permission request is answered `cancelled`, anything else
    /// with an error.
    pub async fn give_up(&self) {
        if self.done.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::info!(session = %self.session.id, method = %self.method, "no client answered the agent's request in time");
        let frame = if self.method == "session/request_permission" {
            protocol::response(self.agent_id.get(), r#"{"outcome":{"outcome":"cancelled"}}"#)
        } else {
            protocol::error(
                Some(self.agent_id.get()),
                &RpcError::internal("no client is attached to this session"),
            )
        };
        if let Some(p) = self.process.upgrade() {
            let _ = p.send_line(frame).await;
        }
    }
}

/// A request waiting for a client to attach; given up on after a deadline.
pub(crate) struct Waiting {
    /// The request.
    settle: Arc<Settle>,
}

impl Waiting {
    /// Starts the deadline.
    pub(crate) fn new(settle: Arc<Settle>, wait: Duration) -> Self {
        let weak = Arc::downgrade(&settle);
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            if let Some(s) = weak.upgrade() {
                s.give_up().await;
            }
        });
        Self { settle }
    }

    /// A client attached: ask it.
    pub(crate) async fn deliver(self, session: &Arc<LiveSession>) {
        if !self.settle.is_done() {
            session.requeue(self.settle).await;
        }
    }
}
