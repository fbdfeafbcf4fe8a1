//! What the gateway does with each message a client sends: the methods it answers itself
//! (`initialize`, `session/new|load|resume|list|close|delete`) and the ones it forwards to the
//! session's agent process after checking the session belongs to the caller. The session
//! lifecycle methods are in [`lifecycle`], the handling of answers that change a session's
//! controls in [`controls`].

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};

use axum::extract::ws::Utf8Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::Instrument;

use super::parse_or_answer;
use super::request::{self, ClientRequest};
use crate::gateway::Gateway;
use agent_client_protocol_schema::v1::NewSessionRequest;

use crate::agents::pool::{AgentPool, AgentProcess, Pending, SessionRoute};
use crate::protocol::{self, Incoming, Kind, RpcError, codes};
use crate::session::{Client, Controls, LiveSession};
use crate::usage::quota::CAP_REACHED;

mod attach;
mod controls;
mod fork;
mod forward;
mod lifecycle;
mod queue;
mod withheld;

use crate::protocol::method::ClientMethod;
use controls::ControlsAnswer;

/// Per-connection dispatch state.
pub struct Connection {
    /// Shared gateway state.
    gw: Gateway,
    /// The client, as sessions see it.
    client: Arc<Client>,
    /// The agent this connection talks to (`?agent=`).
    pool: Arc<AgentPool>,
    /// Whether `initialize` has been answered: nothing else is served before it.
    initialized: bool,
    /// Requests in flight on this connection, forwarded ones until the agent answers.
    inflight: Arc<Semaphore>,
    /// What the connection remembers for later requests and for its end.
    tracked: Arc<Tracked>,
}

/// Where a forwarded request went: the process and the id the gateway used there.
type ForwardedTo = (Weak<AgentProcess>, u64);

/// A connection's bookkeeping, shared with its spawned handlers.
#[derive(Default)]
struct Tracked {
    /// Requests forwarded to agents, by the client's raw id: where they went and under which id
    /// (for `$/cancel_request`). Pruned of answered ones as it grows.
    forwarded: Mutex<HashMap<Box<str>, ForwardedTo>>,
    /// Sessions it is attached to (detached when it ends).
    sessions: Mutex<HashSet<Arc<str>>>,
}

/// Most `additionalDirectories` a session may have (they are stored and listed).
const MAX_ADDITIONAL_DIRECTORIES: usize = 32;

/// Forwarded-request entries kept before answered ones are pruned.
const FORWARDED_PRUNE_AT: usize = 64;

impl Tracked {
    fn remember_forwarded(&self, client_id: &str, process: &Arc<AgentProcess>, agent_id: u64) {
        let mut map = self.forwarded.lock();
        if map.len() >= FORWARDED_PRUNE_AT {
            map.retain(|_, (p, id)| p.upgrade().is_some_and(|p| p.is_pending(*id)));
        }
        map.insert(client_id.into(), (Arc::downgrade(process), agent_id));
    }

    fn forwarded(&self, client_id: &str) -> Option<(Arc<AgentProcess>, u64)> {
        let map = self.forwarded.lock();
        let (process, id) = map.get(client_id)?;
        process.upgrade().filter(|p| p.is_pending(*id)).map(|p| (p, *id))
    }

    fn attached(&self, session: &Arc<str>) {
        self.sessions.lock().insert(session.clone());
    }

    fn is_attached(&self, session: &str) -> bool {
        self.sessions.lock().contains(session)
    }

    fn left(&self, session: &str) {
        self.sessions.lock().remove(session);
    }
}

/// What a handler produced.
pub(super) enum Reply {
    /// Answer with this result (raw JSON).
    Result(String),
    /// The agent will answer (forwarded).
    Forwarded,
    /// The handler has sent the answer itself (`session/new`: before what the agent said next).
    Answered,
}

pub(super) type Handled = Result<Reply, RpcError>;

