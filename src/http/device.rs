//! Device sign-in (RFC 8628) over HTTP: a program asks for a code (`POST /auth/device`) and polls
//! for its token (`POST /auth/device/token`); the person opens `/device`, where they are signed in,
//! sees which device asks and approves or denies (`GET /api/device`, `POST /api/device/approve`);
//! their devices are listed and revoked under `/api/devices`. `/auth/*` is rate-limited per
//! address ([`super::ratelimit`]); every step is audited.

use std::sync::Arc;

use axum::extract::rejection::FormRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Extension, Form, Json, Router};
use serde::Deserialize;
use serde_json::json;

use super::auth::{Caller, audit, request_origin};
use super::server::Peer;
use crate::audit::Audit;
use crate::gateway::{Gateway, Identities};
use crate::identity::devices::{POLL_INTERVAL_SECS, normalize_user_code};
use crate::identity::{Decision, Poll};

/// `key_id` of a device's sign-in row.
const DEVICE_SIGN_IN: &str = "device";

pub(super) fn router(static_dir: &std::path::Path) -> Router<Gateway> {
    let page = axum::routing::get_service(tower_http::services::ServeFile::new(static_dir.join("device.html")));
    Router::new()
        .route("/auth/device", post(start))
        .route("/auth/device/token", post(token))
        .route_service("/device", page)
        .route("/api/device", get(show))
        .route("/api/device/approve", post(approve))
        .route("/api/devices", get(list))
        .route("/api/devices/{id}", delete(revoke))
}

fn no_store(status: StatusCode, body: serde_json::Value) -> Response {
    (status, [(header::CACHE_CONTROL, "no-store")], Json(body)).into_response()
}

/// The database failed: `503` naming what failed, the detail in the log.
fn unavailable(e: &crate::store::StoreError) -> Response {
    tracing::error!(error = %e, "device sign-in");
    super::error::refuse(
        StatusCode::SERVICE_UNAVAILABLE,
        "the session store is unavailable; try again",
    )
}

/// An RFC 6749 §5.2 error.
fn oauth_error(status: StatusCode, error: &str, description: &str) -> Response {
    no_store(status, json!({ "error": error, "error_description": description }))
}

#[derive(Deserialize, Default)]
struct StartForm {
    /// RFC 8628's client id; what the device calls itself when `client_name` is absent.
    #[serde(default)]
    client_id: Option<String>,
    /// The device's name as the approver sees it (`acp-gateway login` sends host and program).
    #[serde(default)]
    client_name: Option<String>,
}

/// `POST /auth/device`: a new code.
async fn start(
    State(ids): State<Arc<Identities>>,
    State(audit_log): State<Arc<Audit>>,
    headers: HeaderMap,
    peer: Option<Extension<Peer>>,
    form: Result<Form<StartForm>, FormRejection>,
) -> Response {
    if !ids.auth.can_mint_sessions() {
        return oauth_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "temporarily_unavailable",
            "this gateway cannot sign tokens (it has no HS256 secret or session key)",
        );
    }
    let form = form.map(|Form(f)| f).unwrap_or_default();
    let name = form
        .client_name
        .or(form.client_id)
        .filter(|n| !n.trim().is_empty())
        .unwrap_or_else(|| "a program".into());
    let addr = peer.as_deref().map(|p| p.client.to_string()).unwrap_or_default();
    let new = match ids.devices.start(&name, &addr, ids.device.code_ttl_secs).await {
        Ok(new) => new,
        Err(e) => {
            tracing::error!(error = %e, "cannot store a device code");
            return oauth_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "temporarily_unavailable",
                "the database is unavailable",
            );
        }
    };
    audit(
        &audit_log,
        peer.as_deref(),
        "",
        "device_code",
        None,
        "ok",
        Some(json!({ "client": new.code.client_name, "userCode": new.code.user_code })),
    );
    let base = request_origin(&headers).unwrap_or_default();
    let verification = format!("{base}/device");
    no_store(
        StatusCode::OK,
        json!({
            "device_code": new.device_code,
            "user_code": new.code.user_code,
            "verification_uri": verification,
            "verification_uri_complete": format!("{verification}?code={}", new.code.user_code),
            "expires_in": ids.device.code_ttl_secs,
            "interval": POLL_INTERVAL_SECS,
        }),
    )
}

#[derive(Deserialize)]
struct TokenForm {
    grant_type: String,
    device_code: String,
}

/// The grant type of RFC 8628 §3.4.
const DEVICE_GRANT: &str = "urn:ietf:params:oauth:grant-type:device_code";

