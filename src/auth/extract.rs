//! Where a token may come from: `Authorization: Bearer`, the `bearer.<jwt>` WebSocket subprotocol
//! (browsers cannot set headers on a WebSocket), the web UI's HttpOnly cookie, or, for clients
//! that can set neither (the Rust SDK's WebSocket client), an `access_token` query parameter.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::Identity;
use crate::app::Gateway;

/// Name of the web UI's cookie.
pub const COOKIE: &str = "acp_gateway_token";

/// How a token was presented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `Authorization: Bearer`.
    Header,
    /// `Sec-WebSocket-Protocol: acp, bearer.<jwt>`.
    Subprotocol,
    /// The web UI's cookie (only honoured same-origin).
    Cookie,
    /// `?access_token=`.
    Query,
}

/// Finds a token in the request, in order of preference.
pub fn find_token(headers: &HeaderMap, query: Option<&str>) -> Option<(String, Source)> {
    if let Some(v) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok())
        && let Some(t) = v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer "))
    {
        return Some((t.trim().to_string(), Source::Header));
    }
    for v in headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
    {
        if let Some(t) = v.split(',').map(str::trim).find_map(|p| p.strip_prefix("bearer.")) {
            return Some((t.to_string(), Source::Subprotocol));
        }
    }
    for v in headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()) {
        if let Some(t) = v
            .split(';')
            .map(str::trim)
            .find_map(|c| c.strip_prefix(COOKIE).and_then(|r| r.strip_prefix('=')))
        {
            return Some((t.to_string(), Source::Cookie));
        }
    }
    let query = query?;
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("access_token="))
        .map(|t| (t.to_string(), Source::Query))
}

/// Whether a cookie-authenticated request comes from our own pages: a browser always sends
/// `Origin` on a WebSocket handshake, and a cross-site page must not ride the user's cookie.
pub fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    origin.split_once("://").is_some_and(|(_, rest)| rest == host)
}

/// Verifies the request's token; every failure is the same `401`.
pub fn authenticate(gw: &Gateway, headers: &HeaderMap, query: Option<&str>) -> Result<Identity, Unauthorized> {
    let (token, source) = find_token(headers, query).ok_or(Unauthorized)?;
    if source == Source::Cookie && !same_origin(headers) {
        tracing::warn!("cookie-authenticated request from another origin refused");
        return Err(Unauthorized);
    }
    gw.auth.verify(&token).map_err(|e| {
        tracing::info!(error = %e, source = ?source, "token refused");
        Unauthorized
    })
}

/// The one answer to a missing or bad token.
#[derive(Debug)]
pub struct Unauthorized;

impl IntoResponse for Unauthorized {
    fn into_response(self) -> Response {
        let body = axum::Json(serde_json::json!({ "error": "unauthorized: a valid bearer token is required" }));
        (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], body).into_response()
    }
}

/// The authenticated caller of a REST route.
#[derive(Debug, Clone)]
pub struct Caller(pub Identity);

impl FromRequestParts<Arc<Gateway>> for Caller {
    type Rejection = Unauthorized;

    async fn from_request_parts(parts: &mut Parts, gw: &Arc<Gateway>) -> Result<Self, Self::Rejection> {
        authenticate(gw, &parts.headers, parts.uri.query()).map(Caller)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn finds_tokens_everywhere() {
        let mut h = HeaderMap::new();
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static("acp, bearer.abc.def.ghi"),
        );
        assert_eq!(find_token(&h, None), Some(("abc.def.ghi".into(), Source::Subprotocol)));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer xyz"));
        assert_eq!(find_token(&h, None), Some(("xyz".into(), Source::Header)));
        let mut c = HeaderMap::new();
        c.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; acp_gateway_token=tok; b=2"),
        );
        assert_eq!(find_token(&c, None), Some(("tok".into(), Source::Cookie)));
        assert_eq!(
            find_token(&HeaderMap::new(), Some("agent=x&access_token=q")),
            Some(("q".into(), Source::Query))
        );
        assert_eq!(find_token(&HeaderMap::new(), Some("agent=x")), None);
    }

    #[test]
    fn origin_must_match_host_for_cookies() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("gw.example:8080"));
        assert!(same_origin(&h), "no Origin: not a browser");
        h.insert(header::ORIGIN, HeaderValue::from_static("https://gw.example:8080"));
        assert!(same_origin(&h));
        h.insert(header::ORIGIN, HeaderValue::from_static("https://evil.example"));
        assert!(!same_origin(&h));
    }
}
