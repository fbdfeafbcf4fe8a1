//! `/acp`: authenticate, pick the agent, and hand the connection to the bridge: a WebSocket
//! upgrade here, Streamable HTTP (`POST`, `GET` without an upgrade, `DELETE`) in [`super::streamable`].

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
use super::error::refuse;
use crate::gateway::Gateway;
use crate::infra::config::DEFAULT_AGENT;

/// Initial read buffer of each WebSocket.
const READ_BUFFER_BYTES: usize = 8 * 1024;

/// Response header naming the connection (transport RFD).
pub const CONNECTION_ID_HEADER: &str = "acp-connection-id";
/// Cookie naming the replica a client was upgraded on (for load balancers' affinity).
pub const AFFINITY_COOKIE: &str = "acp_replica";

pub(super) fn router(registry: Arc<crate::connection::streamable::Registry>) -> Router<Gateway> {
    Router::new()
        .route(
            "/acp",
            get(get_acp)
                .post(super::streamable::post)
                .delete(super::streamable::delete),
        )
        .layer(axum::Extension(registry))
}

#[derive(Debug, Deserialize)]
pub(super) struct AcpQuery {
    agent: Option<String>,
}

/// A connection let in: who, to which agent, and the slots it holds while it lives.
pub(super) struct Admitted {
    pub identity: crate::identity::auth::Identity,
    pub pool: Arc<crate::agents::pool::AgentPool>,
    pub conn_id: Arc<str>,
    /// The client's address, for the audit log.
    pub client_addr: Option<Arc<str>>,
    /// The gateway's, the user's, the forwarded address's connection slots and the tracker's
    /// token: dropped when the connection ends.
    pub held: (
        tokio::sync::OwnedSemaphorePermit,
        crate::usage::quota::Slot,
        Option<super::server::PeerSlot>,
        Option<axum::Extension<super::server::Peer>>,
        tokio_util::task::task_tracker::TaskTrackerToken,
    ),
}

/// Lets a new connection in, or says why not: the token first (no token, no connection,
/// whatever else is wrong), then the agent (`?agent=NAME`), draining, and the caps on
/// connections (per forwarded address, in all, per user).
pub(super) async fn admit(
    gw: &Gateway,
    peer: Option<axum::Extension<super::server::Peer>>,
    headers: &HeaderMap,
    uri: &axum::http::Uri,
    q: Result<Query<AcpQuery>, QueryRejection>,
) -> Result<Admitted, Response> {
    let identity = match authenticate(&gw.identity, headers, uri.query()).await {
        Ok(identity) => identity,
        Err(unauthorized) => {
            crate::infra::metrics::connection_refused("unauthenticated");
            return Err(unauthorized.into_response());
        }
    };
    if let Some(sid) = &identity.session
        && let Err(e) = gw.identity.devices.used(sid).await
    {
        // The web UI's list shows an older last use; nothing else depends on it.
        tracing::debug!(error = %e, "cannot note a device's last use");
    }
    let Ok(Query(q)) = q else {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "the query string is malformed (`?agent=NAME`, at most once)",
        ));
    };
    let agent = q.agent.as_deref().unwrap_or(DEFAULT_AGENT);
    let Some(pool) = gw.agents.pools.get(agent).cloned() else {
        crate::infra::metrics::connection_refused("unknown_agent");
        return Err(refuse(StatusCode::NOT_FOUND, format!("unknown agent {agent:?}")));
    };
    if gw.life.is_draining() {
        crate::infra::metrics::connection_refused("draining");
        return Err(refuse(StatusCode::SERVICE_UNAVAILABLE, "gateway is shutting down"));
    }
    // Behind a trusted proxy, the proxy's client is capped per address like a direct one.
    let forwarded_slot = match peer.as_ref().map(|p| p.forwarded_slot(headers)) {
        Some(Err(too_many)) => {
            crate::infra::metrics::connection_refused("per_ip");
            tracing::info!(client = %too_many.0, "too many connections from one forwarded address");
            return Err(refuse(
                StatusCode::TOO_MANY_REQUESTS,
                "too many connections from your address",
            ));
        }
        Some(Ok(slot)) => slot,
        None => None,
    };
    let Ok(slot) = gw.life.connection_slots.clone().try_acquire_owned() else {
        crate::infra::metrics::connection_refused("max_connections");
        return Err(refuse(StatusCode::SERVICE_UNAVAILABLE, "too many connections"));
    };
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
            return Err((StatusCode::TOO_MANY_REQUESTS, axum::Json(body)).into_response());
        }
    };
    let conn_id: Arc<str> = Arc::from(format!("{}-{}", gw.life.replica, uuid::Uuid::new_v4().simple()));
    Ok(Admitted {
        identity,
        pool,
        conn_id,
        client_addr,
        held: (slot, user_slot, forwarded_slot, peer, gw.life.tracker.token()),
    })
}

/// The headers every new connection's answer carries: its id, and the affinity cookie for a
/// load balancer that keeps a client where its sessions live (the transport RFD asks clients
/// to keep cookies; nothing depends on it: any replica serves any session).
pub(super) fn connection_headers(gw: &Gateway, conn_id: &str, headers: &mut HeaderMap) {
    if let Ok(v) = HeaderValue::from_str(conn_id) {
        headers.insert(CONNECTION_ID_HEADER, v);
    }
    if let Ok(v) = HeaderValue::from_str(&format!(
        "{AFFINITY_COOKIE}={}; Path=/acp; HttpOnly; SameSite=Lax",
        gw.life.replica
    )) {
        headers.append(axum::http::header::SET_COOKIE, v);
    }
}

async fn get_acp(
    State(gw): State<Gateway>,
    registry: axum::Extension<Arc<crate::connection::streamable::Registry>>,
    peer: Option<axum::Extension<super::server::Peer>>,
    headers: HeaderMap,
    uri: axum::http::Uri,
    q: Result<Query<AcpQuery>, QueryRejection>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    // Without `Upgrade: websocket`, a GET opens an SSE stream of a Streamable HTTP connection.
    if !headers.contains_key(axum::http::header::UPGRADE) {
        return super::streamable::open_stream(&gw, &registry, &headers, &uri).await;
    }
    let admitted = match admit(&gw, peer, &headers, &uri, q).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    let ws = match ws {
        Ok(ws) => ws,
        Err(rejection) => return rejection.into_response(),
    };
    let Admitted {
        identity,
        pool,
        conn_id,
        client_addr,
        held,
    } = admitted;
    let limits = &gw.config.limits;
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
            // The slots (the client address's too) live as long as the WebSocket.
            drop(held);
        });
    connection_headers(&gw, &conn_id, response.headers_mut());
    response
}
