//! One session known to this gateway process: its sequence, its clients, the agent process that
//! serves it.
//!
//! The publish path, in the order an update takes it:
//! 1. [`LiveSession::publish`] numbers the update and queues it for the transcript writer, under
//!    `numbering` (so `seq` order is storage order). It waits only for the writer's queue: the
//!    database's pace.
//! 2. The writer commits a batch and calls [`Committed::committed`]; only then are the updates
//!    handed to the attached clients' outboxes. That never waits: a client whose outbox is full
//!    is closed with `1013` and catches up with `afterSeq`. Whatever a client saw is stored.
//! 3. What must follow those updates (the answer to a client's prompt, an agent's permission
//!    request) waits in `deferred` until everything numbered before it is released.
//!
//! No lock here is held across an await on anything a client or an agent controls.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use agent_client_protocol_schema::v1::McpServer;
use axum::extract::ws::Utf8Bytes;
use serde_json::value::RawValue;

use super::client::Client;
use super::controls::Controls;
use super::requests::AgentRequest;
use crate::outbox::{CLOSE_TOO_SLOW, Outbox};
use crate::pool::{AgentProcess, Pools, SessionRoute};
use crate::protocol::{self, RpcError};
use crate::store::persister::{Committed, Item, Persister};
use crate::store::{SessionRecord, Store, now_micros};

/// How many transcript chunks a replay reads per query (memory stays flat).
const REPLAY_PAGE_CHUNKS: u32 = 4;
/// Longest title made from a prompt.
const TITLE_CHARS: usize = 100;

/// The agent process a session runs on.
#[derive(Debug, Clone)]
pub struct Binding {
    /// Where prompts go.
    pub process: Arc<AgentProcess>,
    /// The agent's id for the session (what the process's messages name).
    pub agent_session_id: Arc<str>,
    /// When it was put on the process (epoch µs).
    pub since: i64,
}

/// A client attached to the session.
struct Subscriber {
    client: Arc<Client>,
    /// The highest seq it has been given (by replay or live): a commit notice that comes after
    /// a replay already read the same updates from the store repeats nothing.
    sent_up_to: u64,
    /// While the client replays the stored transcript: live updates released meanwhile, kept
    /// (bounded) until the replay has caught up with them.
    replaying: Option<Caught>,
}

/// Live updates held for a replaying client.
#[derive(Default)]
struct Caught {
    frames: Vec<(u64, Utf8Bytes)>,
    bytes: usize,
}

/// The error of a request whose session's transcript can no longer be stored.
pub const LOST: &str = "this session's transcript can no longer be stored (the database refuses its writes), so nothing more of it can be shown; start a new session";

/// What waits for the updates numbered before it to be released.
enum Deferred {
    /// An agent's answer (the frame) to a client's request (the id).
    Respond(Outbox, Box<RawValue>, Utf8Bytes),
    /// An agent's request to the session's clients.
    Ask(Arc<AgentRequest>),
}

/// What clients get, under a short, never-awaited lock.
#[derive(Default)]
struct Fanout {
    /// Highest seq handed to clients (everything up to it is stored).
    released: u64,
    /// Numbered, queued for the writer, not yet committed.
    unreleased: VecDeque<(u64, Utf8Bytes)>,
    subscribers: Vec<Subscriber>,
    /// Waiting for `released` to reach the seq it was filed under.
    deferred: VecDeque<(u64, Deferred)>,
    /// Agent requests waiting for a client to attach.
    waiting: Vec<Arc<AgentRequest>>,
    /// The transcript writer gave up on this session: nothing more is released.
    lost: bool,
}

impl Fanout {
    /// Hands one released update to every subscriber; drops those it closed.
    fn deliver(&mut self, seq: u64, frame: &Utf8Bytes, catch_up_bytes: usize) {
        self.subscribers.retain_mut(|sub| match &mut sub.replaying {
            _ if seq <= sub.sent_up_to => true,
            Some(caught) => {
                if caught.bytes + frame.len() > catch_up_bytes {
                    if sub
                        .client
                        .outbox
                        .close(CLOSE_TOO_SLOW, "replay too slow; reconnect and resume with afterSeq")
                    {
                        metrics::counter!(crate::metrics::SLOW_CLIENTS_DROPPED).increment(1);
                    }
                    return false;
                }
                caught.bytes += frame.len();
                caught.frames.push((seq, frame.clone()));
                true
            }
            None => {
                sub.sent_up_to = seq;
                let pushed = sub.client.outbox.push(frame.clone());
                if pushed {
                    crate::metrics::message_out(crate::metrics::Peer::Client, "session/update", 1);
                }
                pushed
            }
        });
    }

    /// Whether what is filed now can go at once (nothing numbered before it is unreleased).
    fn caught_up(&self, assigned: u64) -> bool {
        self.released >= assigned && self.deferred.is_empty()
    }
}

