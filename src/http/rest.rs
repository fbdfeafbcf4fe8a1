//! The REST API (`/api/*`) and the web UI's login (`/auth/*`).

use crate::agents::pool::Pools;
use crate::audit::Audit;
use crate::gateway::Identities;
use crate::infra::config::Config;
use crate::session::Sessions;
use crate::settings::secrets::Keys;
use crate::tenancy::Tenancy;
use std::sync::Arc;
use std::time::Duration;

use axum::Form;
use axum::extract::rejection::FormRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::json;

use super::auth::{COOKIE, Caller, NoOrigin, SECURE_COOKIE, audit, is_https, same_origin};
use super::error::HttpError;
use super::server::Peer;
use crate::gateway::Gateway;
use crate::infra::clock::now_secs;
use crate::infra::config::DEFAULT_AGENT;
use crate::session::list::ListParams;

pub(super) fn router() -> Router<Gateway> {
    Router::new()
        .route("/api/me", get(me))
        .route("/api/agents", get(agents))
        .route("/api/sessions", get(sessions))
        .route("/api/sessions/{id}", delete(delete_session))
        .route(
            "/api/sessions/{id}/archived",
            put(archive_session).delete(restore_session),
        )
        .route("/auth/login", get(login_with_code).post(login_with_token))
        .route("/auth/logout", post(logout))
}

/// Who the caller is, and the workspace roots their sessions may use (created on first use).
async fn me(
    State(tenancy): State<Arc<Tenancy>>,
    State(ids): State<Arc<Identities>>,
    Caller(who): Caller,
) -> Json<serde_json::Value> {
    let admin = ids.is_admin(&who);
    let roots: Vec<String> = match tenancy.roots(&who.user) {
        Ok(roots) => roots.iter().map(|r| r.to_string_lossy().into_owned()).collect(),
        Err(e) => {
            tracing::warn!(user = %who.user, error = %e, "cannot set up the user's workspace roots");
            Vec::new()
        }
    };
    Json(json!({ "user": who.user, "expiresAt": who.expires_at, "workspaceRoots": roots, "admin": admin }))
}

async fn agents(
    State(pools): State<Arc<Pools>>,
    State(keys): State<Arc<Keys>>,
    Caller(who): Caller,
) -> Json<serde_json::Value> {
    let rows = keys.rows().bounded(crate::store::CALL_LIMIT);
    // Which keys the caller has given each agent: names and times, never values.
    let keys = keys.list(&who.user).await.unwrap_or_else(|e| {
        tracing::error!(user = %who.user, error = %e, "cannot list the user's agent keys");
        Vec::new()
    });
    // Which agents they completed a sign-in on (a terminal login, an accepted `authenticate`).
    let logins = rows.logins(&who.user).await.unwrap_or_else(|e| {
        tracing::error!(user = %who.user, error = %e, "cannot list the user's agent sign-ins");
        Vec::new()
    });
    let mut out = Vec::new();
    for (name, pool) in pools.iter() {
        let login = logins
            .iter()
            .find(|l| l.agent == **name)
            .map(|l| json!({ "methodId": l.method_id, "signedInAt": crate::store::iso8601(l.signed_in_at) }));
        let info = match tokio::time::timeout(Duration::from_secs(30), pool.info()).await {
            Ok(Ok(info)) => Ok(info),
            Ok(Err(e)) => Err(e.message.to_string()),
            Err(_) => Err(String::from("timed out starting the agent")),
        };
        let mine: Vec<_> = keys.iter().filter(|k| k.agent == *name).collect();
        let user_keys = pool.config().user_keys && !pool.is_shared();
        out.push(match info {
            Ok(info) => json!({
                "name": name, "default": name == DEFAULT_AGENT,
                "capabilities": info.capabilities, "agentInfo": info.agent_info, "authMethods": info.auth_methods,
                "userKeys": user_keys, "keys": mine, "login": login,
            }),
            Err(e) => json!({
                "name": name, "default": name == DEFAULT_AGENT, "capabilities": null, "error": e,
                "userKeys": user_keys, "keys": mine, "login": login,
            }),
        });
    }
    Json(json!({ "agents": out }))
}

