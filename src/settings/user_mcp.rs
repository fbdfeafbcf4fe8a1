//! Users' own MCP servers (HTTP and SSE): a list each user keeps in the web UI's settings
//! (`/api/mcp-servers`), added to `mcpServers` of every session of theirs, new and restored, for
//! agents that advertise the transport. A client's own entry of the same name wins.
//!
//! The list is sealed at rest like agent keys ([`crate::infra::sealing::Sealer`]): one row of
//! `user_secrets` per user, under the pseudo-agent [`ROW_AGENT`] (no agent may be named so), so
//! URLs and header values are ciphertext in the database, and no route returns a header's value:
//! the list shows header names only. The values reach only that user's agent processes, in the
//! `session/new`, `session/load` or `session/resume` the gateway sends. Sessions store only what
//! their client sent, never these.
//!
//! Operators may turn it off (`[mcp] user_servers = false`) or allow only listed hosts
//! (`[mcp] allowed_hosts`); both are checked again each time a session starts, so a server added
//! before the operator tightened them is no longer given to agents. Stdio servers stay
//! operator-only (`allowed_stdio_mcp`).

use serde::{Deserialize, Serialize};

use crate::infra::config::McpConfig;
use crate::infra::sealing::Sealer;
use crate::store::SealedRows;
use crate::store::sealed_list::SealedList;
use crate::tenancy::McpTransports;

/// The `user_secrets.agent` of the row that holds a user's list.
pub const ROW_AGENT: &str = "/mcp";
/// Its `name`.
const ROW_NAME: &str = "servers";
/// Most servers one user keeps.
pub const MAX_SERVERS: usize = 16;
/// Most headers one server has.
const MAX_HEADERS: usize = 16;
/// Longest header value, URL or name.
const MAX_VALUE_BYTES: usize = 8 * 1024;

/// One header: its value is a secret (an API key, a bearer token). Never `Debug`-printed.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Header {
    /// The header's name.
    pub name: String,
    /// Its value.
    pub value: String,
}

impl std::fmt::Debug for Header {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Header")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// One of a user's servers.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct UserServer {
    /// Its name (what the agent calls its tools by).
    pub name: String,
    /// `http` or `sse`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Where it listens.
    pub url: String,
    /// Headers sent with every request (credentials, usually).
    #[serde(default)]
    pub headers: Vec<Header>,
}

/// A server as its user sees it in the list: header names, never values.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Listed {
    /// Its name.
    pub name: String,
    /// `http` or `sse`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Where it listens.
    pub url: String,
    /// Its headers' names.
    pub headers: Vec<String>,
}

/// Why a request about a user's servers failed.
pub type UserMcpError = crate::store::sealed_list::ListError;

/// What `put` answers when the operator turned users' servers off.
const OFF: &str = "this gateway does not take users' own MCP servers ([mcp] user_servers = false)";

/// Users' servers, sealed in the store.
#[derive(Debug)]
pub struct UserMcp {
    list: SealedList,
    config: McpConfig,
}