/// One session known to this gateway process.
pub struct LiveSession {
    /// Gateway session id.
    pub id: Arc<str>,
    /// The user it belongs to: every method that names it checks this.
    pub owner: Arc<str>,
    /// The configured agent that serves it.
    pub agent: Arc<str>,
    /// Working directory, as resolved at creation (restores pass it again).
    pub cwd: String,
    /// `additionalDirectories`, JSON array, as resolved at creation.
    pub additional_dirs: String,
    /// The `mcpServers` accepted at creation, JSON array (restores re-check and pass them).
    pub mcp_servers: String,
    /// `id` as a JSON string literal, escaped once for every frame.
    id_json: Box<str>,
    /// `acp_gateway_updates_total`, looked up once.
    updates_total: metrics::Counter,
    /// Time from a prompt to the agent's first update (`acp_gateway_prompt_first_update_seconds`).
    first_update: crate::metrics::FirstUpdate,
    /// The transcript writer.
    persister: Persister,
    /// How long an agent's request may wait for an answer.
    permission_wait: Duration,
    /// Where `usage_update` costs are recorded.
    usage: Option<Arc<crate::usage::Usage>>,
    /// Agent requests asked across replicas, when several share the database.
    asks: Option<Arc<super::asks::Asks>>,
    /// How many bytes of live updates a replaying client may fall behind by.
    catch_up_bytes: usize,
    /// Itself, for the writer's commit notices.
    me: Weak<LiveSession>,
    /// Held while numbering and queueing updates, so `seq` order is storage order.
    numbering: tokio::sync::Mutex<()>,
    /// Highest seq given out (or reserved for a prompt being recorded).
    assigned: AtomicU64,
    /// What clients get.
    fanout: Mutex<Fanout>,
    /// The process serving it, if any.
    binding: Mutex<Option<Binding>>,
    /// The agent's last known id for the session (kept across process deaths for restore).
    agent_session_id: Mutex<Option<Arc<str>>>,
    /// The agent's modes, config options and models as this replica last knew them: current
    /// while the session is served here (see [`LiveSession::controls_json`]).
    controls: Mutex<Controls>,
    /// Whether `controls` holds what the store does (or newer): read from it, or set here.
    controls_known: std::sync::atomic::AtomicBool,
    /// Whether other replicas share the database, and may change the stored controls.
    replicated: bool,
    /// One restore at a time; held across the agent's answer, so nothing else takes it.
    restoring: tokio::sync::Mutex<()>,
    /// One read of updates another replica committed at a time (see [`LiveSession::catch_up`]).
    catching_up: tokio::sync::Mutex<()>,
    /// Highest seq another replica said it committed.
    committed_elsewhere: AtomicU64,
    /// Whether a catch-up task is under way or due (notices that arrive meanwhile join it).
    catch_up_due: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for LiveSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveSession")
            .field("id", &self.id)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

/// How a session is set up in memory.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// The transcript writer.
    pub persister: Persister,
    /// How long an agent's request may wait for an answer.
    pub permission_wait: Duration,
    /// How many bytes of live updates a replaying client may fall behind by.
    pub catch_up_bytes: usize,
    /// This replica's leases and bus, when several share a Postgres database.
    pub replica: Option<Arc<crate::replica::Replica>>,
    /// Agent requests asked across replicas (with `replica`).
    pub asks: Option<Arc<super::asks::Asks>>,
    /// What each person spends (`usage_update` costs).
    pub usage: Option<Arc<crate::usage::Usage>>,
}

