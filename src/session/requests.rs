//! Requests from an agent to its client (`session/request_permission`, `elicitation/create`,
//! `fs/*`, `terminal/*`):
//! asked of the session's attached clients, settled by the first answer; the others are told
//! with `$/cancel_request`. With no client attached a request waits for one. Either way it has a
//! deadline (`permission_wait_secs`): then the agent is answered `cancelled` (an error for other
//! methods), the clients asked are told, and the request is forgotten.
//!
//! With several replicas, the serving replica's request is also asked of clients on the others
//! ([`super::asks`]); there it is a stand-in whose answer goes back to the serving replica.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use axum::extract::ws::Utf8Bytes;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use super::LiveSession;
use super::asks::Asks;
use super::client::Client;
use crate::agents::pool::AgentProcess;
use crate::protocol::{self, RpcError};

/// Who asked, so where the answer goes.
enum Origin {
    /// An agent process of this replica, under its id for the request.
    Agent {
        /// Weak: a request never keeps a process.
        process: Weak<AgentProcess>,
        /// The agent's id for the request, raw.
        agent_id: Box<RawValue>,
    },
    /// Replica `from`'s agent (its number `key` for the request): the answer goes back there.
    Replica {
        /// The bus side of requests across replicas.
        asks: Arc<Asks>,
        /// The serving replica.
        from: Arc<str>,
        /// Its number for the request.
        key: u64,
    },
}

