//! What an agent said about itself in `initialize`, kept raw, with the capabilities the gateway
//! reads from it.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::protocol::RpcError;
use crate::tenancy::McpTransports;

/// What an agent said about itself in `initialize`.
#[derive(Debug)]
pub struct AgentInfo {
    /// The whole `initialize` result, raw.
    pub result: Box<RawValue>,
    /// `agentCapabilities`.
    pub capabilities: serde_json::Map<String, serde_json::Value>,
    /// `agentInfo`, if given.
    pub agent_info: Option<serde_json::Value>,
    /// `authMethods`, if given.
    pub auth_methods: Option<serde_json::Value>,
}

impl AgentInfo {
    pub(super) fn parse(result: Box<RawValue>) -> Result<Self, RpcError> {
        #[derive(Deserialize)]
        struct Init {
            #[serde(rename = "agentCapabilities", default)]
            capabilities: serde_json::Map<String, serde_json::Value>,
            #[serde(rename = "agentInfo", default)]
            agent_info: Option<serde_json::Value>,
            #[serde(rename = "authMethods", default)]
            auth_methods: Option<serde_json::Value>,
        }
        let init: Init = serde_json::from_str(result.get())
            .map_err(|e| RpcError::internal(format!("agent's initialize result is malformed: {e}")))?;
        Ok(Self {
            result,
            capabilities: init.capabilities,
            agent_info: init.agent_info,
            auth_methods: init.auth_methods,
        })
    }

    /// Whether the agent itself supports `session/resume`.
    pub fn can_resume(&self) -> bool {
        self.capabilities
            .get("sessionCapabilities")
            .and_then(|c| c.get("resume"))
            .is_some_and(|v| !v.is_null())
    }

    /// Whether the agent itself supports the draft `session/fork` (`sessionCapabilities.fork`).
    pub fn can_fork(&self) -> bool {
        self.capabilities
            .get("sessionCapabilities")
            .and_then(|c| c.get("fork"))
            .is_some_and(|v| !v.is_null())
    }

    /// Whether the agent takes `resource` blocks in prompts (`promptCapabilities.embeddedContext`).
    pub fn takes_embedded_context(&self) -> bool {
        self.capabilities
            .get("promptCapabilities")
            .and_then(|c| c.get("embeddedContext"))
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false)
    }

    /// Whether the agent itself supports `session/load`.
    pub fn can_load(&self) -> bool {
        self.capabilities
            .get("loadSession")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false)
    }

    /// The MCP transports the agent advertises besides stdio.
    pub fn mcp_transports(&self) -> McpTransports {
        let mcp = self.capabilities.get("mcpCapabilities");
        let flag = |k: &str| {
            mcp.and_then(|m| m.get(k))
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(false)
        };
        McpTransports {
            http: flag("http"),
            sse: flag("sse"),
        }
    }

    /// Whether the agent itself supports `session/close`.
    pub fn can_close(&self) -> bool {
        self.capabilities
            .get("sessionCapabilities")
            .and_then(|c| c.get("close"))
            .is_some_and(|v| !v.is_null())
    }
}

impl super::AgentPool {
    /// What a live process of `user`'s own said in `initialize`, if they have one.
    pub(super) fn own_cached_info(&self, user: &str) -> Option<Arc<AgentInfo>> {
        let procs = self.procs.lock();
        procs
            .iter()
            .filter(|p| !p.is_dead() && p.owner().as_deref() == Some(user))
            .find_map(|p| p.info.get().cloned())
    }

    /// What `user`'s own process of this agent said in `initialize` (started for them when they
    /// have none): what the agent offers that user (their `env_var` keys, their sign-out), which
    /// their own agent may say differently from the answer every user is shown.
    pub async fn own_info(&self, user: &Arc<str>) -> Result<Arc<AgentInfo>, RpcError> {
        self.known_or_spawned(user, || self.own_cached_info(user)).await
    }

    /// What `known` says, else what `user`'s own process says once started for them (under the
    /// spawn gate, `known` asked again first); refused where this agent may not serve `user`.
    pub(super) async fn known_or_spawned(
        &self,
        user: &Arc<str>,
        known: impl Fn() -> Option<Arc<AgentInfo>>,
    ) -> Result<Arc<AgentInfo>, RpcError> {
        self.admit(user)?;
        if let Some(info) = known() {
            return Ok(info);
        }
        let _gate = self.spawn_gate.lock().await;
        if let Some(info) = known() {
            return Ok(info);
        }
        let p = self.spawn_locked(Some(user)).await?;
        p.info
            .get()
            .cloned()
            .ok_or_else(|| RpcError::internal("agent did not initialize"))
    }
}

/// The capabilities the gateway declares when it initializes an agent: the operator's
/// `client_capabilities` (default: no `fs`, no `terminal`: the agent uses its own tools), plus
/// what the gateway itself does for the agent's users, unless the operator said otherwise:
/// terminal sign-ins (`auth.terminal`, and `_meta["terminal-auth"]`, which claude-agent-acp asks
/// for before it describes its `claude /login` method) and both kinds of `elicitation`.
pub(super) fn client_capabilities(configured: Option<&serde_json::Value>) -> serde_json::Value {
    let mut caps = configured.cloned().unwrap_or_else(
        || serde_json::json!({ "fs": { "readTextFile": false, "writeTextFile": false }, "terminal": false }),
    );
    if let Some(map) = caps.as_object_mut() {
        map.entry("auth")
            .or_insert_with(|| serde_json::json!({ "terminal": true }));
        map.entry("elicitation")
            .or_insert_with(|| serde_json::json!({ "form": {}, "url": {} }));
        let meta = map.entry("_meta").or_insert_with(|| serde_json::json!({}));
        if let Some(meta) = meta.as_object_mut() {
            meta.entry("terminal-auth").or_insert(serde_json::Value::Bool(true));
        }
    }
    caps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateway_declares_terminal_sign_in_and_elicitation_unless_told_otherwise() {
        let caps = client_capabilities(None);
        assert_eq!(caps["auth"]["terminal"], true);
        assert_eq!(caps["_meta"]["terminal-auth"], true);
        assert_eq!(caps["elicitation"], serde_json::json!({ "form": {}, "url": {} }));
        assert_eq!(caps["fs"]["readTextFile"], false);
        let operator = serde_json::json!({ "terminal": true, "auth": { "terminal": false } });
        let caps = client_capabilities(Some(&operator));
        assert_eq!(caps["terminal"], true);
        assert_eq!(caps["auth"]["terminal"], false, "the operator's word stands");
    }
}