/// `initialize`'s params as the ACP schema has them: an object whose `protocolVersion` is an
/// integer (the version the client speaks; the answer says the one this gateway speaks, 1).
fn check_initialize(params: Option<&RawValue>) -> Result<(), RpcError> {
    #[derive(Deserialize)]
    struct Params {
        #[serde(rename = "protocolVersion")]
        _protocol_version: u16,
    }
    match params.map(|p| serde_json::from_str::<Params>(p.get())) {
        Some(Ok(_)) => Ok(()),
        _ => Err(RpcError::invalid_params(
            "initialize needs params with protocolVersion, an integer (this gateway speaks 1)",
        )),
    }
}

impl Connection {
    /// Dispatch state for a new connection.
    pub fn new(gw: Gateway, client: Arc<Client>, pool: Arc<AgentPool>) -> Self {
        let inflight = Arc::new(Semaphore::new(gw.config.limits.max_inflight_per_connection));
        Self {
            gw,
            client,
            pool,
            initialized: false,
            inflight,
            tracked: Arc::default(),
        }
    }

    /// Handles one text frame.
    pub async fn on_text(&mut self, text: &str) {
        let Some((msg, kind)) = parse_or_answer(&self.client, text).await else {
            return;
        };
        if kind != Kind::Response {
            crate::infra::metrics::message_in(crate::infra::metrics::Peer::Client, msg.method());
        }
        match kind {
            Kind::Response => self.on_response(&msg).await,
            Kind::Notification => self.on_notification(&msg).await,
            Kind::Request => self.on_request(&msg).await,
        }
    }

    /// Resolves once the gateway is draining and nothing this connection asked is in flight any
    /// more: every request answered, forwarded ones by the agent, and those answers queued for
    /// the client (an answer follows its session's updates, which are then stored).
    pub fn drained(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let gw = self.gw.clone();
        let inflight = self.inflight.clone();
        let every = u32::try_from(gw.config.limits.max_inflight_per_connection).unwrap_or(u32::MAX);
        async move {
            gw.life.drain.cancelled().await;
            // Every request holds one of these slots until it is answered.
            let _idle = inflight.acquire_many(every).await;
            gw.sessions.flush().await;
        }
    }

    /// Cleans up after the connection: detaches its sessions, hands its unanswered agent requests
    /// to other clients (or keeps them waiting).
    pub fn finish(&mut self) {
        let sessions: Vec<Arc<str>> = self.tracked.sessions.lock().drain().collect();
        for id in sessions {
            // Only sessions it was let into are tracked (its own, or shared with it).
            if let Some(s) = self.gw.sessions.any_live(&id) {
                s.detach(&self.client);
            }
        }
        for request in self.client.take_all_asked() {
            request.client_gone(&self.client);
        }
    }

    async fn on_response(&self, msg: &Incoming<'_>) {
        let Some(id) = msg.id.and_then(protocol::own_id) else {
            return;
        };
        match self.client.take_asked(id) {
            Some(settle) => settle.answer(&self.client, msg.result, msg.error).await,
            None => {
                tracing::debug!(connection = %self.client.id, id, "answer to no pending request (settled elsewhere?)")
            }
        }
    }

