//! One session known to this gateway process: its sequence, its clients, the agent process that
//! serves it.
//!
//! The publish path, in the order an update takes it:
//! 1. [`LiveSession::publish`] numbers the update (or a burst the agent wrote at once) and queues
//!    it for the transcript writer, under `numbering` (so `seq` order is storage order). It waits
//!    only for the writer's queue: the database's pace.
//! 2. The writer commits a batch and calls [`Committed::committed`]; only then are the updates
//!    offered to the attached clients' outboxes. That never waits: a client whose outbox is full
//!    is fed from the store instead until it has caught up ([`fanout`], [`clients`]). Whatever a
//!    client saw is stored.
//! 3. What must follow those updates (the answer to a client's prompt, an agent's permission
//!    request) waits in `deferred` until everything numbered before it is released, and for a
//!    client being fed, until it has been given them.
//!
//! No lock here is held across an await on anything a client or an agent controls. Parts:
//! [`publish`] (numbering and queueing), [`fanout`] (what clients get), [`clients`] (attach,
//! feeds, answers and agent requests), [`follow`] (sessions another replica serves),
//! [`restore`] (back onto an agent process).

mod clients;
pub use clients::Attach;
mod controls;
mod fanout;
mod follow;
mod publish;
mod restore;

use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::extract::ws::Utf8Bytes;
use serde_json::value::RawValue;

use self::controls::KnownControls;
use self::fanout::{Deferred, Fanout};
use self::follow::Following;
use self::publish::Numbering;
pub use self::restore::Restore;
use super::queue::PromptQueue;
use super::requests::AgentRequest;
use crate::agents::pool::{AgentProcess, SessionRoute};
use crate::infra::outbox::Outbox;
use crate::protocol::{self, RpcError};
use crate::store::persister::{Committed, Persister};
use crate::store::{SessionRecord, Store, now_micros};

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

/// The error of a request whose session's transcript can no longer be stored.
pub const LOST: &str = "this session's transcript can no longer be stored (the database refuses its writes), so nothing more of it can be shown; start a new session";

/// One session known to this gateway process.
pub struct LiveSession {
    /// Gateway session id.
    pub id: Arc<str>,
    /// The user it belongs to: every method that names it checks this.
    pub owner: Arc<str>,
    /// The configured agent that serves it.
    pub agent: Arc<str>,
    /// How it is put back on an agent process: what it was created with, the process serving it
    /// now, one restore at a time, a fork's hand-off.
    pub restore: Restore,
    /// What every session here shares: the transcript writer, the store, the features that
    /// watch sessions, the runtime.
    ctx: Arc<Context>,
    /// Itself, for the writer's commit notices.
    me: Weak<LiveSession>,
    /// Numbering: held while numbering and queueing updates, so `seq` order is storage order.
    seq: Numbering,
    /// What clients get.
    fanout: Mutex<Fanout>,
    /// The agent's modes, config options and models as this replica last knew them.
    controls: KnownControls,
    /// Updates another replica committed, read from the store (see [`LiveSession::catch_up`]).
    follow: Following,
    /// Messages typed while a turn runs, and whether one does.
    queue: Mutex<PromptQueue>,
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
    /// Tracks the tasks that feed them, and those [`crate::session::Sessions`] spawns for replicas
    /// (shutdown waits for them within its grace period).
    pub tracker: tokio_util::task::TaskTracker,
    /// This replica's leases and bus, when several share a Postgres database.
    pub replica: Option<Arc<dyn crate::session::Replicas>>,
    /// Agent requests asked across replicas (with `replica`).
    pub asks: Option<Arc<super::asks::Asks>>,
    /// What each person spends (`usage_update` costs).
    pub usage: Option<Arc<dyn crate::session::UpdateObserver>>,
    /// Users' own MCP servers, given to the agent again when a session is restored.
    pub user_mcp: Option<Arc<dyn crate::session::UserServers>>,
    /// Pushes to users' devices.
    pub push: Option<Arc<dyn crate::session::Notifier>>,
}