/// `POST /auth/device/token`: the program polls; once approved, its token (once).
async fn token(
    State(ids): State<Arc<Identities>>,
    State(audit_log): State<Arc<Audit>>,
    peer: Option<Extension<Peer>>,
    form: Result<Form<TokenForm>, FormRejection>,
) -> Response {
    let Ok(Form(form)) = form else {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "expected a form with grant_type and device_code",
        );
    };
    if form.grant_type != DEVICE_GRANT {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "unsupported_grant_type",
            "grant_type must be the device code grant",
        );
    }
    let sid = super::rest::new_sid();
    let poll = match ids.devices.poll(&form.device_code, &sid).await {
        Ok(poll) => poll,
        Err(e) => {
            tracing::error!(error = %e, "cannot read a device code");
            return oauth_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "temporarily_unavailable",
                "the database is unavailable",
            );
        }
    };
    match poll {
        Poll::Pending => oauth_error(StatusCode::BAD_REQUEST, "authorization_pending", "not approved yet"),
        Poll::SlowDown => oauth_error(StatusCode::BAD_REQUEST, "slow_down", "poll less often"),
        Poll::Denied => oauth_error(StatusCode::BAD_REQUEST, "access_denied", "the sign-in was denied"),
        Poll::Expired => oauth_error(
            StatusCode::BAD_REQUEST,
            "expired_token",
            "the code expired or was used; start again",
        ),
        Poll::Unknown => oauth_error(StatusCode::BAD_REQUEST, "invalid_grant", "unknown device code"),
        Poll::Issue { owner, id } => {
            match super::rest::record_sign_in(&ids, &sid, &owner, ids.device.token_ttl_secs, false, DEVICE_SIGN_IN)
                .await
            {
                Ok(token) => {
                    audit(
                        &audit_log,
                        peer.as_deref(),
                        &owner,
                        "device_signed_in",
                        Some(&id),
                        "ok",
                        None,
                    );
                    no_store(
                        StatusCode::OK,
                        json!({ "access_token": token, "token_type": "Bearer", "expires_in": ids.device.token_ttl_secs }),
                    )
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot issue a device's token");
                    oauth_error(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "temporarily_unavailable",
                        "cannot issue the token now",
                    )
                }
            }
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CodeQuery {
    user_code: String,
}

/// `GET /api/device?userCode=`: which device asks, for the approval page.
async fn show(State(ids): State<Arc<Identities>>, Caller(_who): Caller, Query(q): Query<CodeQuery>) -> Response {
    match ids.devices.by_user_code(&q.user_code).await {
        Ok(Some(c)) => {
            let expired = c.state == "pending" && c.expires_at <= crate::infra::clock::now_secs() as i64;
            no_store(
                StatusCode::OK,
                json!({
                    "userCode": c.user_code,
                    "clientName": c.client_name,
                    "clientAddr": c.client_addr,
                    "createdAt": c.created_at,
                    "expiresAt": c.expires_at,
                    "state": if expired { "expired" } else { c.state.as_str() },
                }),
            )
        }
        Ok(None) => no_store(
            StatusCode::NOT_FOUND,
            json!({ "error": "no such code: check it and try again" }),
        ),
        Err(e) => unavailable(&e),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ApproveBody {
    user_code: String,
    approve: bool,
}

/// `POST /api/device/approve {userCode, approve}`: the signed-in person decides.
async fn approve(
    State(ids): State<Arc<Identities>>,
    State(audit_log): State<Arc<Audit>>,
    Caller(who): Caller,
    peer: Option<Extension<Peer>>,
    Json(body): Json<ApproveBody>,
) -> Response {
    let decided = match ids.devices.decide(&body.user_code, &who.user, body.approve).await {
        Ok(d) => d,
        Err(e) => return unavailable(&e),
    };
    let action = if body.approve { "device_approve" } else { "device_deny" };
    let (status, outcome, message) = match decided {
        Decision::Done => (StatusCode::OK, "ok", if body.approve { "approved" } else { "denied" }),
        Decision::Unknown => (StatusCode::NOT_FOUND, "refused", "no such code: check it and try again"),
        Decision::Expired => (
            StatusCode::GONE,
            "refused",
            "this code expired; start the sign-in again",
        ),
        Decision::Decided => (
            StatusCode::CONFLICT,
            "refused",
            "this code was approved or denied already",
        ),
    };
    audit(
        &audit_log,
        peer.as_deref(),
        &who.user,
        action,
        None,
        outcome,
        Some(json!({ "userCode": normalize_user_code(&body.user_code) })),
    );
    let key = if status == StatusCode::OK { "state" } else { "error" };
    no_store(status, json!({ key: message }))
}

/// `GET /api/devices`: the caller's signed-in devices.
async fn list(State(ids): State<Arc<Identities>>, Caller(who): Caller) -> Response {
    match ids.devices.list(&who.user).await {
        Ok(devices) => {
            let rows: Vec<serde_json::Value> = devices
                .iter()
                .map(|d| {
                    json!({
                        "id": d.id,
                        "name": d.client_name,
                        "address": d.client_addr,
                        "createdAt": d.created_at,
                        "lastUsedAt": d.last_used_at,
                        "current": d.sid.is_some() && d.sid == who.session,
                    })
                })
                .collect();
            no_store(StatusCode::OK, json!({ "devices": rows }))
        }
        Err(e) => unavailable(&e),
    }
}

/// `DELETE /api/devices/{id}` (`current`: the caller's own device sign-in): its token stops
/// working at once, on every replica.
async fn revoke(
    State(ids): State<Arc<Identities>>,
    State(audit_log): State<Arc<Audit>>,
    Caller(who): Caller,
    peer: Option<Extension<Peer>>,
    Path(id): Path<String>,
) -> Response {
    let devices = match ids.devices.list(&who.user).await {
        Ok(d) => d,
        Err(e) => return unavailable(&e),
    };
    let found = devices.iter().find(|d| {
        if id == "current" {
            d.sid.is_some() && d.sid == who.session
        } else {
            d.id == id
        }
    });
    let Some(sid) = found.and_then(|d| d.sid.clone()) else {
        return no_store(StatusCode::NOT_FOUND, json!({ "error": "no such device" }));
    };
    if let Err(e) = ids.store.revoke(&sid, "device revoked").await {
        return unavailable(&e);
    }
    ids.watched.end(&sid);
    let device = found.map(|d| d.id.clone());
    audit(
        &audit_log,
        peer.as_deref(),
        &who.user,
        "device_revoke",
        device.as_deref(),
        "ok",
        None,
    );
    StatusCode::NO_CONTENT.into_response()
}