    async fn on_notification(&self, msg: &Incoming<'_>) {
        if !self.initialized {
            return;
        }
        match msg.method() {
            "session/cancel" => {
                let Some(sid) = protocol::session_id_of(msg.params) else {
                    return;
                };
                let Some(session) = self.cancellable(&sid).await else {
                    return;
                };
                if !session.is_bound_now()
                    && let Some(params) = msg.params
                {
                    super::remote::cancel(&self.gw, &self.client, &session, params).await;
                    return;
                }
                let keep = self
                    .gw
                    .agents
                    .pools
                    .get(&session.agent)
                    .map(|p| p.config().forward_meta.as_slice());
                if let (Some(b), Some(params), Some(keep)) = (session.binding(), msg.params, keep)
                    && let Some(params) = protocol::rewrite_params(params, Some(&b.agent_session_id), Some(keep))
                {
                    crate::infra::metrics::message_out(crate::infra::metrics::Peer::Agent, "session/cancel", 1);
                    let _ = b
                        .process
                        .send_line(protocol::notification("session/cancel", &params))
                        .await;
                }
            }
            "$/cancel_request" => {
                #[derive(Deserialize)]
                struct P<'a> {
                    #[serde(rename = "requestId", borrow)]
                    request_id: &'a RawValue,
                }
                let Some(p) = msg.params.and_then(|p| serde_json::from_str::<P<'_>>(p.get()).ok()) else {
                    return;
                };
                if let Some((process, agent_id)) = self.tracked.forwarded(p.request_id.get()) {
                    process.cancel_request(agent_id).await;
                }
            }
            // The web UI: which session this page shows in a visible tab (no push for it).
            crate::protocol::method::ext::VISIBILITY => {
                let shown = msg
                    .params
                    .and_then(|p| serde_json::from_str::<Value>(p.get()).ok())
                    .and_then(|p| p.get("sessionId").and_then(Value::as_str).map(str::to_string));
                self.client.show(shown.as_deref());
            }
            other => {
                tracing::debug!(connection = %self.client.id, method = other, "client notification ignored")
            }
        }
    }

    /// The session a `session/cancel` may stop: the caller's own, or one shared with them as a
    /// controller (an observer's cancel is audited and ignored: it is a notification).
    async fn cancellable(&self, sid: &str) -> Option<Arc<LiveSession>> {
        if let Some(session) = self.gw.sessions.live(&self.client.user, sid) {
            return Some(session);
        }
        // Only a session in memory here can be running a turn to stop: nothing else is looked up.
        let session = self.gw.sessions.any_live(sid)?;
        let access = self.gw.shares.access(&self.client.user, sid).await.ok().flatten()?;
        if crate::sharing::Role::of(&access.role) != crate::sharing::Role::Controller {
            self.gw.audit.record(crate::audit::Event {
                actor: &self.client.user,
                action: "share_refused",
                target: Some(sid),
                outcome: "refused",
                detail: Some(json!({ "method": "session/cancel", "share": access.share_id })),
                connection: Some(&self.client.id),
                client: self.client.addr(),
            });
            return None;
        }
        Some(session)
    }

    /// A request, in a span of its own when traces are on.
    async fn on_request(&mut self, msg: &Incoming<'_>) {
        if crate::infra::traces::enabled() {
            let span = crate::infra::traces::client_request(
                msg.method(),
                &self.client.id,
                &self.client.user,
                msg.params.map(RawValue::get),
            );
            return self.handle_request(msg).instrument(span).await;
        }
        self.handle_request(msg).await
    }

    async fn handle_request(&mut self, msg: &Incoming<'_>) {
        let Some(id) = msg.id else { return };
        // A draining connection only waits for what it has in flight (its answers to the
        // agent's requests are responses, and `session/cancel` a notification: both still pass).
        if self.gw.life.is_draining() {
            let err = RpcError::internal("the gateway is shutting down; reconnect and resume with session/load")
                .with_data(json!({ "reason": "shutting_down" }));
            answer(&self.client, id.get(), Err(err)).await;
            return;
        }
        if !self.initialized {
            let reply = if msg.method() == "initialize" {
                let r = match check_initialize(msg.params) {
                    Ok(()) => self.initialize().await,
                    Err(e) => Err(e),
                };
                self.initialized = r.is_ok();
                r
            } else {
                Err(request::not_initialized())
            };
            answer(&self.client, id.get(), reply).await;
            return;
        }
        if let Err(cap) = self.gw.agents.quotas.request(&self.client.user) {
            self.gw
                .audit
                .cap_refused(&self.client.user, cap.cap, Some(&self.client.id), self.client.addr());
            answer(&self.client, id.get(), Err(cap.rpc())).await;
            return;
        }
        let request = match request::parse(msg.method(), msg.params) {
            Ok(request) => request,
            Err(e) => {
                answer(&self.client, id.get(), Err(e)).await;
                return;
            }
        };
        // Every request holds a slot while it is handled, a forwarded one until the agent answers.
        let Ok(slot) = self.inflight.clone().try_acquire_owned() else {
            let limit = self.gw.config.limits.max_inflight_per_connection;
            crate::infra::metrics::cap_hit("requests_in_flight");
            self.gw.audit.cap_refused(
                &self.client.user,
                "requests_in_flight",
                Some(&self.client.id),
                self.client.addr(),
            );
            let err = RpcError::new(
                CAP_REACHED,
                "too many requests in flight on this connection; try again later",
            )
            .with_data(json!({ "cap": "requests_in_flight", "limit": limit }));
            answer(&self.client, id.get(), Err(err)).await;
            return;
        };
        let ctx = Ctx {
            gw: self.gw.clone(),
            client: self.client.clone(),
            pool: self.pool.clone(),
            tracked: self.tracked.clone(),
        };
        // A request for a session that is live on a process is forwarded right here: nothing in
        // it waits on a client or an agent, and a prompt's round trip is one task handoff shorter.
        if matches!(request, ClientRequest::Forward { .. }) && request.session_id().is_some_and(|s| self.is_live(s)) {
            let reply = ctx.handle(request, id, slot).await;
            answer(&self.client, id.get(), reply).await;
            return;
        }
        // Everything else runs beside the read loop, so a slow agent or database never stops the
        // connection from reading.
        let id = id.to_owned();
        let span = if crate::infra::traces::enabled() {
            tracing::Span::current()
        } else {
            tracing::Span::none()
        };
        self.gw.life.tracker.spawn(
            async move {
                let reply = ctx.handle(request, &id, slot).await;
                answer(&ctx.client, id.get(), reply).await;
            }
            .instrument(span),
        );
    }

    /// Whether `session` is this user's and on a live agent process now.
    fn is_live(&self, session: &str) -> bool {
        self.gw
            .sessions
            .live(&self.client.user, session)
            .is_some_and(|s| s.is_bound_now())
    }

    async fn initialize(&self) -> Handled {
        let user = &self.client.user;
        let info = self.pool.info_for(user).await?;
        self.pool.prewarm(user);
        let roots: Vec<String> = self
            .gw
            .agents
            .tenancy
            .roots(user)
            .map(|roots| roots.iter().map(|r| r.to_string_lossy().into_owned()).collect())
            .unwrap_or_else(|e| {
                tracing::warn!(user = %user, error = %e, "cannot set up the user's workspace roots");
                Vec::new()
            });
        let mut caps = info.capabilities.clone();
        caps.insert("loadSession".into(), Value::Bool(true));
        let mut session_caps = caps
            .get("sessionCapabilities")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        for cap in ["list", "resume", "close", "delete", "fork"] {
            session_caps.insert(cap.into(), json!({}));
        }
        caps.insert("sessionCapabilities".into(), Value::Object(session_caps));
        let result = json!({
            "protocolVersion": 1,
            "agentCapabilities": caps,
            "authMethods": info.auth_methods.clone().unwrap_or_else(|| json!([])),
            "agentInfo": info.agent_info.clone().unwrap_or_else(|| json!({"name": &*self.pool.name, "version": "unknown"})),
            "_meta": { "gateway": {
                "connectionId": &*self.client.id,
                "attachmentBytes": self.gw.config.limits.attachment_bytes,
                "user": &*self.client.user,
                "agent": &*self.pool.name,
                "version": env!("CARGO_PKG_VERSION"),
                "workspaceRoots": roots,
            }},
        });
        Ok(Reply::Result(result.to_string()))
    }
}

