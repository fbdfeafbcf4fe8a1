//! `GET /acp`: authenticate, pick the agent, upgrade, and hand the socket to the bridge.

use std::sync::Arc;

use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use serde_json::json;

use super::auth::authenticate;
use crate::gateway::Gateway;
use crate::infra::config::DEFAULT_AGENT;

/// Initial read buffer of each WebSocket.
const READ_BUFFER_BYTES: usize = 8 * 1024;

/// Response header naming the connection (transport RFD).
pub const CONNECTION_ID_HEADER: &str = "acp-connection-id";
/// Cookie naming the replica a client was upgraded on (for load balancers' affinity).
pub const AFFINITY_COOKIE: &str = "acp_replica";

pub(super) fn router() -> Router<Gateway> {
    Router::new().route("/acp", get(upgrade))
}

#[derive(Debug, Deserialize)]
struct AcpQuery {
    agent: Option<String>,
}

fn refuse(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({ "error": message }))).into_response()
}

async fn upgrade(
    State(gw): State<Gateway>,
    peer: Option<axum::Extension<super::server::Peer>>,
    headers: HeaderMap,
    uri: axum::http::Uri,
    q: Result<Query<AcpQuery>, QueryRejection>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    // Authentication comes first: no token, no upgrade, whatever else is wrong.
    let identity = match authenticate(&gw.identity, &headers, uri.query()).await {
        Ok(identity) => identity,
        Err(unauthorized) => {
            crate::infra::metrics::connection_refused("unauthenticated");
            return unauthorized.into_response();
        }
    };
    let ws = match ws {
        Ok(ws) => ws,
        Err(rejection) => return rejection.into_response(),
    };
    if let Some(sid) = &identity.session
        && let Err(e) = gw.identity.devices.used(sid).await
    {
        // The web UI's list shows an older last use; nothing else depends on it.
        tracing::debug!(error = %e, "cannot note a device's last use");
    }
    let Ok(Query(q)) = q else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "the query string is malformed (`?agent=NAME`, at most once)",
        );
    };
    let agent = q.agent.as_deref().unwrap_or(DEFAULT_AGENT);
    let Some(pool) = gw.agents.pools.get(agent).cloned() else {
        crate::infra::metrics::connection_refused("unknown_agent");
        return refuse(StatusCode::NOT_FOUND, &format!("unknown agent {agent:?}"));
    };
    if gw.life.is_draining() {
        crate::infra::metrics::connection_refused("draining");
        return refuse(StatusCode::SERVICE_UNAVAILABLE, "gateway is shutting down");
    }
    // Behind a trusted proxy, the proxy's client is capped per address like a direct one.
    let forwarded_slot = match peer.as_ref().map(|p| p.forwarded_slot(&headers)) {
        Some(Err(too_many)) => {
            crate::infra::metrics::connection_refused("per_ip");
            tracing::info!(client = %too_many.0, "too many connections from one forwarded address");
            return refuse(StatusCode::TOO_MANY_REQUESTS, "too many connections from your address");
        }
        Some(Ok(slot)) => slot,
        None => None,
    };
    let Ok(slot) = gw.life.connection_slots.clone().try_acquire_owned() else {
        crate::infra::metrics::connection_refused("max_connections");
        return refuse(StatusCode::SERVICE_UNAVAILABLE, "too many connections");
    };
    // The client's address, for the audit log.
    let client_addr: Option<Arc<str>> = peer.as_ref().map(|p| Arc::from(p.client.to_string()));
    // Refused before the upgrade: a user at their cap holds no more sockets.
    let user_slot = match gw.agents.quotas.connect(&identity.user) {
        Ok(user_slot) => user_slot,
        Err(cap) => {
            crate::infra::metrics::connection_refused("per_user");
            let peer = peer.as_ref().map(|p| p.addr.to_string()).unwrap_or_default();
            tracing::info!(user = %identity.user, peer, cap = cap.cap, "per-user cap reached");
            gw.audit
                .cap_refused(&identity.user, cap.cap, None, client_addr.as_deref().map(String::from));
            let body = json!({ "error": cap.message(), "cap": cap.cap, "limit": cap.limit });
            return (StatusCode::TOO_MANY_REQUESTS, axum::Json(body)).into_response();
        }
    };
    let conn_id: Arc<str> = Arc::from(format!("{}-{}", gw.life.replica, uuid::Uuid::new_v4().simple()));
    let limits = &gw.config.limits;
    let tracked = gw.life.tracker.token();
    let id = conn_id.clone();
    let state = gw.clone();
    let mut response = ws
        .protocols(["acp"])
        .max_message_size(limits.max_frame_bytes)
        .max_frame_size(limits.max_frame_bytes)
        // tungstenite's default read buffer is 128 KiB per socket, zero-filled on first read:
        // 10,000 idle clients held 1.4 GiB. A larger frame still gets the room it needs.
        .read_buffer_size(READ_BUFFER_BYTES)
        .on_failed_upgrade(|e| tracing::info!(error = %e, "WebSocket upgrade failed"))
        .on_upgrade(move |socket| async move {
            crate::connection::serve(socket, state, identity, id, client_addr, pool).await;
            drop(slot);
            drop(user_slot);
            // The client address's slot lives as long as its WebSocket.
            drop(peer);
            drop(forwarded_slot);
            drop(tracked);
        });
    if let Ok(v) = HeaderValue::from_str(&conn_id) {
        response.headers_mut().insert(CONNECTION_ID_HEADER, v);
    }
    // Affinity, for a load balancer that keeps a client where its sessions live (the transport
    // RFD asks clients to keep cookies). Nothing depends on it: any replica serves any session.
    if let Ok(v) = HeaderValue::from_str(&format!(
        "{AFFINITY_COOKIE}={}; Path=/acp; HttpOnly; SameSite=Lax",
        gw.life.replica
    )) {
        response.headers_mut().append(axum::http::header::SET_COOKIE, v);
    }
    response
}
