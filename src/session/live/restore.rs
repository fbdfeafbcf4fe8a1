//! Putting a stored session back on an agent process: the agent's `session/resume` or
//! `session/load`, and the user's controls put back on an agent that forgot them.

use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol_schema::v1::McpServer;
use serde_json::value::RawValue;

use super::{Binding, LiveSession, id_in_use};
use crate::agents::pool::{AgentProcess, Pools, SessionRoute};
use crate::protocol::RpcError;
use crate::session::controls::Controls;
use crate::store::now_micros;

/// How a session is put back on an agent process: what it was created with (the agent is given
/// it again), the process serving it now, one restore at a time, and a fork's hand-off.
#[derive(Debug)]
pub struct Restore {
    /// Working directory, as resolved at creation (restores pass it again).
    pub cwd: String,
    /// `additionalDirectories`, JSON array, as resolved at creation.
    pub additional_dirs: String,
    /// The `mcpServers` accepted at creation, JSON array (restores re-check and pass them).
    pub mcp_servers: String,
    /// The process serving it, if any.
    pub(super) binding: parking_lot::Mutex<Option<Binding>>,
    /// The agent's last known id for the session (kept across process deaths for restore).
    pub(super) agent_session_id: parking_lot::Mutex<Option<Arc<str>>>,
    /// One restore at a time; held across the agent's answer, so nothing else takes it.
    pub(super) restoring: tokio::sync::Mutex<()>,
    /// A fork its agent did not make: the seq its copied history ends at, until the first
    /// prompt takes that history to the agent (see [`LiveSession::set_handoff`]).
    pub(super) handoff: parking_lot::Mutex<Option<i64>>,
    /// Whether the MCP servers its agent was last given for it carry secrets (headers, env):
    /// they stay with the agent until the session is restored elsewhere, even if their owner
    /// has removed them since, so a teammate's prompt is checked against this too.
    pub(super) mcp_secrets_given: std::sync::atomic::AtomicBool,
}

impl Restore {
    /// What `r` was created with, on no process yet; `mcp_servers` from its metadata.
    pub(super) fn new(r: &crate::store::SessionRecord, mcp_servers: String) -> Self {
        Self {
            cwd: r.cwd.clone(),
            additional_dirs: r.additional_dirs.clone(),
            mcp_servers,
            binding: parking_lot::Mutex::new(None),
            agent_session_id: parking_lot::Mutex::new(r.agent_session_id.as_deref().map(Arc::from)),
            restoring: tokio::sync::Mutex::new(()),
            handoff: parking_lot::Mutex::new(None),
            mcp_secrets_given: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl LiveSession {
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

    /// The process serving this session, restoring the session onto one if it has none: the
    /// agent's `session/resume` if it has it, else its `session/load` (its replay is dropped:
    /// the client has the history from the store). One restore runs at a time; publishing and
    /// clients never wait for it.
    pub async fn ensure_bound(self: &Arc<Self>, pools: &Pools) -> Result<Binding, RpcError> {
        if let Some(b) = self.binding() {
            return Ok(b);
        }
        let _restoring = self.restore.restoring.lock().await;
        if let Some(b) = self.binding() {
            return Ok(b);
        }
        let pool = pools
            .get(&self.agent)
            .ok_or_else(|| RpcError::internal(format!("agent {} is no longer configured", self.agent)))?;
        let agent_sid = self.restore.agent_session_id.lock().clone();
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
        let stored: Vec<serde_json::Value> = serde_json::from_str(&self.restore.mcp_servers).unwrap_or_default();
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
        let mut servers = serde_json::to_string(&servers).unwrap_or_else(|_| String::from("[]"));
        // The owner's own servers, as they are now (never stored with the session), and never
        // to a process shared between users (their headers are the owner's secrets).
        if let Some(user_mcp) = self.ctx.user_mcp.as_ref().filter(|_| !pool.is_shared()) {
            match user_mcp
                .with_users_servers(&self.owner, info.mcp_transports(), &servers)
                .await
            {
                Ok(all) => servers = all,
                Err(e) => {
                    process.release();
                    return Err(RpcError::internal(e.to_string()));
                }
            }
        }
        // Set before it is sent: a teammate's prompt is checked against it from now on.
        self.set_mcp_secrets_given(crate::tenancy::carry_secrets(&servers));
        let params = format!(
            r#"{{"sessionId":{},"cwd":{},"additionalDirectories":{},"mcpServers":{servers}}}"#,
            serde_json::to_string(&*agent_sid).unwrap_or_default(),
            serde_json::to_string(&self.restore.cwd).unwrap_or_default(),
            self.restore.additional_dirs,
        );
        let restored = process.request(method, &params, pool.request_timeout()).await;
        if let Ok(answer) = &restored {
            self.reapply_controls(&process, &agent_sid, answer, pool.request_timeout())
                .await;
        }
        let outcome = if restored.is_ok() { "ok" } else { "error" };
        metrics::counter!(crate::infra::metrics::SESSION_RESTORES, "agent" => self.agent.to_string(), "method" => method, "outcome" => outcome)
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