/// Sends a handler's outcome (waiting for room: it is the client's own answer).
async fn answer(client: &Client, id: &str, reply: Handled) {
    let frame = match reply {
        Ok(Reply::Forwarded | Reply::Answered) => return,
        Ok(Reply::Result(result)) => protocol::response(id, &result),
        Err(e) => protocol::error(Some(id), &e),
    };
    client.outbox.send(Utf8Bytes::from(frame)).await;
}

/// What a handler needs.
pub(super) struct Ctx {
    gw: Gateway,
    client: Arc<Client>,
    pool: Arc<AgentPool>,
    tracked: Arc<Tracked>,
}

impl Ctx {
    /// A handler context for `client` (a stand-in for another replica's client: never attached).
    pub(super) fn stand_in(gw: Gateway, client: Arc<Client>, pool: Arc<AgentPool>) -> Self {
        Self {
            gw,
            client,
            pool,
            tracked: Arc::default(),
        }
    }
}

impl Ctx {
    async fn handle(&self, request: ClientRequest, id: &RawValue, slot: OwnedSemaphorePermit) -> Handled {
        match request {
            ClientRequest::Initialize => Err(RpcError::new(codes::INVALID_REQUEST, "already initialized")),
            ClientRequest::Authenticate(params) => {
                super::signin::authenticate(&self.gw, &self.client, &self.pool, &params).await
            }
            ClientRequest::AuthStatus(params) => super::signin::status(&self.client, &self.pool, &params).await,
            ClientRequest::New(new) => self.new_session(*new, id).await,
            ClientRequest::Fork(params) => self.fork(&params, id).await,
            ClientRequest::Load {
                session_id,
                cwd,
                additional_dirs,
                after_seq,
                replay,
            } => {
                self.load(&session_id, cwd.as_deref(), &additional_dirs, after_seq, replay)
                    .await
            }
            ClientRequest::Attach {
                session_id,
                role,
                history,
                after_seq,
            } => self.attach_session(&session_id, role, history, after_seq).await,
            ClientRequest::Detach { session_id } => self.detach_session(&session_id),
            ClientRequest::List(params) => {
                let params = params.as_deref().map_or("{}", RawValue::get);
                let result = self.gw.sessions.list_raw(&self.client.user, params).await?;
                Ok(Reply::Result(result.to_string()))
            }
            ClientRequest::Close { session_id, delete } => self.close(&session_id, delete).await,
            ClientRequest::Forward {
                method,
                session_id,
                params,
                prompt,
            } => {
                self.forward(&method, id, &session_id, &params, prompt.as_deref(), slot)
                    .await
            }
        }
    }

    /// The caller's session `sid`, loaded into memory if needed; unknown and foreign ids get
    /// the same `-32002`.
    async fn owned(&self, sid: &str) -> Result<Arc<LiveSession>, RpcError> {
        self.gw.sessions.owned(&self.client.user, sid).await
    }

    /// `cwd` and `additionalDirectories` resolved inside the caller's workspace roots, as the
    /// agent will be given them; `-32602` naming the roots otherwise.
    fn workspace_dirs(&self, cwd: Option<&str>, dirs: &[String]) -> Result<(Option<String>, Vec<String>), RpcError> {
        let resolve = |path: &str| {
            self.gw
                .agents
                .tenancy
                .resolve(&self.client.user, path)?
                .into_os_string()
                .into_string()
                .map_err(|_| RpcError::invalid_params(format!("{path:?} resolves to a path that is not UTF-8")))
        };
        let cwd = cwd.map(resolve).transpose()?;
        let dirs = dirs.iter().map(|d| resolve(d)).collect::<Result<_, _>>()?;
        Ok((cwd, dirs))
    }

    fn pool_of(&self, session: &LiveSession) -> Option<Arc<AgentPool>> {
        self.gw.agents.pools.get(&session.agent).cloned()
    }
}