/// What every session of this gateway shares, and the session service with them: built once
/// from [`SessionOptions`] and the store.
pub struct Context {
    /// Session rows and transcripts; where clients that fell behind are fed from.
    pub(in crate::session) store: Arc<dyn Store>,
    /// The transcript writer (updates are visible once it has committed them).
    pub(in crate::session) persister: Persister,
    /// How long an agent's request may wait for an answer.
    pub(in crate::session) permission_wait: Duration,
    /// Where `usage_update` costs are recorded.
    usage: Option<Arc<dyn crate::session::UpdateObserver>>,
    /// Users' own MCP servers (see [`SessionOptions::user_mcp`]).
    user_mcp: Option<Arc<dyn crate::session::UserServers>>,
    /// Pushes to the owner's devices.
    push: Option<Arc<dyn crate::session::Notifier>>,
    /// This replica's leases and bus, when several share the database (they may change the
    /// stored controls).
    pub(in crate::session) replica: Option<Arc<dyn crate::session::Replicas>>,
    /// Agent requests asked across replicas, when several share the database.
    pub(in crate::session) asks: Option<Arc<super::asks::Asks>>,
    /// Tracks the feeds of clients that fell behind, and the service's tasks for replicas
    /// (shutdown waits for them within its grace period).
    pub(in crate::session) tracker: tokio_util::task::TaskTracker,
    /// The gateway's runtime: what runs on the transcript writer's thread (commit notices)
    /// spawns its tasks here.
    handle: tokio::runtime::Handle,
    /// `acp_gateway_updates_total`, looked up once.
    updates_total: metrics::Counter,
}

impl Context {
    /// The context of sessions set up as `options` say, over `store`, on the current runtime.
    pub fn new(options: SessionOptions, store: Arc<dyn Store>) -> Arc<Self> {
        let SessionOptions {
            persister,
            permission_wait,
            tracker,
            replica,
            asks,
            usage,
            user_mcp,
            push,
        } = options;
        Arc::new(Self {
            store,
            persister,
            permission_wait,
            usage,
            user_mcp,
            push,
            replica,
            asks,
            tracker,
            handle: tokio::runtime::Handle::current(),
            updates_total: metrics::counter!(crate::infra::metrics::UPDATES),
        })
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("replicated", &self.replica.is_some())
            .finish_non_exhaustive()
    }
}

impl LiveSession {
    /// A session as stored, not yet on any process.
    pub fn from_record(r: &SessionRecord, ctx: &Arc<Context>) -> Arc<Self> {
        let mcp_servers = serde_json::from_str::<serde_json::Value>(&r.meta)
            .ok()
            .and_then(|m| m.get("mcpServers").map(ToString::to_string))
            .unwrap_or_else(|| String::from("[]"));
        let mut id_json = String::new();
        protocol::push_json_str(&mut id_json, &r.id);
        let last_seq = u64::try_from(r.last_seq).unwrap_or(0);
        Arc::new_cyclic(|me| Self {
            id: Arc::from(r.id.as_str()),
            owner: Arc::from(r.owner.as_str()),
            agent: Arc::from(r.agent.as_str()),
            restore: Restore::new(r, mcp_servers),
            ctx: ctx.clone(),
            me: me.clone(),
            seq: Numbering {
                lock: tokio::sync::Mutex::new(()),
                assigned: AtomicU64::new(last_seq),
                id_json: id_json.into(),
                first_update: crate::infra::metrics::FirstUpdate::new(&r.agent),
            },
            fanout: Mutex::new(Fanout {
                released: last_seq,
                ..Default::default()
            }),
            controls: KnownControls::default(),
            follow: Following::new(last_seq),
            queue: Mutex::default(),
        })
    }

