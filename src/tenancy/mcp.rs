//! Which MCP servers a client may hand an agent in `session/new` (the contract's "MCP servers
//! from clients").

use agent_client_protocol_schema::v1::McpServer;

use crate::infra::config::AgentConfig;

/// What kinds of MCP server an agent said it can connect to (`mcpCapabilities`).
#[derive(Debug, Clone, Copy, Default)]
pub struct McpTransports {
    /// `mcpCapabilities.http`.
    pub http: bool,
    /// `mcpCapabilities.sse`.
    pub sse: bool,
}

/// Checks a client's `mcpServers` before they reach `agent`: a `stdio` entry is a command the
/// agent runs on this host, so only commands in `allowed_stdio_mcp` pass; `http`/`sse` entries
/// pass when the agent advertises that transport. The error names the refused entry.
pub fn check_mcp_servers(servers: &[McpServer], agent: &AgentConfig, can: McpTransports) -> Result<(), McpRefused> {
    for (index, server) in servers.iter().enumerate() {
        match server {
            McpServer::Stdio(stdio) => {
                let command = stdio.command.to_string_lossy();
                if !agent.allowed_stdio_mcp.iter().any(|c| *c == command) {
                    return Err(McpRefused::Stdio {
                        index,
                        name: stdio.name.clone(),
                        command: command.into_owned(),
                        allowed: agent.allowed_stdio_mcp.clone(),
                    });
                }
            }
            McpServer::Http(_) if can.http => {}
            McpServer::Sse(_) if can.sse => {}
            McpServer::Http(http) => {
                return Err(McpRefused::Transport {
                    index,
                    name: http.name.clone(),
                    transport: "http",
                });
            }
            McpServer::Sse(sse) => {
                return Err(McpRefused::Transport {
                    index,
                    name: sse.name.clone(),
                    transport: "sse",
                });
            }
            _ => return Err(McpRefused::Unknown { index }),
        }
    }
    Ok(())
}

/// Why an entry of a client's `mcpServers` does not reach the agent; the message names it.
#[derive(Debug, thiserror::Error)]
pub enum McpRefused {
    /// A command not in `allowed_stdio_mcp`.
    #[error(
        "mcpServers[{index}] ({name:?}): stdio MCP server {command:?} is not allowed on this gateway (allowed: {allowed:?})"
    )]
    Stdio {
        /// Its place in the list.
        index: usize,
        /// Its name.
        name: String,
        /// The command it would run.
        command: String,
        /// The commands allowed.
        allowed: Vec<String>,
    },
    /// A transport the agent did not say it can use.
    #[error("mcpServers[{index}] ({name:?}): this agent does not support {transport} MCP servers")]
    Transport {
        /// Its place in the list.
        index: usize,
        /// Its name.
        name: String,
        /// `http` or `sse`.
        transport: &'static str,
    },
    /// A transport this gateway does not know.
    #[error("mcpServers[{index}]: an MCP transport this gateway does not pass on")]
    Unknown {
        /// Its place in the list.
        index: usize,
    },
}

/// Whether `servers` (an ACP `mcpServers` JSON array, as given to an agent) carry secrets: an
/// entry with headers (http, sse) or environment variables (stdio). Unreadable: assumed to.
pub fn carry_secrets(servers: &str) -> bool {
    if servers.trim().is_empty() {
        return false;
    }
    let Ok(all) = serde_json::from_str::<Vec<serde_json::Value>>(servers) else {
        return true;
    };
    all.iter().any(|s| {
        ["headers", "env"].iter().any(|k| {
            s.get(k)
                .and_then(serde_json::Value::as_array)
                .is_some_and(|a| !a.is_empty())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdio_mcp_servers_need_the_allow_list() {
        let mut agent = AgentConfig::default();
        let stdio = serde_json::json!([{"name":"x","command":"/bin/sh","args":["-c","id"],"env":[]}]);
        let http = serde_json::json!([{"type":"http","name":"h","url":"http://127.0.0.1:1/","headers":[]}]);
        let servers = |v: &serde_json::Value| -> Vec<McpServer> { serde_json::from_value(v.clone()).expect("schema") };
        let none = McpTransports::default();
        let refused = check_mcp_servers(&servers(&stdio), &agent, none).expect_err("not allowed");
        assert_eq!(
            refused.to_string(),
            "mcpServers[0] (\"x\"): stdio MCP server \"/bin/sh\" is not allowed on this gateway (allowed: [])"
        );
        let refused = check_mcp_servers(&servers(&http), &agent, none).expect_err("no http");
        assert_eq!(
            refused.to_string(),
            "mcpServers[0] (\"h\"): this agent does not support http MCP servers"
        );
        assert!(check_mcp_servers(&servers(&http), &agent, McpTransports { http: true, sse: false }).is_ok());
        agent.allowed_stdio_mcp = vec!["/bin/sh".into()];
        assert!(check_mcp_servers(&servers(&stdio), &agent, none).is_ok());
        let typed = serde_json::json!([{"type":"stdio","name":"x","command":"/bin/bash","args":[],"env":[]}]);
        assert!(check_mcp_servers(&servers(&typed), &agent, none).is_err());
    }

    #[test]
    fn servers_with_headers_or_env_carry_secrets() {
        assert!(!carry_secrets("[]"));
        assert!(!carry_secrets(
            r#"[{"type":"http","name":"a","url":"https://x","headers":[]}]"#
        ));
        assert!(!carry_secrets(r#"[{"name":"a","command":"t","args":[],"env":[]}]"#));
        assert!(carry_secrets(
            r#"[{"type":"http","name":"a","url":"https://x","headers":[{"name":"Authorization","value":"s"}]}]"#
        ));
        assert!(carry_secrets(
            r#"[{"name":"a","command":"t","args":[],"env":[{"name":"K","value":"v"}]}]"#
        ));
        assert!(carry_secrets("not json"), "unreadable: assumed to");
    }
}
