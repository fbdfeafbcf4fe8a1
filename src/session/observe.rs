//! What a session tells the features that watch it, without knowing them: start-up hands each
//! session what records spend ([`UpdateObserver`]), what tells the owner's devices ([`Notifier`])
//! and what adds a user's own MCP servers when a session is restored ([`UserServers`]).

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;

use crate::store::sealed_list::ListError;
use crate::tenancy::McpTransports;

/// Reads each update an agent sends in a session, as it is published.
pub trait UpdateObserver: Send + Sync + Debug {
    /// `update` (the agent's `update` object) of `owner`'s `session` on `agent`.
    fn update(&self, owner: &str, agent: &str, session: &str, update: &str);
}

/// Something the owner may want to hear of on a device when no tab of theirs shows the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attention {
    /// The agent asks for a permission.
    Permission,
    /// The agent asks for a form to be filled in.
    Elicitation,
    /// A turn ended.
    TurnEnded,
    /// A turn failed or was cancelled.
    TurnFailed,
}

/// Tells the owner's devices.
pub trait Notifier: Send + Sync + Debug {
    /// `what` happened in `owner`'s `session`; `asked` is what the agent asks (a permission's
    /// tool call title, a form's message). Never waits.
    fn notify(self: Arc<Self>, owner: &Arc<str>, session: &Arc<str>, what: Attention, asked: Option<String>);
}

/// A user's own MCP servers, given to the agent with those the session was accepted with.
#[async_trait]
pub trait UserServers: Send + Sync + Debug {
    /// `accepted` (an `mcpServers` JSON array) with `owner`'s own servers of the transports the
    /// agent `can` take added.
    async fn with_users_servers(&self, owner: &str, can: McpTransports, accepted: &str) -> Result<String, ListError>;
}
