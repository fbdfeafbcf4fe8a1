//! Live sessions: the per-session sequence, the clients attached to it, and the agent process
//! (if any) that serves it.
//!
//! Everything that changes a session's transcript goes through [`LiveSession::publish`], which
//! holds the session's lock while it numbers the update, queues it for the database and hands it
//! to every attached client, so `seq` order, storage order and delivery order are one order.

mod requests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::ws::Utf8Bytes;
use serde_json::value::RawValue;

pub use requests::Settle;
use requests::Waiting;

use crate::bridge::client::ClientHandle;
use crate::pool::{AgentProcess, Pools};
use crate::protocol::{self, RpcError};
use crate::store::persister::{Item, Persister};
use crate::store::{SessionRecord, Store, now_micros};

/// How many transcript chunks a replay reads per query (memory stays flat).
const REPLAY_PAGE_CHUNKS: u32 = 4;
/// Longest title made from a prompt.
const TITLE_CHARS: usize = 100;

/// The agent process a session runs on.
#[derive(Debug, Clone)]
pub struct Binding {
    /// The process.
    pub process: Arc<AgentProcess>,
    /// The agent's id for the session.
    pub agent_session_id: Arc<str>,
}

/// Mutable state, under the session's lock.
#[derive(Default)]
struct State {
    /// Highest sequence number given out.
    last_seq: u64,
    /// Clients that receive this session's updates.
    subscribers: Vec<Arc<ClientHandle>>,
    /// The process serving it, if any.
    binding: Option<Binding>,
    /// The agent's last known id for the session (kept across process deaths for restore).
    agent_session_id: Option<Arc<str>>,
    /// Agent requests waiting for a client to attach.
    waiting: Vec<Waiting>,
}

/// One session known to this gateway process.
pub struct LiveSession {
    /// Gateway session id.
    pub id: Arc<str>,
    /// Its user.
    pub owner: Arc<str>,
    /// Its agent's configured name.
    pub agent: Arc<str>,
    /// Working directory.
    pub cwd: String,
    /// `additionalDirectories`, JSON array.
    pub additional_dirs: String,
    /// The `mcpServers` it was created with, JSON array (restores pass them again).
    pub mcp_servers: String,
    /// `id` as a JSON string literal, escaped once.
    id_json: Box<str>,
    /// `acp_gateway_updates_total`, looked up once.
    updates_total: metrics::Counter,
    /// Transcript writer.
    persister: Persister,
    /// How long an agent's request may wait for a client.
    permission_wait: Duration,
    /// Everything that changes.
    state: tokio::sync::Mutex<State>,
}

