//! Sharing a session with a teammate (see [`crate::sharing`]):
//!
//! - `GET /api/sessions/{id}/shares` → `{"shares": [{"id", "role", "user", "link", "members",
//!   "createdAt", "expiresAt"}]}`, for the session's owner.
//! - `POST /api/sessions/{id}/shares` `{"role": "observer"|"controller", "user"?, "expiresInSecs"?,
//!   "ownerKeys"?}` → `201 {"share": …, "token"?}`: without `user` it is a link, and `token` (shown
//!   only here) is what the link carries, in its fragment (`/#share=TOKEN`) so it never reaches a
//!   server log. `role` is required (there is no default); a controller link without
//!   `expiresInSecs` lasts a day; `ownerKeys` (controllers only, default `false`) lets the
//!   holder's prompts run while the owner's agent carries their stored keys or MCP headers.
//! - `DELETE /api/sessions/{id}/shares/{share}` → `204`: revoked; the clients it let in are closed.
//! - `POST /api/shares/redeem` `{"token"}` → `{"sessionId", "owner", "role", "expiresAt"}`: the
//!   caller opened a link, and may now `session/attach` its session.
//! - `GET /api/shared` → `{"sessions": [{"sessionId", "owner", "role", "title", "agent",
//!   "updatedAt", "expiresAt"}]}`: sessions others share with the caller.
//!
//! Another user's session, an unknown one and an ended share answer alike (`404`).

use crate::audit::Audit;
use crate::session::Sessions;
use crate::sharing::Shares;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::json;

use super::auth::{Caller, audit};
use super::error::HttpError;
use super::server::Peer;
use crate::gateway::Gateway;
use crate::protocol::RpcError;
use crate::sharing::{self, Role};

pub(super) fn router() -> Router<Gateway> {
    Router::new()
        .route("/api/sessions/{id}/shares", get(list).post(create))
        .route("/api/sessions/{id}/shares/{share}", delete(revoke))
        .route("/api/shares/redeem", post(redeem))
        .route("/api/shared", get(shared_with_me))
}

/// `POST`'s body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Create {
    role: String,
    #[serde(default)]
    user: Option<String>,
    #[serde(rename = "expiresInSecs", default)]
    expires_in_secs: Option<u64>,
    #[serde(rename = "ownerKeys", default)]
    owner_keys: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Redeem {
    token: String,
}

/// The caller's session `id`, or `404` (another user's and unknown ones alike).
async fn owned(sessions: &Sessions, user: &str, id: &str) -> Result<(), HttpError> {
    match crate::store::in_time(sessions.store().get_session(user, id)).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(RpcError::session_not_found().into()),
        Err(e) => Err(RpcError::from(e).into()),
    }
}

async fn list(
    State(sessions): State<Arc<Sessions>>,
    State(shares): State<Arc<Shares>>,
    Caller(who): Caller,
    Path(id): Path<String>,
) -> Result<Response, HttpError> {
    owned(&sessions, &who.user, &id).await?;
    let shares = shares.list(&who.user, &id).await?;
    let shares: Vec<_> = shares.iter().map(sharing::share_json).collect();
    Ok(Json(json!({ "shares": shares })).into_response())
}

async fn create(
    State(audit_log): State<Arc<Audit>>,
    State(shares): State<Arc<Shares>>,
    Caller(who): Caller,
    peer: Option<Extension<Peer>>,
    Path(id): Path<String>,
    Json(body): Json<Create>,
) -> Result<Response, HttpError> {
    let role = Role::parse(&body.role).ok_or_else(|| {
        RpcError::invalid_params(format!(
            "role must be \"observer\" or \"controller\", not {:?}",
            body.role
        ))
    })?;
    let user = body.user.as_deref().map(str::trim).filter(|u| !u.is_empty());
    let request = sharing::Request {
        role,
        user,
        expires_in_secs: body.expires_in_secs,
        owner_keys: body.owner_keys,
    };
    let made = shares.create(&who.user, &id, &request).await?;
    audit(
        &audit_log,
        peer.as_deref(),
        &who.user,
        "share_create",
        Some(&id),
        "ok",
        Some(json!({
            "share": made.row.id,
            "role": role.as_str(),
            "user": user,
            "link": made.token.is_some(),
            "expiresAt": made.row.expires_at.map(crate::store::iso8601),
            "ownerKeys": made.row.owner_keys,
        })),
    );
    let mut answer = json!({ "share": sharing::share_json(&made.row) });
    if let Some(token) = made.token {
        answer["token"] = json!(token);
    }
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

async fn revoke(
    State(audit_log): State<Arc<Audit>>,
    State(shares): State<Arc<Shares>>,
    Caller(who): Caller,
    peer: Option<Extension<Peer>>,
    Path((id, share)): Path<(String, String)>,
) -> Result<Response, HttpError> {
    shares.revoke(&who.user, &id, &share).await?;
    audit(
        &audit_log,
        peer.as_deref(),
        &who.user,
        "share_revoke",
        Some(&id),
        "ok",
        Some(json!({ "share": share })),
    );
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn redeem(
    State(audit_log): State<Arc<Audit>>,
    State(shares): State<Arc<Shares>>,
    Caller(who): Caller,
    peer: Option<Extension<Peer>>,
    Json(body): Json<Redeem>,
) -> Result<Response, HttpError> {
    let share = match shares.redeem(&who.user, body.token.trim()).await {
        Ok(share) => share,
        Err(e) => {
            audit(
                &audit_log,
                peer.as_deref(),
                &who.user,
                "share_redeem",
                None,
                "refused",
                None,
            );
            return Err(e.into());
        }
    };
    audit(
        &audit_log,
        peer.as_deref(),
        &who.user,
        "share_redeem",
        Some(&share.session_id),
        "ok",
        Some(json!({ "share": share.id, "owner": share.owner })),
    );
    Ok(Json(json!({
        "sessionId": share.session_id,
        "owner": share.owner,
        "role": share.role,
        "expiresAt": share.expires_at.map(crate::store::iso8601),
    }))
    .into_response())
}

async fn shared_with_me(State(shares): State<Arc<Shares>>, Caller(who): Caller) -> Result<Response, HttpError> {
    let sessions = shares.shared_with(&who.user).await?;
    let sessions: Vec<_> = sessions.iter().map(sharing::shared_json).collect();
    Ok(Json(json!({ "sessions": sessions })).into_response())
}