    fn fanout(&self) -> MutexGuard<'_, Fanout> {
        self.fanout.lock()
    }

    fn lock_binding(&self) -> MutexGuard<'_, Option<Binding>> {
        self.restore.binding.lock()
    }

    /// Records whether the MCP servers its agent was just given (at its start or restore) carry
    /// secrets.
    pub fn set_mcp_secrets_given(&self, given: bool) {
        self.restore.mcp_secrets_given.store(given, Ordering::Relaxed);
    }

    /// Whether the MCP servers its agent was last given carry secrets.
    pub fn mcp_secrets_given(&self) -> bool {
        self.restore.mcp_secrets_given.load(Ordering::Relaxed)
    }

    /// A fork whose agent started afresh: its first prompt takes the copied history, up to
    /// `through`, to the agent.
    pub fn set_handoff(&self, through: i64) {
        *self.restore.handoff.lock() = Some(through);
    }

    /// Whether a fork's first prompt has yet to take its history to the agent.
    pub fn has_handoff(&self) -> bool {
        self.restore.handoff.lock().is_some()
    }

    /// The history a fork's first prompt must take to its agent, once.
    pub fn take_handoff(&self) -> Option<i64> {
        self.restore.handoff.lock().take()
    }

    /// The session's queued messages (see [`crate::session::queue`]).
    pub fn queue(&self) -> MutexGuard<'_, PromptQueue> {
        self.queue.lock()
    }

    /// Tells every attached client what the queue holds now.
    pub fn tell_queue(&self) {
        let notice = self.queue().notice(&self.id);
        self.tell_clients(crate::session::queue::NOTICE, &notice.into());
    }

    /// Tells them of a turn's end once the updates before it are released (see
    /// [`LiveSession::tell_queue_if_watched`]).
    pub fn tell_queue_after_updates(&self) {
        self.after_released(Deferred::TellQueue);
    }

    /// Tells them of a turn's start or end, unless the one client attached knows it already
    /// (it sent the prompt) and nothing is queued.
    pub fn tell_queue_if_watched(&self) {
        let many = self.clients_attached() > 1;
        let notice = {
            let mut q = self.queue();
            if !q.worth_telling(many) {
                return;
            }
            q.notice(&self.id)
        };
        self.tell_clients(crate::session::queue::NOTICE, &notice.into());
    }

    /// Binds the session to a process that already knows it (right after `session/new`).
    /// Refused when the process already routes that agent session id to another session.
    pub fn bind(self: &Arc<Self>, process: Arc<AgentProcess>, agent_session_id: Arc<str>) -> Result<(), RpcError> {
        let route: Arc<dyn SessionRoute> = self.clone();
        if !process.bind_session(agent_session_id.clone(), route) {
            return Err(id_in_use());
        }
        *self.restore.agent_session_id.lock() = Some(agent_session_id.clone());
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
                && f.released == self.seq.assigned.load(Ordering::Acquire)
        };
        idle && self.binding().is_none()
    }

    /// Whether the transcript writer has given up on this session.
    pub fn is_lost(&self) -> bool {
        self.fanout().lost
    }

    /// What a client gets instead of an answer whose updates can never be stored.
    fn lost_error() -> RpcError {
        RpcError::internal(LOST)
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
        let mut fell = Vec::new();
        {
            let mut f = self.fanout();
            while f.unreleased.front().is_some_and(|(s, _)| *s <= seq) {
                let Some((s, frame)) = f.unreleased.pop_front() else {
                    break;
                };
                f.released = s;
                f.deliver(s, &frame, &mut fell);
            }
            f.released = f.released.max(seq);
            while f.deferred.front().is_some_and(|(after, _)| *after <= f.released) {
                if let Some(what) = f.deferred.pop_front() {
                    due.push(what);
                }
            }
        }
        if !fell.is_empty() {
            self.start_feeds(fell);
        }
        for (after, what) in due {
            self.run(after, what);
        }
    }
}

#[async_trait::async_trait]
impl SessionRoute for LiveSession {
    fn session_id(&self) -> &str {
        &self.id
    }

    async fn publish(&self, update: &RawValue, meta: Option<&RawValue>) {
        self.seq.first_update.update();
        self.publish_raw(update.get(), meta).await;
    }

    async fn publish_burst(&self, updates: &[(&RawValue, Option<&RawValue>)], more: bool) {
        self.seq.first_update.update();
        self.publish_run(updates, more).await;
    }

    fn agent_request(self: Arc<Self>, process: &Arc<AgentProcess>, id: Box<RawValue>, method: &str, params: String) {
        self.push_request(method, &params);
        let request = AgentRequest::new(&self, process, id, method, params, self.ctx.permission_wait);
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