impl LiveSession {
    /// A session as stored, not yet on any process.
    pub fn from_record(r: &SessionRecord, options: &SessionOptions) -> Arc<Self> {
        let mcp_servers = serde_json::from_str::<serde_json::Value>(&r.meta)
            .ok()
            .and_then(|m| m.get("mcpServers").map(ToString::to_string))
            .unwrap_or_else(|| String::from("[]"));
        let mut id_json = String::new();
        protocol::push_json_str(&mut id_json, &r.id);
        let last_seq = u64::try_from(r.last_seq).unwrap_or(0);
        Arc::new_cyclic(|me| Self {
            id_json: id_json.into(),
            updates_total: metrics::counter!(crate::metrics::UPDATES),
            first_update: crate::metrics::FirstUpdate::new(&r.agent),
            id: Arc::from(r.id.as_str()),
            owner: Arc::from(r.owner.as_str()),
            agent: Arc::from(r.agent.as_str()),
            cwd: r.cwd.clone(),
            additional_dirs: r.additional_dirs.clone(),
            mcp_servers,
            persister: options.persister.clone(),
            permission_wait: options.permission_wait,
            asks: options.asks.clone(),
            usage: options.usage.clone(),
            catch_up_bytes: options.catch_up_bytes,
            me: me.clone(),
            numbering: tokio::sync::Mutex::new(()),
            assigned: AtomicU64::new(last_seq),
            fanout: Mutex::new(Fanout {
                released: last_seq,
                ..Default::default()
            }),
            binding: Mutex::new(None),
            agent_session_id: Mutex::new(r.agent_session_id.as_deref().map(Arc::from)),
            controls: Mutex::default(),
            controls_known: std::sync::atomic::AtomicBool::new(false),
            replicated: options.replica.is_some(),
            restoring: tokio::sync::Mutex::new(()),
            catching_up: tokio::sync::Mutex::new(()),
            committed_elsewhere: AtomicU64::new(last_seq),
            catch_up_due: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn fanout(&self) -> MutexGuard<'_, Fanout> {
        self.fanout.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_binding(&self) -> MutexGuard<'_, Option<Binding>> {
        self.binding.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_controls(&self) -> MutexGuard<'_, Controls> {
        self.controls.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The agent's controls as `session/load` answers them (a JSON object). Current while the
    /// session is served here, or when [`LiveSession::controls_need_store`] says so.
    pub fn controls_json(&self) -> String {
        self.lock_controls().to_json()
    }

    /// Whether the store may hold newer controls than this replica: it never read them, or
    /// (when other replicas share the database and it does not serve the session now) another
    /// replica may have changed them.
    pub fn controls_need_store(&self) -> bool {
        !self.controls_known.load(Ordering::Acquire) || (self.replicated && !self.is_bound_now())
    }

    /// Takes what the store holds.
    pub fn stored_controls(&self, stored: &str) {
        *self.lock_controls() = Controls::from_result(stored);
        self.controls_known.store(true, Ordering::Release);
    }

    /// Changes the controls with `change` (which says whether it changed anything) and, if it
    /// did, stores them.
    pub async fn change_controls(&self, change: impl FnOnce(&mut Controls) -> bool) {
        if !self.change_controls_now(change) {
            return;
        }
        if self.replicated {
            self.store_controls_now().await;
        } else {
            self.store_controls_in_order().await;
        }
    }

    /// Changes the controls in memory only (the caller stores them with
    /// [`LiveSession::store_controls_in_order`]); whether `change` changed anything.
    pub fn change_controls_now(&self, change: impl FnOnce(&mut Controls) -> bool) -> bool {
        let changed = change(&mut self.lock_controls());
        self.controls_known.store(true, Ordering::Release);
        changed
    }

    /// Queues the controls as they are now for the writer.
    pub async fn store_controls_in_order(&self) {
        let _numbering = self.numbering.lock().await;
        self.store_controls().await;
    }

    /// After a restore: an agent that forgot the mode, config options or model the user chose
    /// (a new process starts with its defaults) is put back to them, so the pickers the user sees
    /// are what the agent does; what it refuses, or says otherwise, is taken as it is.
    async fn reapply_controls(&self, process: &AgentProcess, agent_sid: &str, answer: &RawValue, timeout: Duration) {
        let mut agent = Controls::from_result(answer.get());
        if agent.is_empty() {
            return;
        }
        let wanted = self.lock_controls().clone();
        for (method, params) in wanted.reapply(&agent, agent_sid) {
            match process.request(method, &params, timeout).await {
                Ok(result) => {
                    agent.apply_answer(method, &params, result.get());
                }
                Err(e) => {
                    tracing::info!(session = %self.id, method, error = %e, "restored agent kept its own setting")
                }
            }
        }
        self.change_controls(|c| c.merge(agent)).await;
    }

    /// Whether other replicas read this session's controls from the store.
    pub fn replicated(&self) -> bool {
        self.replicated
    }

    /// Stores the controls as they are now and waits until they are written (at most the
    /// writer's flush timeout), so other replicas read what this one answered.
    pub async fn store_controls_now(&self) {
        self.store_controls_in_order().await;
        if let Err(e) = self.persister.flush().await {
            tracing::warn!(session = %self.id, error = %e, "session controls not yet stored");
        }
    }

    /// Queues the controls for the writer. Called under `numbering`, and the controls are read
    /// there, so the writer gets them in the order they changed (the last write is the newest).
    async fn store_controls(&self) {
        let controls = self.controls_json();
        self.persister
            .send(Item::Controls {
                session: self.id.clone(),
                controls,
            })
            .await;
    }

    /// Binds the session to a process that already knows it (right after `session/new`).
    /// Refused when the process already routes that agent session id to another session.
    pub fn bind(self: &Arc<Self>, process: Arc<AgentProcess>, agent_session_id: Arc<str>) -> Result<(), RpcError> {
        let route: Arc<dyn SessionRoute> = self.clone();
        if !process.bind_session(agent_session_id.clone(), route) {
            return Err(id_in_use());
        }
        *self.agent_session_id.lock().unwrap_or_else(|e| e.into_inner()) = Some(agent_session_id.clone());
        *self.lock_binding() = Some(Binding {
            process,
            agent_session_id,
            since: now_micros(),
        });
        Ok(())
    }

    /// Ends the binding (close/delete), returning it.
    pub fn take_binding(&self) -> Option<Binding> {
        let b = self.lock_binding().take();
        if let Some(b) = &b {
            b.process.unbind_session(&b.agent_session_id);
        }
        b
    }

    /// The current binding, if its process is alive.
    pub fn binding(&self) -> Option<Binding> {
        self.lock_binding().clone().filter(|b| !b.process.is_dead())
    }

    /// Whether the session is on a live process right now.
    pub fn is_bound_now(&self) -> bool {
        self.binding().is_some()
    }

    /// Whether the session can be dropped from memory: no clients, no process, nothing waiting,
    /// nothing unstored (so the database's `last_seq` is the session's).
    pub fn is_dormant(&self) -> bool {
        let idle = {
            let f = self.fanout();
            f.subscribers.iter().all(|s| s.client.is_closed())
                && f.waiting.is_empty()
                && f.unreleased.is_empty()
                && f.deferred.is_empty()
                && f.released == self.assigned.load(Ordering::Acquire)
        };
        idle && self.binding().is_none()
    }

    /// Numbers one update and queues it for the writer; clients get it once it is stored.
    async fn publish_raw(&self, update: &str, agent_meta: Option<&RawValue>) {
        let _numbering = self.numbering.lock().await;
        let seq = self.assigned.load(Ordering::Acquire) + 1;
        self.assigned.store(seq, Ordering::Release);
        self.enqueue(seq, update, agent_meta).await;
    }

    /// Queues update `seq` (caller holds `numbering`).
    async fn enqueue(&self, seq: u64, update: &str, agent_meta: Option<&RawValue>) {
        // One scan passes the bulk of a stream (message and thought chunks) by; the few kinds
        // that change the session are then told apart by name and parsed.
        if update.contains("_update\"") {
            if update.contains("\"session_info_update\"")
                && let Some(title) = info_update_title(update)
            {
                self.persister
                    .send(Item::AgentTitle {
                        session: self.id.clone(),
                        title,
                    })
                    .await;
            }
            if let Some(usage) = &self.usage {
                usage.observe(&self.owner, &self.agent, &self.id, update);
            }
            if (update.contains("\"current_mode_update\"") || update.contains("\"config_option_update\""))
                && self.controls_known.load(Ordering::Acquire)
                && self.lock_controls().apply_update(update)
            {
                self.store_controls().await;
            }
        }
        let frame = Utf8Bytes::from(protocol::session_update_raw_id(&self.id_json, update, seq, agent_meta));
        self.fanout().unreleased.push_back((seq, frame));
        let Some(me) = self.me.upgrade() else { return };
        self.persister
            .send(Item::Update {
                session: self.id.clone(),
                notify: me,
                seq,
                update: update.into(),
                at: now_micros(),
            })
            .await;
        self.updates_total.increment(1);
    }

    /// Records a prompt and sends it to the agent with `forward`, which must not wait. The
    /// user's prompt becomes `user_message_chunk` updates (one per content block, sharing a
    /// `messageId`), counts as a message, and titles an untitled session. Its seqs are reserved
    /// before the prompt is sent, so the agent's answer is delivered after them; a prompt the
    /// agent never got is not recorded.
    pub async fn forward_prompt<T>(
        &self,
        prompt: Option<&RawValue>,
        forward: impl FnOnce() -> Result<T, RpcError>,
    ) -> Result<T, RpcError> {
        let blocks: Vec<serde_json::Value> = prompt
            .and_then(|p| serde_json::from_str(p.get()).ok())
            .unwrap_or_default();
        let title = blocks
            .iter()
            .find_map(|b| b.get("text").and_then(serde_json::Value::as_str))
            .map(make_title);
        let _numbering = self.numbering.lock().await;
        if self.is_lost() {
            return Err(Self::lost_error());
        }
        let base = self.assigned.load(Ordering::Acquire);
        self.assigned.store(base + blocks.len() as u64, Ordering::Release);
        let sent = match forward() {
            Ok(sent) => sent,
            Err(e) => {
                self.assigned.store(base, Ordering::Release);
                return Err(e);
            }
        };
        self.first_update.prompt_sent();
        self.persister
            .send(Item::Prompt {
                session: self.id.clone(),
                title,
            })
            .await;
        // One `messageId` for the prompt's chunks: a replay shows two prompts in a row (the first
        // refused by the agent, say) as two messages.
        let message_id = uuid::Uuid::new_v4();
        for (seq, block) in (base + 1..).zip(blocks) {
            // Re-serialized compactly: a client's pretty-printed JSON must not span lines.
            let update =
                format!(r#"{{"sessionUpdate":"user_message_chunk","messageId":"{message_id}","content":{block}}}"#);
            self.enqueue(seq, &update, None).await;
        }
        Ok(sent)
    }

    /// Attaches `client` to live updates; with `replay`, first streams the stored transcript
    /// after `after_seq` (at the client's own pace), with nothing missed and nothing repeated in
    /// between. Agent requests waiting for a client are then asked of it.
    pub async fn attach(
        self: &Arc<Self>,
        client: &Arc<Client>,
        store: &dyn Store,
        replay: bool,
        after_seq: u64,
    ) -> Result<(), RpcError> {
        {
            let mut f = self.fanout();
            let present = f.subscribers.iter().any(|s| Arc::ptr_eq(&s.client, client));
            // A client that loads again starts its replay over.
            let reloading = |s: &Subscriber| replay && Arc::ptr_eq(&s.client, client);
            f.subscribers.retain(|s| !s.client.is_closed() && !reloading(s));
            if replay || !present {
                let sent_up_to = if replay { after_seq } else { f.released };
                f.subscribers.push(Subscriber {
                    client: client.clone(),
                    sent_up_to,
                    replaying: replay.then(Caught::default),
                });
            }
        }
        if replay {
            // Everything released before the subscription is stored, so the store has it;
            // everything released after is caught for the client meanwhile.
            let started = std::time::Instant::now();
            let cursor = match self.replay(client, store, after_seq).await {
                Ok(cursor) => {
                    metrics::histogram!(crate::metrics::REPLAY_SECONDS).record(crate::metrics::seconds_since(started));
                    cursor
                }
                Err(e) => {
                    self.detach(client);
                    return Err(e);
                }
            };
            let mut f = self.fanout();
            if let Some(sub) = f.subscribers.iter_mut().find(|s| Arc::ptr_eq(&s.client, client))
                && let Some(caught) = sub.replaying.take()
            {
                // Under the lock: no live update can slip in before these.
                sub.sent_up_to = sub.sent_up_to.max(cursor);
                for (seq, frame) in caught.frames {
                    if seq <= sub.sent_up_to {
                        continue;
                    }
                    sub.sent_up_to = seq;
                    if !client.outbox.push(frame) {
                        break;
                    }
                    crate::metrics::message_out(crate::metrics::Peer::Client, "session/update", 1);
                }
            }
        }
        let waiting = std::mem::take(&mut self.fanout().waiting);
        for request in waiting {
            self.dispatch_agent_request(request);
        }
        Ok(())
    }

    /// Sends `frame` to every client attached now (outside the transcript: a notice, not an
    /// update); how many got it.
    pub fn tell_clients(&self, frame: &Utf8Bytes) -> usize {
        let f = self.fanout();
        f.subscribers
            .iter()
            .filter(|s| !s.client.is_closed())
            .filter(|s| s.client.outbox.push(frame.clone()))
            .count()
    }

    /// Stops sending updates to `client`.
    pub fn detach(&self, client: &Client) {
        self.fanout()
            .subscribers
            .retain(|s| !std::ptr::eq(&*s.client, client) && !s.client.is_closed());
    }

    /// Streams stored updates after `cursor` to `client`, page by page, waiting for room in its
    /// outbox; returns the last seq sent.
    async fn replay(&self, client: &Client, store: &dyn Store, mut cursor: u64) -> Result<u64, RpcError> {
        let from = cursor;
        loop {
            let chunks = store
                .read_events(&self.owner, &self.id, cursor as i64, REPLAY_PAGE_CHUNKS)
                .await
                .map_err(|e| {
                    tracing::error!(session = %self.id, error = %e, "cannot read transcript");
                    RpcError::internal("cannot read the session transcript")
                })?;
            if chunks.is_empty() {
                // Seqs are consecutive: what was sent is what lies between.
                crate::metrics::message_out(crate::metrics::Peer::Client, "session/update", cursor - from);
                return Ok(cursor);
            }
            for chunk in chunks {
                for (seq, update) in (chunk.seq_from as u64..).zip(chunk.payload.split('\n')) {
                    if seq <= cursor {
                        continue;
                    }
                    let frame = protocol::session_update_raw_id(&self.id_json, update, seq, None);
                    if !client.outbox.send(Utf8Bytes::from(frame)).await {
                        return Err(RpcError::internal("client went away during replay"));
                    }
                    cursor = seq;
                }
            }
        }
    }

    /// Asks an agent request of the attached clients (a permission request of all of them,
    /// anything else of the newest), or keeps it until one attaches. With several replicas, this
    /// replica's agent's request is also published to the others with clients of the session.
    pub(crate) fn dispatch_agent_request(&self, request: Arc<AgentRequest>) {
        if request.is_done() {
            return;
        }
        let (targets, released): (Vec<Arc<Client>>, u64) = {
            let mut f = self.fanout();
            f.subscribers.retain(|s| !s.client.is_closed());
            let targets = if f.subscribers.is_empty() {
                f.waiting.push(request.clone());
                Vec::new()
            } else if request.asks_everyone() {
                f.subscribers.iter().map(|s| s.client.clone()).collect()
            } else {
                f.subscribers.last().map(|s| s.client.clone()).into_iter().collect()
            };
            (targets, f.released)
        };
        if let Some(asks) = &self.asks {
            asks.publish(&self.id, &request, released, !targets.is_empty());
        }
        request.ask(&targets);
    }

    /// Another replica's agent request: asked here once the updates up to `after_seq` (which
    /// it followed there) have been handed to clients here.
    pub(crate) fn ask_after(&self, after_seq: u64, request: Arc<AgentRequest>) {
        let mut f = self.fanout();
        if f.released >= after_seq {
            drop(f);
            self.dispatch_agent_request(request);
        } else {
            let at = f.deferred.partition_point(|(s, _)| *s <= after_seq);
            f.deferred.insert(at, (after_seq, Deferred::Ask(request)));
        }
    }

    /// Forgets a settled request that was waiting for a client.
    pub(crate) fn forget_waiting(&self, request: &AgentRequest) {
        self.fanout().waiting.retain(|w| !std::ptr::eq(&**w, request));
    }

    /// Files `what` to go once every update numbered so far is released (at once if it is).
    fn after_released(&self, what: Deferred) {
        let assigned = self.assigned.load(Ordering::Acquire);
        let mut f = self.fanout();
        if f.lost {
            drop(f);
            self.fail(what);
        } else if f.caught_up(assigned) {
            drop(f);
            self.run(what);
        } else {
            f.deferred.push_back((assigned, what));
        }
    }

    fn run(&self, what: Deferred) {
        match what {
            Deferred::Respond(to, _, frame) => {
                to.push(frame);
            }
            Deferred::Ask(request) => self.dispatch_agent_request(request),
        }
    }

    /// Whether the transcript writer has given up on this session.
    pub fn is_lost(&self) -> bool {
        self.fanout().lost
    }

    /// What a client gets instead of an answer whose updates can never be stored.
    fn lost_error() -> RpcError {
        RpcError::internal(LOST)
    }

    /// The process serving this session, restoring the session onto one if it has none: the
    /// agent's `session/resume` if it has it, else its `session/load` (its replay is dropped:
    /// the client has the history from the store). One restore runs at a time; publishing and
    /// clients never wait for it.
    pub async fn ensure_bound(self: &Arc<Self>, pools: &Pools) -> Result<Binding, RpcError> {
        if let Some(b) = self.binding() {
            return Ok(b);
        }
        let _restoring = self.restoring.lock().await;
        if let Some(b) = self.binding() {
            return Ok(b);
        }
        let pool = pools
            .get(&self.agent)
            .ok_or_else(|| RpcError::internal(format!("agent {} is no longer configured", self.agent)))?;
        let agent_sid = self.agent_session_id.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(agent_sid) = agent_sid else {
            return Err(RpcError::internal("session has no agent-side id to restore"));
        };
        let process = pool.acquire(&self.owner).await?;
        let info = pool.info_for(&self.owner).await?;
        let method = if info.can_resume() {
            "session/resume"
        } else if info.can_load() {
            "session/load"
        } else {
            process.release();
            return Err(RpcError::internal(format!(
                "agent {} supports neither session/resume nor session/load, so this session cannot continue; its history is still available with session/load",
                self.agent
            )));
        };
        // The MCP servers accepted at creation, checked again: an operator may have taken a
        // stdio command off the allow list since.
        // Stored before the schema check existed, an entry may not parse: it is not restored.
        let stored: Vec<serde_json::Value> = serde_json::from_str(&self.mcp_servers).unwrap_or_default();
        let servers: Vec<McpServer> = stored
            .into_iter()
            .filter_map(|v| serde_json::from_value(v).ok())
            .collect();
        let servers: Vec<McpServer> = servers
            .into_iter()
            .filter(|s| {
                let ok =
                    crate::tenancy::check_mcp_servers(std::slice::from_ref(s), pool.config(), info.mcp_transports());
                if let Err(e) = &ok {
                    tracing::warn!(session = %self.id, error = %e, "MCP server no longer allowed; not restored");
                }
                ok.is_ok()
            })
            .collect();
        let params = format!(
            r#"{{"sessionId":{},"cwd":{},"additionalDirectories":{},"mcpServers":{}}}"#,
            serde_json::to_string(&*agent_sid).unwrap_or_default(),
            serde_json::to_string(&self.cwd).unwrap_or_default(),
            self.additional_dirs,
            serde_json::to_string(&servers).unwrap_or_else(|_| String::from("[]")),
        );
        let restored = process.request(method, &params, pool.request_timeout()).await;
        if let Ok(answer) = &restored {
            self.reapply_controls(&process, &agent_sid, answer, pool.request_timeout())
                .await;
        }
        let outcome = if restored.is_ok() { "ok" } else { "error" };
        metrics::counter!(crate::metrics::SESSION_RESTORES, "agent" => self.agent.to_string(), "method" => method, "outcome" => outcome)
            .increment(1);
        if let Err(e) = restored {
            process.release();
            tracing::warn!(session = %self.id, method, error = %e, "agent could not restore session");
            // A timeout keeps the contract's wording, and "authentication required" its code
            // (the client offers a sign-in on it); anything else says what failed.
            if e.message == "agent timed out" || e.code == crate::protocol::codes::AUTH_REQUIRED {
                return Err(e);
            }
            return Err(RpcError::internal(format!(
                "agent could not restore this session: {}",
                e.message
            )));
        }
        let route: Arc<dyn SessionRoute> = self.clone();
        if !process.bind_session(agent_sid.clone(), route) {
            process.release();
            tracing::warn!(session = %self.id, process = process.id, "restored agent session id is already bound to another session; refused");
            return Err(id_in_use());
        }
        tracing::info!(session = %self.id, process = process.id, method, "session restored on agent process");
        let b = Binding {
            process,
            agent_session_id: agent_sid,
            since: now_micros(),
        };
        *self.lock_binding() = Some(b.clone());
        Ok(b)
    }
}

/// Sessions another replica serves: what this replica's clients of them get from the store.
impl LiveSession {
    /// Highest seq handed to clients.
    pub fn released(&self) -> u64 {
        self.fanout().released
    }

    /// Another replica committed updates up to `seq`: whether a catch-up should start now (one
    /// is not already under way; it will see `seq` too).
    pub fn committed_elsewhere(&self, seq: u64) -> bool {
        self.committed_elsewhere.fetch_max(seq, Ordering::AcqRel);
        if self.fanout().released >= seq {
            return false;
        }
        !self.catch_up_due.swap(true, Ordering::AcqRel)
    }

    /// Reads what another replica committed after what was released here, and hands it to the
    /// clients in order (each subscriber's `sent_up_to` keeps it exactly once), then what waits
    /// on it. Does nothing while this replica itself has updates of the session on their way
    /// to the store (it serves the session: its own commits release them).
    pub async fn catch_up(&self, store: &dyn Store) {
        loop {
            self.catch_up_due.store(false, Ordering::Release);
            {
                let _one = self.catching_up.lock().await;
                loop {
                    let from = {
                        let f = self.fanout();
                        if !f.unreleased.is_empty() || f.lost {
                            return;
                        }
                        f.released
                    };
                    let chunks = match store
                        .read_events(&self.owner, &self.id, from as i64, REPLAY_PAGE_CHUNKS)
                        .await
                    {
                        Ok(chunks) => chunks,
                        Err(e) => {
                            tracing::warn!(session = %self.id, error = %e, "cannot read updates committed by another replica");
                            return;
                        }
                    };
                    if chunks.is_empty() {
                        break;
                    }
                    let mut due = Vec::new();
                    {
                        let mut f = self.fanout();
                        if !f.unreleased.is_empty() {
                            return;
                        }
                        for chunk in &chunks {
                            for (seq, update) in (chunk.seq_from as u64..).zip(chunk.payload.split('\n')) {
                                if seq <= f.released {
                                    continue;
                                }
                                let frame =
                                    Utf8Bytes::from(protocol::session_update_raw_id(&self.id_json, update, seq, None));
                                f.released = seq;
                                f.deliver(seq, &frame, self.catch_up_bytes);
                            }
                        }
                        self.assigned.fetch_max(f.released, Ordering::AcqRel);
                        while f.deferred.front().is_some_and(|(after, _)| *after <= f.released) {
                            if let Some((_, what)) = f.deferred.pop_front() {
                                due.push(what);
                            }
                        }
                    }
                    for what in due {
                        self.run(what);
                    }
                }
            }
            let want = self.committed_elsewhere.load(Ordering::Acquire);
            if self.fanout().released >= want || self.catch_up_due.swap(true, Ordering::AcqRel) {
                return;
            }
        }
    }

    /// The answer to a client's request that another replica served: `frame` for `to`, once the
    /// updates up to `after_seq` have been handed to clients here.
    pub fn respond_after(&self, after_seq: u64, to: &Outbox, client_id: &RawValue, frame: Utf8Bytes) {
        let mut f = self.fanout();
        if f.released >= after_seq {
            drop(f);
            to.push(frame);
        } else {
            let at = f.deferred.partition_point(|(s, _)| *s <= after_seq);
            let what = Deferred::Respond(to.clone(), client_id.to_owned(), frame);
            f.deferred.insert(at, (after_seq, what));
        }
    }

    /// This replica has just taken the session's lease: numbering continues above whatever the
    /// previous holder committed (read from the store and handed to clients first).
    pub async fn take_over(&self, store: &dyn Store) {
        self.catch_up(store).await;
        let released = self.fanout().released;
        self.assigned.fetch_max(released, Ordering::AcqRel);
    }

    /// This replica no longer serves the session (another one holds its lease): it leaves its
    /// agent process, its unstored updates are dropped (never shown), and what waited on them
    /// is answered with an error. Its clients stay, fed from the store like any other replica's.
    pub fn leave(&self) {
        let failed: Vec<Deferred> = {
            let mut f = self.fanout();
            f.unreleased.clear();
            self.assigned.store(f.released, Ordering::Release);
            f.deferred.drain(..).map(|(_, what)| what).collect()
        };
        self.take_binding();
        tracing::warn!(session = %self.id, "session now served by another replica; left its agent process here");
        for what in failed {
            match what {
                Deferred::Respond(to, id, _) => {
                    let e = RpcError::internal("this session moved to another gateway replica; send the request again");
                    to.push(Utf8Bytes::from(protocol::error(Some(id.get()), &e)));
                }
                Deferred::Ask(request) => {
                    tokio::spawn(async move { request.give_up().await });
                }
            }
        }
    }
}

impl LiveSession {
    /// What is filed behind updates that will never be released: an answer becomes an error
    /// under its request's id; an agent's request is given up on (the agent hears `cancelled`).
    fn fail(&self, what: Deferred) {
        match what {
            Deferred::Respond(to, id, _) => {
                to.push(Utf8Bytes::from(protocol::error(Some(id.get()), &Self::lost_error())));
            }
            Deferred::Ask(request) => {
                tokio::spawn(async move { request.give_up().await });
            }
        }
    }
}

impl Committed for LiveSession {
    fn lost(&self) {
        let failed: Vec<Deferred> = {
            let mut f = self.fanout();
            if f.lost {
                return;
            }
            f.lost = true;
            f.unreleased.clear();
            f.deferred.drain(..).map(|(_, what)| what).collect()
        };
        tracing::error!(session = %self.id, "the session's transcript cannot be stored; what waits on it is failed");
        for what in failed {
            self.fail(what);
        }
    }

    fn fenced(&self) {
        self.leave();
    }

    fn committed(&self, seq: u64) {
        let mut due = Vec::new();
        {
            let mut f = self.fanout();
            while f.unreleased.front().is_some_and(|(s, _)| *s <= seq) {
                let Some((s, frame)) = f.unreleased.pop_front() else {
                    break;
                };
                f.released = s;
                f.deliver(s, &frame, self.catch_up_bytes);
            }
            f.released = f.released.max(seq);
            while f.deferred.front().is_some_and(|(after, _)| *after <= f.released) {
                if let Some((_, what)) = f.deferred.pop_front() {
                    due.push(what);
                }
            }
        }
        for what in due {
            self.run(what);
        }
    }
}

#[async_trait::async_trait]
impl SessionRoute for LiveSession {
    fn session_id(&self) -> &str {
        &self.id
    }

    async fn publish(&self, update: &RawValue, meta: Option<&RawValue>) {
        self.first_update.update();
        self.publish_raw(update.get(), meta).await;
    }

    fn agent_request(self: Arc<Self>, process: &Arc<AgentProcess>, id: Box<RawValue>, method: &str, params: String) {
        let request = AgentRequest::new(&self, process, id, method, params, self.permission_wait);
        self.after_released(Deferred::Ask(request));
    }

    fn respond(&self, to: &Outbox, client_id: &RawValue, frame: Utf8Bytes) {
        self.after_released(Deferred::Respond(to.clone(), client_id.to_owned(), frame));
    }

    fn unbound(&self, process_id: u64) {
        let mut binding = self.lock_binding();
        if binding.as_ref().is_some_and(|b| b.process.id == process_id) {
            *binding = None;
            tracing::info!(session = %self.id, "session lost its agent process; it will be restored when next used");
        }
    }
}

/// The answer when an agent's session id already routes to another live session.
fn id_in_use() -> RpcError {
    RpcError::internal("the agent answered with a session id that is already bound to another session; refused")
}

/// Title from a prompt's text: first line, at most [`TITLE_CHARS`] characters.
fn make_title(text: &str) -> String {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
    let mut title: String = line.chars().take(TITLE_CHARS).collect();
    if line.chars().count() > TITLE_CHARS {
        title.push('…');
    }
    title
}

/// The `title` of a `session_info_update`, if it is one and has one.
fn info_update_title(update: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(update).ok()?;
    (v.get("sessionUpdate")?.as_str()? == "session_info_update").then_some(())?;
    // Stored and listed: an agent's title is held to the same length as one made from a prompt.
    v.get("title")?.as_str().map(make_title)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles() {
        assert_eq!(make_title("\n  hello world \nmore"), "hello world");
        assert_eq!(make_title(&"x".repeat(150)).chars().count(), TITLE_CHARS + 1);
        assert_eq!(
            info_update_title(r#"{"sessionUpdate":"session_info_update","title":"T"}"#),
            Some("T".into())
        );
        assert_eq!(
            info_update_title(r#"{"sessionUpdate":"agent_message_chunk","title":"session_info_update"}"#),
            None
        );
    }
}
