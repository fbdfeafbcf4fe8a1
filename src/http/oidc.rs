//! The browser's way in through the team's identity provider (`[oidc]`):
//! - `GET /auth/oidc`: `{configured, label, login}`, whether it is configured and the button's
//!   label (the sign-in page asks; always `200`);
//! - `GET /auth/oidc/login`: sends the browser to the provider, with the login's state in a
//!   sealed cookie (`SameSite=Lax`: the provider's redirect back is a cross-site navigation);
//! - `GET /auth/oidc/callback`: ends the login with the gateway's own cookie and `303 /`, or a
//!   page saying what went wrong (the provider down, a person who is not allowed, named).
//!
//! Sign-out is `POST /auth/logout` (`rest`), which ends the sign-in through [`sign_out`].

use crate::audit::Audit;
use crate::gateway::Identities;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::json;

use super::auth::{audit, cookie_named, is_https, own_cookie_identity, request_origin};
use super::server::Peer;
use crate::gateway::Gateway;
use crate::identity::oidc::login::{LOGIN_TTL_SECS, LoginError};

/// The login state cookie over plain HTTP.
const STATE_COOKIE: &str = "acp_gateway_oidc";
/// The login state cookie over HTTPS.
const SECURE_STATE_COOKIE: &str = "__Host-acp_gateway_oidc";

/// The login state cookie's `Set-Cookie` (`value` empty and `max_age` 0 clear it). Over HTTPS the
/// `__Host-` name: a sibling subdomain cannot plant one (login CSRF).
fn state_cookie(headers: &HeaderMap, value: &str, max_age: u64) -> String {
    if is_https(headers) {
        format!("{SECURE_STATE_COOKIE}={value}; Path=/; Secure; HttpOnly; SameSite=Lax; Max-Age={max_age}")
    } else {
        format!("{STATE_COOKIE}={value}; Path=/auth/oidc; HttpOnly; SameSite=Lax; Max-Age={max_age}")
    }
}

pub(super) fn router() -> Router<Gateway> {
    Router::new()
        .route("/auth/oidc", get(about))
        .route("/auth/oidc/login", get(login))
        .route("/auth/oidc/callback", get(callback))
}

async fn about(State(ids): State<Arc<Identities>>) -> Json<serde_json::Value> {
    // Always 200 (the sign-in page asks on every load): `configured` says whether to offer it.
    match &ids.oidc {
        Some(oidc) => Json(json!({ "configured": true, "label": oidc.label(), "login": "/auth/oidc/login" })),
        None => Json(json!({ "configured": false })),
    }
}

async fn login(State(ids): State<Arc<Identities>>, headers: HeaderMap) -> Response {
    let Some(oidc) = &ids.oidc else {
        return page(
            StatusCode::NOT_FOUND,
            "Not configured",
            "Sign-in through an identity provider is not configured on this gateway.",
        );
    };
    match oidc.start().await {
        Ok((url, state)) => {
            let cookie = state_cookie(&headers, &state, LOGIN_TTL_SECS);
            (
                StatusCode::SEE_OTHER,
                [
                    (header::LOCATION, url),
                    (header::SET_COOKIE, cookie),
                    (header::CACHE_CONTROL, String::from("no-store")),
                ],
            )
                .into_response()
        }
        Err(e) => failed(&e),
    }
}

