//! `/api/push`: the devices a user opts in to Web Push (see [`crate::push`]).
//!
//! - `GET /api/push` → `{"enabled", "publicKey", "devices": [{"id", "label", "service", "createdAt"}]}`
//!   (the VAPID key browsers subscribe with; never an endpoint or a device's keys).
//! - `POST /api/push/subscriptions` `{"endpoint", "keys": {"p256dh", "auth"}, "label"?, "titles"?}` (a
//!   browser's `PushSubscription.toJSON()`) → `201 {"id"}`; `400` naming what is wrong; `403` when
//!   push is off.
//! - `DELETE /api/push/subscriptions/{id}` → `204`, `404` when there is none.

use crate::audit::Audit;
use crate::push::Push;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;

use super::auth::{Caller, audit};
use super::error::{list_refusal, refuse};
use super::server::Peer;
use crate::gateway::Gateway;

pub(super) fn router() -> Router<Gateway> {
    Router::new()
        .route("/api/push", get(state))
        .route("/api/push/subscriptions", post(subscribe))
        .route("/api/push/subscriptions/{id}", delete(unsubscribe))
}

#[derive(Deserialize)]
struct Keys {
    p256dh: String,
    auth: String,
}

/// A browser's `PushSubscription.toJSON()`, and what to call the device.
#[derive(Deserialize)]
struct Subscribe {
    endpoint: String,
    keys: Keys,
    #[serde(default)]
    label: String,
    /// Whether this device's pushes show the session's title (the first words of a prompt).
    #[serde(default)]
    titles: bool,
    #[serde(default, rename = "expirationTime")]
    _expiration_time: Option<serde_json::Value>,
}

async fn state(State(push): State<Arc<Push>>, Caller(who): Caller) -> Response {
    match push.devices(&who.user).await {
        Ok(devices) => Json(serde_json::json!({
            "enabled": push.enabled(),
            "publicKey": push.public_key(),
            "devices": devices,
        }))
        .into_response(),
        Err(e) => list_refusal(&who.user, e),
    }
}

async fn subscribe(
    State(audit_log): State<Arc<Audit>>,
    State(push): State<Arc<Push>>,
    Caller(who): Caller,
    peer: Option<Extension<Peer>>,
    Json(body): Json<Subscribe>,
) -> Response {
    match push
        .subscribe(
            &who.user,
            &body.endpoint,
            &body.keys.p256dh,
            &body.keys.auth,
            &body.label,
            body.titles,
        )
        .await
    {
        Ok(id) => {
            audit(
                &audit_log,
                peer.as_deref(),
                &who.user,
                "push_subscribe",
                Some(&id),
                "ok",
                None,
            );
            (StatusCode::CREATED, Json(serde_json::json!({ "id": id }))).into_response()
        }
        Err(e) => list_refusal(&who.user, e),
    }
}

async fn unsubscribe(
    State(audit_log): State<Arc<Audit>>,
    State(push): State<Arc<Push>>,
    Caller(who): Caller,
    peer: Option<Extension<Peer>>,
    Path(id): Path<String>,
) -> Response {
    match push.unsubscribe(&who.user, &id).await {
        Ok(true) => {
            audit(
                &audit_log,
                peer.as_deref(),
                &who.user,
                "push_unsubscribe",
                Some(&id),
                "ok",
                None,
            );
            StatusCode::NO_CONTENT.into_response()
        }
        Ok(false) => refuse(StatusCode::NOT_FOUND, format!("you have no device {id:?} opted in")),
        Err(e) => list_refusal(&who.user, e),
    }
}