/// Whether `name` is a header name (RFC 9110 token).
fn is_token(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

impl UserMcp {
    /// Servers kept in `store`, sealed by `sealer`, as `config` allows.
    pub fn new(store: SealedRows, sealer: Sealer, config: McpConfig) -> Self {
        Self {
            list: SealedList::new(store, sealer, ROW_AGENT, ROW_NAME, "your MCP servers"),
            config,
        }
    }

    /// Whether users may have servers at all.
    pub fn enabled(&self) -> bool {
        self.config.user_servers
    }

    /// The hosts their URLs may name (empty: any).
    pub fn allowed_hosts(&self) -> &[String] {
        &self.config.allowed_hosts
    }

    /// Checks a server as a user gives it; the error names what is wrong.
    pub fn check(&self, server: &UserServer) -> Result<(), UserMcpError> {
        check(&self.config, server)
    }

    /// `owner`'s servers, as stored.
    pub async fn servers(&self, owner: &str) -> Result<Vec<UserServer>, UserMcpError> {
        self.list.read(owner).await.map_err(UserMcpError::Unavailable)
    }

    /// `owner`'s servers as their list shows them.
    pub async fn list(&self, owner: &str) -> Result<Vec<Listed>, UserMcpError> {
        Ok(self
            .servers(owner)
            .await?
            .into_iter()
            .map(|s| Listed {
                headers: s.headers.into_iter().map(|h| h.name).collect(),
                name: s.name,
                kind: s.kind,
                url: s.url,
            })
            .collect())
    }

    /// Adds `server`, or replaces `owner`'s server of that name. A header given without a value
    /// (`None`) keeps the value stored under that name, so a user can edit a server without
    /// typing its secrets again.
    pub async fn put(
        &self,
        owner: &str,
        name: &str,
        kind: String,
        url: String,
        headers: Vec<(String, Option<String>)>,
    ) -> Result<(), UserMcpError> {
        if !self.enabled() {
            return Err(UserMcpError::Off(OFF));
        }
        let mut servers = self.servers(owner).await?;
        let old = servers.iter().find(|s| s.name == name);
        let headers = headers
            .into_iter()
            .map(|(hname, value)| {
                let value = match value {
                    Some(v) => v,
                    None => old
                        .and_then(|o| o.headers.iter().find(|h| h.name == hname))
                        .map(|h| h.value.clone())
                        .ok_or_else(|| UserMcpError::Invalid(format!("header {hname} needs a value")))?,
                };
                Ok(Header { name: hname, value })
            })
            .collect::<Result<Vec<_>, UserMcpError>>()?;
        let server = UserServer {
            name: name.to_string(),
            kind,
            url,
            headers,
        };
        self.check(&server)?;
        let full = servers.len() >= MAX_SERVERS;
        match servers.iter_mut().find(|s| s.name == name) {
            Some(slot) => *slot = server,
            None if full => {
                return Err(UserMcpError::Invalid(format!(
                    "you already have {MAX_SERVERS} MCP servers; remove one first"
                )));
            }
            None => servers.push(server),
        }
        self.save(owner, &servers).await
    }

    /// Removes `owner`'s server `name`; whether there was one.
    pub async fn remove(&self, owner: &str, name: &str) -> Result<bool, UserMcpError> {
        let mut servers = self.servers(owner).await?;
        let before = servers.len();
        servers.retain(|s| s.name != name);
        if servers.len() == before {
            return Ok(false);
        }
        self.save(owner, &servers).await?;
        Ok(true)
    }

    async fn save(&self, owner: &str, servers: &[UserServer]) -> Result<(), UserMcpError> {
        self.list.write(owner, servers).await.map_err(UserMcpError::Unavailable)
    }

    /// Whether `owner` has servers with headers that an agent with `can` takes (what its
    /// sessions would be given now).
    pub async fn has_headers(&self, owner: &str, can: McpTransports) -> Result<bool, UserMcpError> {
        let given = self.for_session(owner, can, &[]).await?;
        Ok(crate::tenancy::carry_secrets(
            &serde_json::Value::Array(given).to_string(),
        ))
    }

    /// The ACP `McpServer` entries of `owner`'s servers that an agent with `can` takes, for a
    /// session whose client already named `taken` (those names are left to the client's). What
    /// the operator no longer allows is left out.
    pub async fn for_session(
        &self,
        owner: &str,
        can: McpTransports,
        taken: &[String],
    ) -> Result<Vec<serde_json::Value>, UserMcpError> {
        if !self.enabled() {
            return Ok(Vec::new());
        }
        Ok(self
            .servers(owner)
            .await?
            .into_iter()
            .filter(|s| (s.kind == "http" && can.http) || (s.kind == "sse" && can.sse))
            .filter(|s| !taken.contains(&s.name))
            .filter(|s| self.check(s).is_ok())
            .map(|s| {
                serde_json::json!({
                    "type": s.kind, "name": s.name, "url": s.url,
                    "headers": s.headers.iter().map(|h| serde_json::json!({"name": h.name, "value": h.value})).collect::<Vec<_>>(),
                })
            })
            .collect())
    }
}

/// Checks a server as a user gives it against `config`; the error names what is wrong.
pub fn check(config: &McpConfig, server: &UserServer) -> Result<(), UserMcpError> {
    let invalid = |m: String| Err(UserMcpError::Invalid(m));
    let name = &server.name;
    if name.is_empty() || name.len() > 64 || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_. ".contains(c)) {
        return invalid(format!(
            "the name {name:?} must be 1 to 64 letters, digits, spaces, '-', '_' or '.'"
        ));
    }
    if server.kind != "http" && server.kind != "sse" {
        return invalid(format!(
            "type {:?}: only \"http\" and \"sse\" servers can be added here (stdio servers are the operator's: allowed_stdio_mcp)",
            server.kind
        ));
    }
    if server.url.len() > MAX_VALUE_BYTES {
        return invalid(format!("the URL is longer than {MAX_VALUE_BYTES} bytes"));
    }
    let url =
        url::Url::parse(&server.url).map_err(|e| UserMcpError::Invalid(format!("the URL {:?}: {e}", server.url)))?;
    if !matches!(url.scheme(), "http" | "https") {
        return invalid(format!("the URL must be http:// or https://, not {}://", url.scheme()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return invalid("the URL carries credentials: put them in a header, whose value is kept secret".into());
    }
    let host = url.host_str().unwrap_or_default();
    if !config.host_allowed(host) {
        return invalid(format!(
            "host {host:?} is not one this gateway allows for MCP servers ([mcp] allowed_hosts: {:?})",
            config.allowed_hosts
        ));
    }
    if server.headers.len() > MAX_HEADERS {
        return invalid(format!("at most {MAX_HEADERS} headers"));
    }
    for h in &server.headers {
        if !is_token(&h.name) || h.name.len() > 256 {
            return invalid(format!("{:?} is not a header name", h.name));
        }
        if h.value.is_empty() || h.value.len() > MAX_VALUE_BYTES || h.value.chars().any(char::is_control) {
            return invalid(format!(
                "the value of header {} must be 1 to {MAX_VALUE_BYTES} bytes with no control characters",
                h.name
            ));
        }
    }
    Ok(())
}

/// `mcpServers` (a JSON array, as accepted from a client) with `owner`'s own servers added.
pub async fn with_users_servers(
    user_mcp: &UserMcp,
    owner: &str,
    can: McpTransports,
    accepted: &str,
) -> Result<String, UserMcpError> {
    let mut all: Vec<serde_json::Value> = serde_json::from_str(accepted).unwrap_or_default();
    let taken: Vec<String> = all
        .iter()
        .filter_map(|s| s.get("name").and_then(serde_json::Value::as_str).map(str::to_string))
        .collect();
    let mine = user_mcp.for_session(owner, can, &taken).await?;
    if mine.is_empty() {
        return Ok(accepted.to_string());
    }
    all.extend(mine);
    serde_json::to_string(&all).map_err(|source| {
        UserMcpError::Unavailable(crate::store::sealed_list::SealedError::Encode {
            what: "your MCP servers",
            source,
        })
    })
}

#[async_trait::async_trait]
impl crate::session::UserServers for UserMcp {
    async fn with_users_servers(
        &self,
        owner: &str,
        can: McpTransports,
        accepted: &str,
    ) -> Result<String, UserMcpError> {
        with_users_servers(self, owner, can, accepted).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(url: &str) -> UserServer {
        UserServer {
            name: "tools".into(),
            kind: "http".into(),
            url: url.into(),
            headers: vec![Header {
                name: "Authorization".into(),
                value: "Bearer s3cret".into(),
            }],
        }
    }

    fn config(allowed: &[&str]) -> McpConfig {
        McpConfig {
            user_servers: true,
            allowed_hosts: allowed.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn refused(c: &McpConfig, s: &UserServer) -> String {
        match check(c, s) {
            Err(UserMcpError::Invalid(m)) => m,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn servers_are_checked_and_the_refusal_says_what_is_wrong() {
        let any = config(&[]);
        assert!(check(&any, &server("https://mcp.example.com/mcp")).is_ok());
        assert!(refused(&any, &server("ftp://x/")).contains("http:// or https://"));
        assert!(refused(&any, &server("https://u:p@x/")).contains("put them in a header"));
        assert!(refused(&any, &server("not a url")).contains("the URL"));
        let listed = config(&["*.example.com"]);
        assert!(check(&listed, &server("https://mcp.example.com/")).is_ok());
        assert!(refused(&listed, &server("http://127.0.0.1:9/")).contains("[mcp] allowed_hosts"));
        let mut s = server("https://mcp.example.com/");
        s.kind = "stdio".into();
        assert!(refused(&any, &s).contains("allowed_stdio_mcp"));
        let mut s = server("https://mcp.example.com/");
        s.headers[0].value = "a\nb".into();
        assert!(refused(&any, &s).contains("control characters"));
        let mut s = server("https://mcp.example.com/");
        s.headers[0].name = "Bad Name".into();
        assert!(refused(&any, &s).contains("not a header name"));
        let mut s = server("https://mcp.example.com/");
        s.name = "../x".into();
        assert!(refused(&any, &s).contains("letters, digits"));
    }

    #[test]
    fn a_header_value_never_shows_in_debug_output() {
        let s = server("https://mcp.example.com/");
        assert!(!format!("{s:?}").contains("s3cret"));
    }
}