#[derive(Deserialize)]
struct Callback {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

async fn callback(
    State(audit_log): State<Arc<Audit>>,
    State(ids): State<Arc<Identities>>,
    headers: HeaderMap,
    peer: Option<Extension<Peer>>,
    Query(q): Query<Callback>,
) -> Response {
    let peer = peer.as_deref();
    let Some(oidc) = &ids.oidc else {
        return page(
            StatusCode::NOT_FOUND,
            "Not configured",
            "Sign-in through an identity provider is not configured on this gateway.",
        );
    };
    let cookie = cookie_named(
        &headers,
        if is_https(&headers) {
            SECURE_STATE_COOKIE
        } else {
            STATE_COOKIE
        },
    );
    let outcome = match (&q.error, &q.code, &q.state) {
        // The provider's own words, only for a login this browser started (anyone can craft a
        // link with an `error_description`).
        (Some(error), _, state) if oidc.state_matches(state.as_deref(), cookie.as_deref()) => {
            let detail = q
                .error_description
                .as_deref()
                .map(|d| format!(" ({d})"))
                .unwrap_or_default();
            Err(LoginError::Provider(format!("{error}{detail}")))
        }
        (Some(_), _, _) => Err(LoginError::BadState),
        (None, Some(code), Some(state)) => oidc.finish(code, state, cookie.as_deref()).await,
        _ => Err(LoginError::BadState),
    };
    let clear_state = state_cookie(&headers, "", 0);
    let mut response = match outcome {
        Ok(signed_in) => {
            match ids
                .auth
                .mint_session(&signed_in.user, signed_in.ttl_secs, &signed_in.sid, signed_in.admin)
            {
                Ok(token) => {
                    tracing::info!(user = %signed_in.user, "signed in through the identity provider");
                    audit(
                        &audit_log,
                        peer,
                        &signed_in.user,
                        "sign_in",
                        None,
                        "ok",
                        Some(json!({ "method": "oidc", "admin": signed_in.admin })),
                    );
                    super::rest::signed_in(&headers, &token, signed_in.ttl_secs)
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot mint the cookie of a sign-in");
                    page(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "Not signed in",
                        "This gateway cannot sign you in: it cannot sign its own cookie.",
                    )
                }
            }
        }
        Err(e) => {
            let actor = match &e {
                LoginError::Refused(r) => r.account.clone(),
                _ => String::new(),
            };
            let outcome = if matches!(e, LoginError::Refused(_)) {
                "refused"
            } else {
                "failed"
            };
            audit(
                &audit_log,
                peer,
                &actor,
                "sign_in",
                None,
                outcome,
                Some(json!({ "method": "oidc", "reason": e.to_string() })),
            );
            failed(&e)
        }
    };
    if let Ok(v) = header::HeaderValue::from_str(&clear_state) {
        response.headers_mut().append(header::SET_COOKIE, v);
    }
    response
}

/// Ends the caller's sign-in through the provider, if their cookie is one; the provider's
/// sign-out URL to send the browser to, when it has one.
pub(super) async fn sign_out(ids: &Identities, headers: &HeaderMap) -> Option<String> {
    let oidc = ids.oidc.as_ref()?;
    let who = own_cookie_identity(ids, headers)?;
    let sid = who.session?;
    let back = request_origin(headers)
        .map(|o| format!("{o}/"))
        .unwrap_or_else(|| String::from("/"));
    let url = oidc.end_session_url(&sid, &back).await;
    oidc.end(&sid, "signed out").await;
    tracing::info!(user = %who.user, "signed out of the identity provider's sign-in");
    url
}

/// The page for a login that did not end in a sign-in.
fn failed(e: &LoginError) -> Response {
    tracing::info!(error = %e, "sign-in through the identity provider failed");
    let (status, title) = match e {
        LoginError::Unavailable(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "The identity provider cannot be reached",
        ),
        LoginError::Refused(_) => (StatusCode::FORBIDDEN, "Not allowed"),
        LoginError::BadState => (StatusCode::BAD_REQUEST, "Start again"),
        LoginError::Provider(_) | LoginError::Invalid(_) => (StatusCode::BAD_GATEWAY, "Not signed in"),
        LoginError::Store(_) => (StatusCode::SERVICE_UNAVAILABLE, "Not signed in"),
    };
    let message = match e {
        LoginError::Unavailable(_) => format!("{e}. People already signed in are not affected; try again in a minute."),
        LoginError::Refused(r) => format!(
            "You signed in as {}, who is not allowed on this gateway: {}. Ask its operator, or sign in with another account.",
            r.account, r.why
        ),
        // What the database said stays in the log.
        LoginError::Store(_) => String::from("The sign-in could not be recorded; try again in a minute."),
        _ => e.to_string(),
    };
    page(status, title, &message)
}

/// A small page (the sign-in page's style), `message` escaped.
fn page(status: StatusCode, title: &str, message: &str) -> Response {
    let html = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{t} · ACP Gateway</title><link rel=\"icon\" href=\"/favicon.svg\" type=\"image/svg+xml\"><link rel=\"stylesheet\" href=\"/style.css\"></head><body><main class=\"signin\">\
         <section class=\"signin-card\"><h1 data-testid=\"oidc-title\">{t}</h1><p data-testid=\"oidc-message\">{m}</p>\
         <p><a href=\"/\">Back to the sign-in page</a></p></section></main></body></html>\n",
        t = escape(title),
        m = escape(message)
    );
    (status, [(header::CACHE_CONTROL, "no-store")], Html(html)).into_response()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}