async fn sessions(
    State(sessions): State<Arc<Sessions>>,
    Caller(who): Caller,
    Query(q): Query<ListParams>,
) -> Result<Json<serde_json::Value>, HttpError> {
    Ok(Json(sessions.list(&who.user, q).await?))
}

async fn delete_session(
    State(audit_log): State<Arc<Audit>>,
    State(sessions): State<Arc<Sessions>>,
    State(pools): State<Arc<Pools>>,
    Caller(who): Caller,
    peer: Option<Extension<Peer>>,
    Path(id): Path<String>,
) -> Result<StatusCode, HttpError> {
    sessions.delete(&who.user, &id, &pools).await?;
    audit(
        &audit_log,
        peer.as_deref(),
        &who.user,
        "session_delete",
        Some(&id),
        "ok",
        None,
    );
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT /api/sessions/{id}/archived`: hidden from the default list until restored.
async fn archive_session(
    State(audit_log): State<Arc<Audit>>,
    State(sessions): State<Arc<Sessions>>,
    Caller(who): Caller,
    peer: Option<Extension<Peer>>,
    Path(id): Path<String>,
) -> Result<StatusCode, HttpError> {
    sessions.set_archived(&who.user, &id, true).await?;
    audit(
        &audit_log,
        peer.as_deref(),
        &who.user,
        "session_archive",
        Some(&id),
        "ok",
        None,
    );
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /api/sessions/{id}/archived`: back in the default list.
async fn restore_session(
    State(audit_log): State<Arc<Audit>>,
    State(sessions): State<Arc<Sessions>>,
    Caller(who): Caller,
    peer: Option<Extension<Peer>>,
    Path(id): Path<String>,
) -> Result<StatusCode, HttpError> {
    sessions.set_archived(&who.user, &id, false).await?;
    audit(
        &audit_log,
        peer.as_deref(),
        &who.user,
        "session_restore",
        Some(&id),
        "ok",
        None,
    );
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
struct CodeQuery {
    code: Option<String>,
}

/// `GET /auth/login?code=`: trades a one-time code (the link `serve` prints) for the cookie.
/// Refused when a page on another site sent the browser here (login CSRF).
async fn login_with_code(
    State(audit_log): State<Arc<Audit>>,
    State(ids): State<Arc<Identities>>,
    State(config): State<Arc<Config>>,
    headers: HeaderMap,
    peer: Option<Extension<Peer>>,
    Query(q): Query<CodeQuery>,
) -> Response {
    let peer = peer.as_deref();
    if headers.get("sec-fetch-site").is_some_and(|v| v == "cross-site") {
        crate::infra::metrics::auth_failure("cross_origin");
        tracing::warn!("login link followed from another site refused");
        return refusal(
            &headers,
            StatusCode::FORBIDDEN,
            "A login link only works when you open it yourself, not from another site.",
        );
    }
    let Some(user) = q.code.as_deref().and_then(|code| ids.login_codes.redeem(code)) else {
        crate::infra::metrics::auth_failure("bad_login_code");
        audit(
            &audit_log,
            peer,
            "",
            "sign_in",
            None,
            "refused",
            Some(json!({ "method": "login_code" })),
        );
        return refusal(
            &headers,
            StatusCode::UNAUTHORIZED,
            "This login link is unknown, expired or already used. Get a token with `acp-gateway token --sub USER` and sign in with it.",
        );
    };
    let ttl = config.jwt.default_ttl_secs;
    match cookie_of_a_sign_in(&ids, &user, ttl, false).await {
        Ok(token) => {
            audit(
                &audit_log,
                peer,
                &user,
                "sign_in",
                None,
                "ok",
                Some(json!({ "method": "login_code" })),
            );
            signed_in(&headers, &token, ttl)
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot sign a cookie for a login code");
            refusal(
                &headers,
                StatusCode::INTERNAL_SERVER_ERROR,
                "This gateway cannot sign you in with a code.",
            )
        }
    }
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

/// `POST /auth/login` (form field `token`): the web UI's sign-in form. Only our own pages may post
/// it, so no other site can sign a browser in as someone else.
async fn login_with_token(
    State(audit_log): State<Arc<Audit>>,
    State(ids): State<Arc<Identities>>,
    headers: HeaderMap,
    peer: Option<Extension<Peer>>,
    form: Result<Form<LoginForm>, FormRejection>,
) -> Response {
    let peer = peer.as_deref();
    if !same_origin(&headers, NoOrigin::SameOriginOnly) {
        crate::infra::metrics::auth_failure("cross_origin");
        tracing::warn!("sign-in from another origin refused");
        return refusal(&headers, StatusCode::FORBIDDEN, "Sign in from this gateway's own page.");
    }
    let Ok(Form(form)) = form else {
        return refusal(&headers, StatusCode::BAD_REQUEST, "Expected a form with a token field.");
    };
    match ids.auth.verify(form.token.trim()) {
        Ok(who) => {
            audit(
                &audit_log,
                peer,
                &who.user,
                "sign_in",
                None,
                "ok",
                Some(json!({ "method": "token" })),
            );
            let ttl = who.expires_at.saturating_sub(now_secs());
            // The cookie is a sign-in of its own, which sign-out ends; the token pasted stays
            // what it was. A token that is a sign-in's cookie already, or one this gateway
            // cannot sign a cookie for (a PEM key alone), rides as it is.
            let cookie = match who.session {
                Some(_) => None,
                None => cookie_of_a_sign_in(&ids, &who.user, ttl, who.admin).await.ok(),
            };
            signed_in(&headers, cookie.as_deref().unwrap_or(form.token.trim()), ttl)
        }
        Err(e) => {
            crate::infra::metrics::auth_failure(e.reason());
            tracing::info!(error = %e, "sign-in token refused");
            audit(
                &audit_log,
                peer,
                "",
                "sign_in",
                None,
                "refused",
                Some(json!({ "method": "token", "reason": e.reason() })),
            );
            refusal(
                &headers,
                StatusCode::UNAUTHORIZED,
                "That token was refused: it is invalid or expired.",
            )
        }
    }
}

/// `key_id` of the `web_sessions` row of a sign-in with a login link or a token (no provider
/// tokens are sealed in it).
const OWN_SIGN_IN: &str = "own";

/// The cookie of a sign-in without the identity provider (a login link, the token form): a
/// `web_sessions` row like a provider sign-in's, so that sign-out ends it on every replica (a
/// copied cookie stops working), named by the `sid` the token carries.
async fn cookie_of_a_sign_in(ids: &Identities, user: &str, ttl: u64, admin: bool) -> Result<String, CookieError> {
    record_sign_in(ids, &new_sid(), user, ttl, admin, OWN_SIGN_IN).await
}

/// A new sign-in's id (`sid`): 256 random bits.
pub(super) fn new_sid() -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>())
}

/// Records the sign-in `sid` of `user` (a `web_sessions` row of kind `key_id`, which sign-out or
/// a revocation ends on every replica) and mints its token, valid `ttl` seconds.
pub(super) async fn record_sign_in(
    ids: &Identities,
    sid: &str,
    user: &str,
    ttl: u64,
    admin: bool,
    key_id: &str,
) -> Result<String, CookieError> {
    let now = now_secs() as i64;
    let expires = now.saturating_add(ttl as i64);
    let row = crate::identity::WebSession {
        id: sid.to_string(),
        owner: user.to_string(),
        key_id: key_id.to_string(),
        nonce: Vec::new(),
        sealed: Vec::new(),
        created_at: now,
        expires_at: expires,
        // Nothing to check with the provider: never due for a check.
        checked_at: expires,
        revoked_at: None,
    };
    let token = ids.auth.mint_session(user, ttl, sid, admin)?;
    ids.store.put(&row).await?;
    Ok(token)
}

/// Why a sign-in's cookie could not be made.
#[derive(Debug, thiserror::Error)]
pub(super) enum CookieError {
    /// The token could not be signed.
    #[error("cannot sign the sign-in's token: {0}")]
    Sign(#[from] crate::identity::auth::KeyError),
    /// The sign-in could not be recorded.
    #[error("cannot record the sign-in: {0}")]
    Record(#[from] crate::store::StoreError),
}

/// The web UI's cookie holding `token`: `__Host-` and `Secure` when the browser used HTTPS.
pub(super) fn session_cookie(headers: &HeaderMap, token: &str, max_age: u64) -> String {
    if is_https(headers) {
        format!("{SECURE_COOKIE}={token}; Path=/; Secure; HttpOnly; SameSite=Strict; Max-Age={max_age}")
    } else {
        format!("{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}")
    }
}

/// Sets the cookie and sends the browser to the UI.
pub(super) fn signed_in(headers: &HeaderMap, token: &str, max_age: u64) -> Response {
    (
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, String::from("/")),
            (header::SET_COOKIE, session_cookie(headers, token, max_age)),
            (header::CACHE_CONTROL, String::from("no-store")),
        ],
    )
        .into_response()
}

/// A refused sign-in: a small page for a browser, `{"error": …}` for anything else.
fn refusal(headers: &HeaderMap, status: StatusCode, message: &'static str) -> Response {
    let wants_html = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/html"));
    let cache = [(header::CACHE_CONTROL, "no-store")];
    if wants_html {
        let page = format!(
            "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Not signed in · ACP Gateway</title>\
             <link rel=\"icon\" href=\"/favicon.svg\" type=\"image/svg+xml\"><link rel=\"stylesheet\" href=\"/style.css\"></head><body><main class=\"signin\"><section class=\"signin-card\">\
             <h1>Not signed in</h1><p>{message}</p><p><a href=\"/\">Back to the sign-in page</a></p></section></main></body></html>\n"
        );
        (status, cache, Html(page)).into_response()
    } else {
        (status, cache, Json(json!({ "error": message }))).into_response()
    }
}

/// Clears both cookie names. Only our own pages may sign a browser out. A sign-in through the
/// identity provider ends too (on every replica), and where the provider has a sign-out endpoint
/// the answer is `200 {"redirect": URL}` for the page to go there.
async fn logout(
    State(audit_log): State<Arc<Audit>>,
    State(ids): State<Arc<Identities>>,
    headers: HeaderMap,
    peer: Option<Extension<Peer>>,
) -> Response {
    if !same_origin(&headers, NoOrigin::SameOriginOnly) {
        return refusal(
            &headers,
            StatusCode::FORBIDDEN,
            "Sign out from this gateway's own page.",
        );
    }
    let who = super::auth::own_cookie_identity(&ids, &headers);
    if let Some(who) = &who {
        audit(&audit_log, peer.as_deref(), &who.user, "sign_out", None, "ok", None);
    }
    // A login link's or token form's sign-in ends here; a provider's through the provider.
    let own_sid = match who.and_then(|w| w.session) {
        Some(sid) if matches!(ids.store.get(&sid).await, Ok(Some(row)) if row.key_id == OWN_SIGN_IN) => Some(sid),
        _ => None,
    };
    let redirect = match own_sid {
        Some(sid) => {
            if let Err(e) = ids.store.revoke(&sid, "signed out").await {
                tracing::warn!(error = %e, "cannot record that a sign-in ended");
            }
            ids.watched.end(&sid);
            None
        }
        None => super::oidc::sign_out(&ids, &headers).await,
    };
    let plain = format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    let host = format!("{SECURE_COOKIE}=; Path=/; Secure; HttpOnly; SameSite=Strict; Max-Age=0");
    let mut response = match redirect {
        Some(url) => (StatusCode::OK, Json(json!({ "redirect": url }))).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    };
    let h = response.headers_mut();
    for cookie in [plain, host] {
        if let Ok(v) = header::HeaderValue::from_str(&cookie) {
            h.append(header::SET_COOKIE, v);
        }
    }
    h.insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-store"));
    response
}
