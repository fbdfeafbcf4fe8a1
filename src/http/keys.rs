//! `PUT`/`DELETE /api/agents/{agent}/keys`: a user signs their own agent in with the keys its
//! `env_var` methods ask for, or out again. Values are sealed at rest ([`crate::settings::secrets`]),
//! given only to that user's processes of that agent (which are recycled so they take effect),
//! never logged and never returned: `/api/agents` shows only their names and when they were set.

use crate::agents::pool::Pools;
use crate::audit::Audit;
use crate::settings::secrets::Keys;
use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::put;
use axum::{Json, Router};
use secrecy::SecretString;
use serde::Deserialize;

use super::auth::{Caller, audit};
use super::error::refuse;
use crate::agents::pool::AgentPool;
use crate::agents::pool::user_env::user_may_set;
use crate::gateway::Gateway;

/// Longest value a user may give (API keys are a few hundred bytes).
const MAX_VALUE_BYTES: usize = 8 * 1024;

pub(super) fn router() -> Router<Gateway> {
    Router::new().route("/api/agents/{agent}/keys", put(set_keys).delete(sign_out))
}

/// `PUT`'s body: the method the agent described, and a value for each of its variables.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SetKeys {
    #[serde(rename = "methodId")]
    method_id: String,
    vars: BTreeMap<String, SecretString>,
}

/// Why a user may not sign an agent in: the status and the reason.
type Refusal = (StatusCode, String);

/// The pool of `agent` when a user may give it keys, else the answer saying why not.
fn pool_for_user_keys<'a>(pools: &'a Pools, agent: &str) -> Result<&'a Arc<AgentPool>, Refusal> {
    let pool = pool_for_user(pools, agent)?;
    if !pool.config().user_keys {
        return Err((
            StatusCode::FORBIDDEN,
            format!("this gateway does not take users' own keys for agent {agent} (agents.{agent}.user_keys = false)"),
        ));
    }
    Ok(pool)
}

/// The pool of `agent` when a user may sign it in or out, else the answer saying why not.
fn pool_for_user<'a>(pools: &'a Pools, agent: &str) -> Result<&'a Arc<AgentPool>, Refusal> {
    let pool = pools
        .get(agent)
        .ok_or_else(|| (StatusCode::NOT_FOUND, format!("no agent named {agent:?}")))?;
    if pool.is_shared() {
        return Err((
            StatusCode::CONFLICT,
            format!(
                "agent {agent} serves several users from one process (share_between_users), which carries the operator's credentials: users cannot sign it in"
            ),
        ));
    }
    Ok(pool)
}

/// The variables `method_id` asks for, when it is one of the agent's `env_var` methods.
fn method_vars(auth_methods: Option<&serde_json::Value>, method_id: &str) -> Option<Vec<String>> {
    let method = auth_methods?
        .as_array()?
        .iter()
        .find(|m| m["id"] == method_id && m["type"] == "env_var")?;
    Some(
        method["vars"]
            .as_array()?
            .iter()
            .filter_map(|v| v["name"].as_str().map(String::from))
            .collect(),
    )
}