impl std::fmt::Debug for LiveSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveSession")
            .field("id", &self.id)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl LiveSession {
    /// A session as stored, not yet on any process.
    pub fn from_record(r: &SessionRecord, persister: Persister, permission_wait: Duration) -> Arc<Self> {
        let mcp_servers = serde_json::from_str::<serde_json::Value>(&r.meta)
            .ok()
            .and_then(|m| m.get("mcpServers").map(ToString::to_string))
            .unwrap_or_else(|| String::from("[]"));
        let mut id_json = String::new();
        protocol::push_json_str(&mut id_json, &r.id);
        Arc::new(Self {
            id_json: id_json.into(),
            updates_total: metrics::counter!("acp_gateway_updates_total"),
            id: Arc::from(r.id.as_str()),
            owner: Arc::from(r.owner.as_str()),
            agent: Arc::from(r.agent.as_str()),
            cwd: r.cwd.clone(),
            additional_dirs: r.additional_dirs.clone(),
            mcp_servers,
            persister,
            permission_wait,
            state: tokio::sync::Mutex::new(State {
                last_seq: u64::try_from(r.last_seq).unwrap_or(0),
                agent_session_id: r.agent_session_id.as_deref().map(Arc::from),
                ..Default::default()
            }),
        })
    }

    /// Binds the session to a process that already knows it (right after `session/new`).
    /// Refused when the process already routes that agent session id to another session.
    pub async fn bind(
        self: &Arc<Self>,
        process: Arc<AgentProcess>,
        agent_session_id: Arc<str>,
    ) -> Result<(), RpcError> {
        if !process.bind_session(agent_session_id.clone(), self.clone()) {
            return Err(id_in_use());
        }
        let mut st = self.state.lock().await;
        st.agent_session_id = Some(agent_session_id.clone());
        st.binding = Some(Binding {
            process,
            agent_session_id,
        });
        Ok(())
    }

    /// Forgets the binding to process `process_id` (it died or was stopped).
    pub async fn unbind_from(&self, process_id: u64) {
        let mut st = self.state.lock().await;
        if st.binding.as_ref().is_some_and(|b| b.process.id == process_id) {
            st.binding = None;
            tracing::info!(session = %self.id, "session lost its agent process; it will be restored when next used");
        }
    }

    /// Ends the binding (close/delete), returning it.
    pub async fn take_binding(&self) -> Option<Binding> {
        let b = self.state.lock().await.binding.take();
        if let Some(b) = &b {
            b.process.unbind_session(&b.agent_session_id);
        }
        b
    }

    /// The current binding, if its process is alive.
    pub async fn binding(&self) -> Option<Binding> {
        self.state.lock().await.binding.clone().filter(|b| !b.process.is_dead())
    }

    /// Whether the session can be dropped from memory: no clients, no process, nothing waiting.
    pub fn is_dormant(&self) -> bool {
        self.state.try_lock().is_ok_and(|st| {
            st.subscribers.iter().all(|c| c.is_closed())
                && st.binding.as_ref().is_none_or(|b| b.process.is_dead())
                && st.waiting.is_empty()
        })
    }

    /// Numbers one update, queues it for storage, and sends it to every attached client.
    pub async fn publish(&self, update: &RawValue, agent_meta: Option<&RawValue>) {
        let mut st = self.state.lock().await;
        self.publish_locked(&mut st, update.get(), agent_meta).await;
    }

    async fn publish_locked(&self, st: &mut State, update: &str, agent_meta: Option<&RawValue>) {
        st.last_seq += 1;
        let seq = st.last_seq;
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
        // Stored before it is sent: whatever a client has seen can be replayed.
        self.persister
            .send(Item::Update {
                session: self.id.clone(),
                seq,
                update: update.into(),
                at: now_micros(),
            })
            .await;
        let frame = Utf8Bytes::from(protocol::session_update_raw_id(&self.id_json, update, seq, agent_meta));
        st.subscribers.retain(|c| !c.is_closed());
        for client in &st.subscribers {
            client.send(frame.clone()).await;
        }
        self.updates_total.increment(1);
    }

    /// Sends a prompt to the agent with `forward` and records it: the user's prompt becomes
    /// `user_message_chunk` updates (one per content block), counts as a message, and titles an
    /// untitled session. The prompt is forwarded first, under the session's lock, so the agent
    /// starts working while the gateway records it, and its updates still come after the user's
    /// in `seq` order. A prompt the agent never received is not recorded.
    pub async fn forward_prompt<T>(
        &self,
        prompt: Option<&RawValue>,
        forward: impl Future<Output = Result<T, RpcError>>,
    ) -> Result<T, RpcError> {
        let blocks: Vec<serde_json::Value> = prompt
            .and_then(|p| serde_json::from_str(p.get()).ok())
            .unwrap_or_default();
        let title = blocks
            .iter()
            .find_map(|b| b.get("text").and_then(serde_json::Value::as_str))
            .map(make_title);
        let mut st = self.state.lock().await;
        let sent = forward.await?;
        self.persister
            .send(Item::Prompt {
                session: self.id.clone(),
                title,
            })
            .await;
        for block in blocks {
            // Re-serialized compactly: a client's pretty-printed JSON must not span lines.
            let update = format!(r#"{{"sessionUpdate":"user_message_chunk","content":{block}}}"#);
            self.publish_locked(&mut st, &update, None).await;
        }
        Ok(sent)
    }

    /// Whether the session is on a live process right now (without waiting for its lock).
    pub fn is_bound_now(&self) -> bool {
        self.state
            .try_lock()
            .is_ok_and(|st| st.binding.as_ref().is_some_and(|b| !b.process.is_dead()))
    }

    /// Replays the stored transcript after `after_seq` to `client` (when `replay`), then attaches
    /// it to live updates with nothing missed and nothing repeated in between.
    pub async fn attach(
        self: &Arc<Self>,
        client: &Arc<ClientHandle>,
        store: &dyn Store,
        replay: bool,
        after_seq: u64,
    ) -> Result<(), RpcError> {
        let mut cursor = after_seq;
        if replay {
            // The bulk, without holding the session: the agent keeps streaming meanwhile.
            self.persister.flush().await;
            cursor = self.replay(client, store, cursor).await?;
        }
        let mut st = self.state.lock().await;
        if replay && st.last_seq > cursor {
            // The few updates published during the bulk replay.
            self.persister.flush().await;
            self.replay(client, store, cursor).await?;
        }
        st.subscribers.retain(|c| !c.is_closed());
        if !st.subscribers.iter().any(|c| Arc::ptr_eq(c, client)) {
            st.subscribers.push(client.clone());
        }
        client.track_session(&self.id);
        let waiting = std::mem::take(&mut st.waiting);
        drop(st);
        for w in waiting {
            w.deliver(self).await;
        }
        Ok(())
    }

    /// Stops sending updates to `client`.
    pub async fn detach(&self, client: &ClientHandle) {
        self.state
            .lock()
            .await
            .subscribers
            .retain(|c| !std::ptr::eq(&**c, client) && !c.is_closed());
    }

    /// Streams stored updates after `cursor` to `client`, page by page; returns the last seq sent.
    async fn replay(&self, client: &ClientHandle, store: &dyn Store, mut cursor: u64) -> Result<u64, RpcError> {
        loop {
            let chunks = store
                .read_events(&self.owner, &self.id, cursor as i64, REPLAY_PAGE_CHUNKS)
                .await
                .map_err(|e| {
                    tracing::error!(session = %self.id, error = %e, "cannot read transcript");
                    RpcError::internal("cannot read the session transcript")
                })?;
            if chunks.is_empty() {
                return Ok(cursor);
            }
            for chunk in chunks {
                for (seq, update) in (chunk.seq_from as u64..).zip(chunk.payload.split('\n')) {
                    if seq <= cursor {
                        continue;
                    }
                    if !client
                        .send(Utf8Bytes::from(protocol::session_update_raw_id(
                            &self.id_json,
                            update,
                            seq,
                            None,
                        )))
                        .await
                    {
                        return Err(RpcError::internal("client went away during replay"));
                    }
                    cursor = seq;
                }
            }
        }
    }

    /// The process serving this session, restoring the session onto one if it has none: the
    /// agent's `session/resume` if it has it, else its `session/load` (its replay is dropped:
    /// the client has the history from the store).
    pub async fn ensure_bound(self: &Arc<Self>, pools: &Pools) -> Result<Binding, RpcError> {
        let mut st = self.state.lock().await;
        if let Some(b) = st.binding.clone().filter(|b| !b.process.is_dead()) {
            return Ok(b);
        }
        st.binding = None;
        let pool = pools
            .get(&self.agent)
            .ok_or_else(|| RpcError::internal(format!("agent {} is no longer configured", self.agent)))?;
        let Some(agent_sid) = st.agent_session_id.clone() else {
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
        let servers: Vec<serde_json::Value> = serde_json::from_str(&self.mcp_servers).unwrap_or_default();
        let servers: Vec<serde_json::Value> = servers
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
            serde_json::Value::from(servers),
        );
        let timeout = pool.request_timeout();
        if let Err(e) = process.request(method, &params, timeout).await {
            process.release();
            tracing::warn!(session = %self.id, method, error = %e, "agent could not restore session");
            return Err(RpcError::internal(format!(
                "agent could not restore this session: {}",
                e.message
            )));
        }
        if !process.bind_session(agent_sid.clone(), self.clone()) {
            process.release();
            tracing::warn!(session = %self.id, process = process.id, "restored agent session id is already bound to another session; refused");
            return Err(id_in_use());
        }
        tracing::info!(session = %self.id, process = process.id, method, "session restored on agent process");
        let b = Binding {
            process,
            agent_session_id: agent_sid,
        };
        st.binding = Some(b.clone());
        Ok(b)
    }

    /// Sends an agent's request to the attached clients (a permission request to all of them,
    /// first answer wins), or keeps it until one attaches.
    pub async fn deliver_agent_request(
        self: &Arc<Self>,
        process: &Arc<AgentProcess>,
        agent_id: Box<RawValue>,
        method: &str,
        params: String,
    ) {
        let settle = Settle::new(self.clone(), process, agent_id, method, params);
        let mut st = self.state.lock().await;
        st.subscribers.retain(|c| !c.is_closed());
        if st.subscribers.is_empty() {
            let w = Waiting::new(settle, self.permission_wait);
            st.waiting.push(w);
            return;
        }
        let targets: Vec<Arc<ClientHandle>> = if method == "session/request_permission" {
            st.subscribers.clone()
        } else {
            st.subscribers.last().cloned().into_iter().collect()
        };
        drop(st);
        settle.ask(&targets).await;
    }

    /// Keeps an unanswered agent request until a client attaches (its asked clients all left).
    pub(crate) async fn requeue(self: &Arc<Self>, settle: Arc<Settle>) {
        let mut st = self.state.lock().await;
        st.subscribers.retain(|c| !c.is_closed());
        let targets = st.subscribers.clone();
        if targets.is_empty() {
            st.waiting.push(Waiting::new(settle, self.permission_wait));
        } else {
            drop(st);
            settle.ask(&targets).await;
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
    v.get("title")?.as_str().map(str::to_string)
}

/// The sessions this gateway process has in memory.
#[derive(Debug, Default)]
pub struct Registry {
    /// By gateway session id.
    map: Mutex<HashMap<Arc<str>, Arc<LiveSession>>>,
}

impl Registry {
    /// The session with `id`, if in memory (ownership is the caller's to check).
    pub fn get(&self, id: &str) -> Option<Arc<LiveSession>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).get(id).cloned()
    }

    /// Adds `session`, or returns the one already there under its id.
    pub fn insert(&self, session: Arc<LiveSession>) -> Arc<LiveSession> {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(session.id.clone())
            .or_insert(session)
            .clone()
    }

    /// Forgets a session.
    pub fn remove(&self, id: &str) -> Option<Arc<LiveSession>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).remove(id)
    }

    /// Drops sessions nobody uses (they are reloaded from the store when needed).
    pub fn sweep(&self) {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, s| !s.is_dormant());
    }

    /// Sessions in memory.
    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether none are.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
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