/// One agent request and who has been asked it.
pub struct AgentRequest {
    /// The session it concerns (weak: a request never keeps a session in memory).
    session: Weak<LiveSession>,
    /// Who asked.
    origin: Origin,
    /// Published to other replicas under this number (an [`Origin::Agent`] request only).
    published: OnceLock<(Arc<Asks>, u64)>,
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
        let origin = Origin::Agent {
            process: Arc::downgrade(process),
            agent_id,
        };
        Self::with_origin(session, origin, method, params, wait)
    }

    /// Replica `from`'s request `key`, to ask of clients here; it gives up (here) after `wait`.
    pub(crate) fn from_replica(
        session: &Arc<LiveSession>,
        asks: Arc<Asks>,
        from: Arc<str>,
        key: u64,
        method: &str,
        params: String,
        wait: Duration,
    ) -> Arc<Self> {
        Self::with_origin(session, Origin::Replica { asks, from, key }, method, params, wait)
    }

    fn with_origin(
        session: &Arc<LiveSession>,
        origin: Origin,
        method: &str,
        params: String,
        wait: Duration,
    ) -> Arc<Self> {
        let request = Arc::new(Self {
            session: Arc::downgrade(session),
            origin,
            published: OnceLock::new(),
            method: method.to_string(),
            params,
            done: AtomicBool::new(false),
            asked: Mutex::new(Vec::new()),
            settled: CancellationToken::new(),
        });
        let weak = Arc::downgrade(&request);
        let settled = request.settled.clone();
        // Ends when the request is settled or gives up: one short-lived timer per request. Not
        // tracked: it holds the request weakly and does nothing at shutdown but wait, and a
        // question nobody answers must not hold shutdown for its whole wait.
        #[expect(
            clippy::disallowed_methods,
            reason = "a timer that only holds the request weakly; see above"
        )]
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

    /// Whether it is asked of every attached client (a permission request, or the agent asking
    /// the user something: `elicitation/create`) or of the newest.
    pub(crate) fn asks_everyone(&self) -> bool {
        self.method == crate::protocol::method::agent::REQUEST_PERMISSION || self.is_elicitation()
    }

    /// Whether the agent asks the user something (`elicitation/create`).
    fn is_elicitation(&self) -> bool {
        self.method == crate::protocol::method::agent::ELICITATION
    }

    /// The ACP method.
    pub(crate) fn method(&self) -> &str {
        &self.method
    }

    /// Its params, raw JSON.
    pub(crate) fn params(&self) -> &str {
        &self.params
    }

    /// Notes that it was published to other replicas as `key`; `false` if it was already, or
    /// it is itself another replica's request.
    pub(crate) fn mark_published(&self, asks: &Arc<Asks>, key: u64) -> bool {
        matches!(self.origin, Origin::Agent { .. }) && self.published.set((asks.clone(), key)).is_ok()
    }

    /// Tells the other replicas it was published to (but `except`) that it is settled.
    fn unpublish(&self, except: Option<&str>) {
        if let Some((asks, key)) = self.published.get() {
            asks.unpublish(*key, except);
        }
    }

    /// The frame for the agent that asked, with its process (an [`Origin::Agent`] request).
    fn for_agent(&self, frame: impl FnOnce(&str) -> String) -> Option<(Arc<AgentProcess>, String)> {
        match &self.origin {
            Origin::Agent { process, agent_id } => process.upgrade().map(|p| (p, frame(agent_id.get()))),
            Origin::Replica { .. } => None,
        }
    }

    /// Whether `client` has been asked it.
    pub(crate) fn was_asked(&self, client: &Client) -> bool {
        self.asked.lock().iter().any(|(c, _)| std::ptr::eq(c.as_ptr(), client))
    }

    /// Whether it has been answered or given up on.
    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Asks `targets` (each under an id of its own connection). Never waits.
    pub(crate) fn ask(self: &Arc<Self>, targets: &[Arc<Client>]) {
        for client in targets {
            if self.is_done() {
                return;
            }
            let out_id = self.assign(client);
            self.send_to(client, out_id);
        }
    }

    /// Records that `client` is asked, under an id of its own connection, before the request is
    /// sent to it ([`AgentRequest::send_to`]): a client that leaves meanwhile is a client gone
    /// like any other asked one.
    pub(crate) fn assign(self: &Arc<Self>, client: &Arc<Client>) -> u64 {
        let out_id = client.ask(self.clone());
        self.asked.lock().push((Arc::downgrade(client), out_id));
        out_id
    }

    /// Sends the request to `client` under `out_id` (from [`AgentRequest::assign`]), unless it
    /// has been settled meanwhile.
    pub(crate) fn send_to(&self, client: &Client, out_id: u64) {
        if self.is_done() {
            return;
        }
        client
            .outbox
            .push(Utf8Bytes::from(protocol::request(out_id, &self.method, &self.params)));
        crate::infra::metrics::message_out(crate::infra::metrics::Peer::Client, &self.method, 1);
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

    /// `from` answered: the first answer goes to the agent (or back to the replica that asked),
    /// the other clients are told (here and on the other replicas asked).
    pub async fn answer(&self, from: &Client, result: Option<&RawValue>, error: Option<&RawValue>) {
        if !self.settle() {
            return;
        }
        self.tell_others(Some(from));
        if let Origin::Replica { asks, from, key } = &self.origin {
            asks.answer_to(from, *key, result, error).await;
            return;
        }
        self.unpublish(None);
        self.to_agent(result, error).await;
    }

    /// A client of replica `replica` answered first (this replica's agent asked): the answer
    /// goes to the agent; the clients here and on the other replicas asked are told.
    pub async fn answer_remote(&self, replica: &str, result: Option<&RawValue>, error: Option<&RawValue>) {
        if !self.settle() {
            return;
        }
        self.tell_others(None);
        self.unpublish(Some(replica));
        self.to_agent(result, error).await;
    }

    /// Another replica's request asked here was settled there: the clients here are told.
    pub fn settled_elsewhere(&self) {
        if self.settle() {
            self.tell_others(None);
        }
    }

    /// Sends a client's answer to the agent that asked.
    async fn to_agent(&self, result: Option<&RawValue>, error: Option<&RawValue>) {
        let sent = self.for_agent(|id| match (result, error) {
            (Some(r), _) => protocol::response(id, r.get()),
            (None, Some(e)) => protocol::error_passthrough(id, e.get()),
            (None, None) => protocol::error(Some(id), &RpcError::internal("client sent an empty response")),
        });
        if let Some((p, frame)) = sent {
            let _ = p.send_line(frame).await;
        }
    }

    /// Sends `$/cancel_request` to every client asked (but `except`).
    fn tell_others(&self, except: Option<&Client>) {
        let asked: Vec<(Weak<Client>, u64)> = self.asked.lock().drain(..).collect();
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
            crate::infra::metrics::message_out(crate::infra::metrics::Peer::Client, "$/cancel_request", 1);
        }
    }

    /// A client that was asked has left: if no one else can answer, wait for the next client.
    pub fn client_gone(self: &Arc<Self>, gone: &Client) {
        if self.is_done() {
            return;
        }
        let anyone_left = {
            let mut asked = self.asked.lock();
            asked.retain(|(c, _)| c.upgrade().is_some_and(|c| !std::ptr::eq(&*c, gone) && !c.is_closed()));
            !asked.is_empty()
        };
        if !anyone_left && let Some(session) = self.session.upgrade() {
            session.dispatch_agent_request(self.clone());
        }
    }

    /// No client answered in time: a permission request is answered `cancelled`, anything else
    /// with an error; the clients asked are told (and the other replicas asked). Another
    /// replica's request only stops being asked here: its own replica answers the agent.
    pub(crate) async fn give_up(&self) {
        if !self.settle() {
            return;
        }
        tracing::info!(method = %self.method, "no client answered the agent's request in time");
        self.tell_others(None);
        self.unpublish(None);
        let (permission, elicitation) = (
            self.method == crate::protocol::method::agent::REQUEST_PERMISSION,
            self.is_elicitation(),
        );
        let sent = self.for_agent(|id| {
            if permission {
                protocol::response(id, r#"{"outcome":{"outcome":"cancelled"}}"#)
            } else if elicitation {
                // What the spec answers when the user dismissed it without choosing.
                protocol::response(id, r#"{"action":"cancel"}"#)
            } else {
                protocol::error(Some(id), &RpcError::internal("no client answered this request in time"))
            }
        });
        if let Some((p, frame)) = sent {
            let _ = p.send_line(frame).await;
        }
    }
}
