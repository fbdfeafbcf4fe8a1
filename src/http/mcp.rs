//! `/api/mcp-servers`: a user's own HTTP/SSE MCP servers (see [`crate::settings::user_mcp`]).
//!
//! - `GET` → `{"enabled", "allowedHosts", "servers": [{"name", "type", "url", "headers": [NAME]}]}`:
//!   header names, never their values.
//! - `PUT /api/mcp-servers/{name}` `{"type": "http"|"sse", "url", "headers": [{"name", "value"}]}`
//!   → `204`; a header without `value` keeps the one stored under its name. `400` names what is
//!   wrong, `403` when the operator turned users' servers off.
//! - `DELETE /api/mcp-servers/{name}` → `204`, `404` when there is none.
//!
//! They take effect for sessions started or restored afterwards.

use crate::audit::Audit;
use crate::settings::user_mcp::UserMcp;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Extension, Json, Router};
use serde::Deserialize;

use super::auth::{Caller, audit};
use super::error::{list_refusal, refuse};
use super::server::Peer;
use crate::gateway::Gateway;

pub(super) fn router() -> Router<Gateway> {
    Router::new()
        .route("/api/mcp-servers", get(list))
        .route("/api/mcp-servers/{name}", put(set).delete(remove))
}

/// `PUT`'s body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SetServer {
    #[serde(rename = "type")]
    kind: String,
    url: String,
    #[serde(default)]
    headers: Vec<SetHeader>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SetHeader {
    name: String,
    /// `None`: keep the stored value.
    #[serde(default)]
    value: Option<String>,
}

async fn list(State(user_mcp): State<Arc<UserMcp>>, Caller(who): Caller) -> Response {
    match user_mcp.list(&who.user).await {
        Ok(servers) => Json(serde_json::json!({
            "enabled": user_mcp.enabled(),
            "allowedHosts": user_mcp.allowed_hosts(),
            "servers": servers,
        }))
        .into_response(),
        Err(e) => list_refusal(&who.user, e),
    }
}

async fn set(
    State(audit_log): State<Arc<Audit>>,
    State(user_mcp): State<Arc<UserMcp>>,
    Caller(who): Caller,
    peer: Option<Extension<Peer>>,
    Path(name): Path<String>,
    Json(body): Json<SetServer>,
) -> Response {
    let headers = body.headers.into_iter().map(|h| (h.name, h.value)).collect();
    if let Err(e) = user_mcp.put(&who.user, &name, body.kind, body.url, headers).await {
        return list_refusal(&who.user, e);
    }
    tracing::info!(user = %who.user, server = %name, "MCP server saved");
    audit(
        &audit_log,
        peer.as_deref(),
        &who.user,
        "mcp_server_set",
        Some(&name),
        "ok",
        None,
    );
    StatusCode::NO_CONTENT.into_response()
}

async fn remove(
    State(audit_log): State<Arc<Audit>>,
    State(user_mcp): State<Arc<UserMcp>>,
    Caller(who): Caller,
    peer: Option<Extension<Peer>>,
    Path(name): Path<String>,
) -> Response {
    match user_mcp.remove(&who.user, &name).await {
        Ok(true) => {
            audit(
                &audit_log,
                peer.as_deref(),
                &who.user,
                "mcp_server_remove",
                Some(&name),
                "ok",
                None,
            );
            StatusCode::NO_CONTENT.into_response()
        }
        Ok(false) => refuse(StatusCode::NOT_FOUND, format!("you have no MCP server named {name:?}")),
        Err(e) => list_refusal(&who.user, e),
    }
}