async fn set_keys(
    State(audit_log): State<Arc<Audit>>,
    State(pools): State<Arc<Pools>>,
    State(keys): State<Arc<Keys>>,
    Caller(who): Caller,
    Path(agent): Path<String>,
    Json(body): Json<SetKeys>,
) -> Response {
    let pool = match pool_for_user_keys(&pools, &agent) {
        Ok(pool) => pool,
        Err((status, message)) => return refuse(status, message),
    };
    let user: Arc<str> = Arc::from(who.user.as_str());
    let info = match pool.own_info(&user).await {
        Ok(info) => info,
        Err(e) => {
            return refuse(
                StatusCode::BAD_GATEWAY,
                format!("agent {agent} did not start: {}", e.message),
            );
        }
    };
    let Some(allowed) = method_vars(info.auth_methods.as_ref(), &body.method_id) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            format!("agent {agent} has no env_var sign-in method {:?}", body.method_id),
        );
    };
    if body.vars.is_empty() {
        return refuse(StatusCode::BAD_REQUEST, "no variables given");
    }
    let mut vars = Vec::with_capacity(body.vars.len());
    for (name, value) in body.vars {
        let text = secrecy::ExposeSecret::expose_secret(&value);
        if !allowed.contains(&name) {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!(
                    "method {:?} of agent {agent} does not ask for {name:?} (it asks for {allowed:?})",
                    body.method_id
                ),
            );
        }
        if !user_may_set(&name) {
            return refuse(StatusCode::BAD_REQUEST, format!("{name:?} cannot be set by a user"));
        }
        if text.is_empty() || text.len() > MAX_VALUE_BYTES || text.chars().any(char::is_control) {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("the value of {name} must be 1 to {MAX_VALUE_BYTES} bytes with no control characters"),
            );
        }
        vars.push((name, value));
    }
    if let Err(e) = keys.set(&who.user, &agent, &vars).await {
        tracing::error!(user = %who.user, agent = %agent, error = %e, "cannot store the user's agent keys");
        crate::infra::metrics::signin(&agent, "env_var", "error");
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "the keys could not be stored; try again",
        );
    }
    crate::infra::metrics::signin(&agent, "env_var", "ok");
    let recycled = pool.recycle_user(&who.user);
    let names: Vec<&str> = vars.iter().map(|(n, _)| n.as_str()).collect();
    tracing::info!(user = %who.user, agent = %agent, method = %body.method_id, method_type = "env_var", vars = ?names, recycled, outcome = "ok", "agent sign-in");
    audit(
        &audit_log,
        None,
        &who.user,
        "agent_sign_in",
        Some(&agent),
        "ok",
        Some(serde_json::json!({ "method": body.method_id, "methodType": "env_var", "vars": names })),
    );
    StatusCode::NO_CONTENT.into_response()
}

/// Sign-out: the agent's own logout runs, the user's keys for the agent and the record of their
/// login there are removed, and their processes recycled (whether or not they may set keys).
async fn sign_out(
    State(audit_log): State<Arc<Audit>>,
    State(pools): State<Arc<Pools>>,
    State(keys): State<Arc<Keys>>,
    Caller(who): Caller,
    Path(agent): Path<String>,
) -> Response {
    let pool = match pool_for_user(&pools, &agent) {
        Ok(pool) => pool,
        Err((status, message)) => return refuse(status, message),
    };
    logout(pool, &who.user).await;
    let removed = match keys.remove(&who.user, &agent).await {
        Ok(n) => n,
        Err(e) => {
            tracing::error!(user = %who.user, agent = %agent, error = %e, "cannot remove the user's agent keys");
            return refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "the keys could not be removed; try again",
            );
        }
    };
    let recycled = pool.recycle_user(&who.user);
    tracing::info!(user = %who.user, agent = %agent, removed, recycled, outcome = "ok", "agent sign-out");
    audit(
        &audit_log,
        None,
        &who.user,
        "agent_sign_out",
        Some(&agent),
        "ok",
        Some(serde_json::json!({ "keysRemoved": removed })),
    );
    StatusCode::NO_CONTENT.into_response()
}

/// The agent's own `logout`, where it has one (`agentCapabilities.auth.logout`), sent to the
/// user's own process: what the agent keeps of a login (in the user's HOME) goes too. Its outcome
/// is logged; sign-out goes on either way.
async fn logout(pool: &AgentPool, user: &str) {
    let user: Arc<str> = Arc::from(user);
    let Ok(info) = pool.own_info(&user).await else { return };
    let supported = info
        .capabilities
        .get("auth")
        .and_then(|a| a.get("logout"))
        .is_some_and(|v| !v.is_null());
    if !supported {
        return;
    }
    let outcome = match pool.process_for(&user).await {
        Ok(p) => p.request("logout", "{}", pool.request_timeout()).await.map(|_| ()),
        Err(e) => Err(e),
    };
    match outcome {
        Ok(()) => tracing::info!(user = %user, agent = %pool.name, "agent logout"),
        Err(e) => tracing::warn!(user = %user, agent = %pool.name, error = %e.message, "agent logout failed"),
    }
}
