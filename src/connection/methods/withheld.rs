//! What of an owner's secrets a teammate's turn does not get (docs/protocol.md, sharing): the agent keys
//! the owner stored (`user_keys`, sealed, given to the owner's agent processes as environment
//! variables) and the secret headers (or environment) of the MCP servers the session's agent was
//! given. A process's environment, and what an agent was told at a session's start, cannot be
//! taken back for one turn, so a controller's prompt for an agent that carries either is refused
//! with `-32600` (`data.reason: "owner_keys"`) unless a share of theirs lends them (`ownerKeys`).
//! What no setting can withhold (the owner's `HOME`, its agent logins, their workspaces) the
//! Share dialog says.

use super::*;
use crate::sharing::Role;

/// What the agent serving a session carries of its owner's secrets.
#[derive(Debug, Default, Clone, Copy)]
struct Carried {
    /// The owner's stored agent keys, in its environment.
    keys: bool,
    /// MCP servers with headers or environment variables.
    mcp: bool,
}

/// What `session`'s agent carries of its owner's secrets, or would once restored: their keys for
/// its agent, and MCP servers with secrets (the ones it was given, the ones stored with the
/// session, and the owner's own as they are now).
async fn carried(gw: &Gateway, session: &LiveSession) -> Result<Carried, RpcError> {
    let Some(pool) = gw.agents.pools.get(&session.agent) else {
        return Ok(Carried::default());
    };
    let owner = &session.owner;
    // Only a process of the owner's gets their keys (a shared agent's processes are nobody's).
    let keys = pool.config().user_keys
        && !pool.is_shared()
        && gw
            .settings
            .keys
            .list(owner)
            .await?
            .iter()
            .any(|k| *k.agent == *session.agent);
    let mut mcp = session.mcp_secrets_given() || crate::tenancy::carry_secrets(&session.restore.mcp_servers);
    if !mcp && gw.settings.user_mcp.enabled() {
        let info = pool.info_for(owner).await?;
        mcp = gw
            .settings
            .user_mcp
            .has_headers(owner, info.mcp_transports())
            .await
            .map_err(|e| RpcError::internal(e.to_string()))?;
    }
    Ok(Carried { keys, mcp })
}

/// Whether `teammate` may start a turn of `session` (another user's): refused when its agent
/// carries the owner's secrets and no share of the teammate's lends them. Audited as
/// `share_refused` when refused (`connection`: theirs, when they are connected here).
pub(super) async fn teammate_may_prompt(
    gw: &Gateway,
    session: &LiveSession,
    teammate: &str,
    connection: Option<&str>,
) -> Result<(), RpcError> {
    let carried = carried(gw, session).await?;
    if !carried.keys && !carried.mcp {
        return Ok(());
    }
    let access = gw.shares.access(teammate, &session.id).await?;
    if let Some(a) = &access
        && Role::of(&a.role) == Role::Controller
        && a.owner_keys
    {
        return Ok(());
    }
    gw.audit.record(crate::audit::Event {
        actor: teammate,
        action: "share_refused",
        target: Some(&session.id),
        outcome: "refused",
        detail: Some(json!({
            "method": "session/prompt",
            "reason": "owner_keys",
            "share": access.map(|a| a.share_id),
            "keys": carried.keys,
            "mcpHeaders": carried.mcp,
        })),
        connection,
        client: None,
    });
    Err(crate::sharing::owner_keys_refused(
        &session.owner,
        carried.keys,
        carried.mcp,
    ))
}
