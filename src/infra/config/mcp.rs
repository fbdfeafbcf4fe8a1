//! `[mcp]`: whether users may add their own HTTP/SSE MCP servers, and where they may point.

use serde::{Deserialize, Serialize};

/// Users' own MCP servers (the user_mcp module).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct McpConfig {
    /// Whether users may add HTTP/SSE MCP servers to their sessions (default `true`).
    pub user_servers: bool,
    /// When not empty, the only hosts their URLs may name: `example.com` exactly, or
    /// `*.example.com` for its subdomains.
    pub allowed_hosts: Vec<String>,
}

impl Default for McpConfig {
    fn default() -> Self {
        Self {
            user_servers: true,
            allowed_hosts: Vec::new(),
        }
    }
}

impl McpConfig {
    /// Whether `host` may be named by a user's server URL.
    pub fn host_allowed(&self, host: &str) -> bool {
        self.allowed_hosts.is_empty() || host_matches(&self.allowed_hosts, host)
    }

    pub(super) fn validate(&self) -> Result<(), super::ConfigError> {
        check_host_patterns("mcp.allowed_hosts", &self.allowed_hosts)
    }
}

/// Whether `host` is one of `patterns`: `example.com` exactly, or `*.example.com` for its
/// subdomains (any case).
pub fn host_matches(patterns: &[String], host: &str) -> bool {
    let host = host.to_ascii_lowercase();
    patterns.iter().any(|pattern| {
        let pattern = pattern.to_ascii_lowercase();
        match pattern.strip_prefix("*.") {
            Some(domain) => host
                .strip_suffix(domain)
                .is_some_and(|sub| sub.ends_with('.') && sub.len() > 1),
            None => host == pattern,
        }
    })
}

/// Refuses a host pattern that is not `example.com` or `*.example.com`, naming `setting`.
pub(super) fn check_host_patterns(setting: &str, patterns: &[String]) -> Result<(), super::ConfigError> {
    for host in patterns {
        let bare = host.strip_prefix("*.").unwrap_or(host);
        if bare.is_empty() || bare.contains(['/', ':', '*', ' ']) {
            return Err(super::ConfigError::Invalid(format!(
                "{setting}: {host:?} is not a host name (write example.com or *.example.com)"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_match_exactly_or_as_subdomains() {
        let any = McpConfig::default();
        assert!(any.host_allowed("evil.example"));
        let c = McpConfig {
            allowed_hosts: vec!["mcp.example.com".into(), "*.tools.example".into()],
            ..Default::default()
        };
        assert!(c.host_allowed("MCP.example.com"));
        assert!(c.host_allowed("a.tools.example"));
        assert!(!c.host_allowed("tools.example"));
        assert!(!c.host_allowed("eviltools.example"));
        assert!(!c.host_allowed("mcp.example.com.evil"));
        assert!(c.validate().is_ok());
        let bad = McpConfig {
            allowed_hosts: vec!["https://x".into()],
            ..Default::default()
        };
        assert!(
            bad.validate()
                .expect_err("not a host")
                .to_string()
                .contains("mcp.allowed_hosts")
        );
    }
}
