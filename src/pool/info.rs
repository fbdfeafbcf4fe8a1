//! What an agent said about itself in `initialize`, kept raw, with the capabilities the gateway
//! reads from it.

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
