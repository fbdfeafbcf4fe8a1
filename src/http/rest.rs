//! The REST API (`/api/*`) and the web UI's login (`/auth/*`).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use crate::api::{self, ListParams};
use crate::app::Gateway;
use crate::auth::extract::{COOKIE, Caller, Unauthorized};
use crate::auth::now_secs;
use crate::config::DEFAULT_AGENT;
use crate::protocol::{RpcError, codes};

pub(super) fn router() -> Router<Arc<Gateway>> {
    Router::new()
        .route("/api/me", get(me))
        .route("/api/agents", get(agents))
        .route("/api/sessions", get(sessions))
        .route("/api/sessions/{id}", delete(delete_session))
        .route("/auth/login", get(login))
        .route("/auth/logout", post(logout))
}

/// A JSON-RPC error as an HTTP answer.
fn http_error(e: RpcError) -> Response {
    let status = match e.code {
        codes::INVALID_PARAMS => StatusCode::BAD_REQUEST,
        codes::RESOURCE_NOT_FOUND => StatusCode::NOT_FOUND,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (status, Json(json!({ "error": e.message }))).into_response()
}

async fn me(Caller(who): Caller) -> Json<serde_json::Value> {
    Json(json!({ "user": who.user, "expiresAt": who.expires_at }))
}

async fn agents(State(gw): State<Arc<Gateway>>, Caller(_): Caller) -> Json<serde_json::Value> {
    let mut out = Vec::new();
    for (name, pool) in gw.pools.iter() {
        let info = match tokio::time::timeout(Duration::from_secs(30), pool.info()).await {
            Ok(Ok(info)) => Ok(info),
            Ok(Err(e)) => Err(e.message.to_string()),
            Err(_) => Err(String::from("timed out starting the agent")),
        };
        out.push(match info {
            Ok(info) => json!({
                "name": name, "default": name == DEFAULT_AGENT,
                "capabilities": info.capabilities, "agentInfo": info.agent_info, "authMethods": info.auth_methods,
            }),
            Err(e) => json!({ "name": name, "default": name == DEFAULT_AGENT, "capabilities": null, "error": e }),
        });
    }
    Json(json!({ "agents": out }))
}

async fn sessions(State(gw): State<Arc<Gateway>>, Caller(who): Caller, Query(q): Query<ListParams>) -> Response {
    match api::list(&gw, &who.user, q).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => http_error(e),
    }
}

async fn delete_session(State(gw): State<Arc<Gateway>>, Caller(who): Caller, Path(id): Path<String>) -> Response {
    match api::delete_session(&gw, &who.user, &id).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => http_error(e),
    }
}

#[derive(Deserialize)]
struct LoginQuery {
    token: String,
}

/// Trades a token in the URL for an HttpOnly cookie, then sends the browser to the UI.
async fn login(State(gw): State<Arc<Gateway>>, Query(q): Query<LoginQuery>) -> Response {
    let Ok(who) = gw.auth.verify(&q.token) else {
        return Unauthorized.into_response();
    };
    let max_age = who.expires_at.saturating_sub(now_secs());
    let cookie = format!(
        "{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}",
        q.token
    );
    ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response()
}

async fn logout() -> Response {
    let cookie = format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    (StatusCode::NO_CONTENT, [(header::SET_COOKIE, cookie)]).into_response()
}
