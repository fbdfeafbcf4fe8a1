//! Who is calling, as HTTP sees it. Where a token may come from: `Authorization: Bearer`, the `bearer.<jwt>` WebSocket subprotocol
//! (browsers cannot set headers on a WebSocket), the web UI's HttpOnly cookie, or, on `/acp` only
//! and for clients that can set neither (the Rust SDK's WebSocket client), an `access_token`
//! query parameter.
//!
//! Also what a browser request looks like from here: the scheme and host it was sent to (taken
//! from a proxy's `Forwarded` / `X-Forwarded-*` headers when present), and whether it came from
//! our own pages. A cross-site page cannot set those headers (they are not CORS-safelisted and
//! there is no CORS layer), so trusting them cannot help it ride the cookie.

use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::audit::Audit;
use crate::gateway::Identities;
use crate::identity::auth::Identity;

/// Name of the web UI's cookie over plain HTTP.
pub const COOKIE: &str = "acp_gateway_token";

/// Name of the web UI's cookie over HTTPS: the `__Host-` prefix makes browsers refuse it unless it
/// is `Secure`, `Path=/` and has no `Domain`, so a sibling subdomain cannot plant one.
pub const SECURE_COOKIE: &str = "__Host-acp_gateway_token";

/// How a token was presented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// `Authorization: Bearer`.
    Header,
    /// `Sec-WebSocket-Protocol: acp, bearer.<jwt>`.
    Subprotocol,
    /// The web UI's cookie (only honoured same-origin).
    Cookie,
    /// `?access_token=` (only passed in by `/acp`).
    Query,
}

/// Finds a token in the request, in order of preference. `query` is the URL's query string where
/// `?access_token=` is allowed (`/acp`), `None` elsewhere.
fn find_token(headers: &HeaderMap, query: Option<&str>) -> Option<(String, Source)> {
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
    if let Some(t) = cookie_token(headers) {
        return Some((t, Source::Cookie));
    }
    let query = query?;
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("access_token="))
        .map(|t| (t.to_string(), Source::Query))
}

/// The value of the cookie `name`, if the request carries it (and it is not empty).
pub fn cookie_named(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, v)| *k == name && !v.is_empty())
        .map(|(_, v)| v.to_string())
}

/// The web UI's cookie, verified as the gateway's own token (for sign-out).
pub fn own_cookie_identity(ids: &Identities, headers: &HeaderMap) -> Option<Identity> {
    ids.auth.verify(&cookie_token(headers)?).ok()
}

/// The web UI's cookie. Over HTTPS only the `__Host-` one counts (a plain-named cookie there may
/// have been planted by a sibling subdomain); over HTTP either, the `__Host-` one first.
fn cookie_token(headers: &HeaderMap) -> Option<String> {
    cookie_named(headers, SECURE_COOKIE).or_else(|| {
        if is_https(headers) {
            None
        } else {
            cookie_named(headers, COOKIE)
        }
    })
}

/// The first element of a `Forwarded` header (RFC 7239): the proxy nearest the client.
fn forwarded(headers: &HeaderMap, param: &str) -> Option<String> {
    let first = headers.get("forwarded")?.to_str().ok()?.split(',').next()?;
    first.split(';').find_map(|pair| {
        let (k, v) = pair.trim().split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case(param)
            .then(|| v.trim().trim_matches('"').to_string())
    })
}

/// The first value of an `X-Forwarded-*` header.
fn x_forwarded(headers: &HeaderMap, name: &str) -> Option<String> {
    let v = headers.get(name)?.to_str().ok()?.split(',').next()?.trim();
    (!v.is_empty()).then(|| v.to_string())
}

/// Whether the browser used HTTPS: a proxy says so with `X-Forwarded-Proto: https` or
/// `Forwarded: proto=https`; the gateway itself only speaks plain HTTP.
pub fn is_https(headers: &HeaderMap) -> bool {
    let https = |p: Option<String>| p.is_some_and(|p| p.eq_ignore_ascii_case("https"));
    https(forwarded(headers, "proto")) || https(x_forwarded(headers, "x-forwarded-proto"))
}

/// The host (and port) the browser addressed: `Forwarded: host=`, `X-Forwarded-Host`, else `Host`.
fn request_host(headers: &HeaderMap) -> Option<String> {
    forwarded(headers, "host")
        .or_else(|| x_forwarded(headers, "x-forwarded-host"))
        .or_else(|| headers.get(header::HOST)?.to_str().ok().map(str::to_string))
}

/// `scheme://host[:port]` of this request as a browser would write it in `Origin`.
pub fn request_origin(headers: &HeaderMap) -> Option<String> {
    let scheme = if is_https(headers) { "https" } else { "http" };
    Some(format!(
        "{scheme}://{}",
        normalize_host(&request_host(headers)?, scheme)
    ))
}

/// Lower case, without the scheme's default port.
fn normalize_host(host: &str, scheme: &str) -> String {
    let host = host.trim().to_ascii_lowercase();
    let default = if scheme == "https" { ":443" } else { ":80" };
    host.strip_suffix(default).map(str::to_string).unwrap_or(host)
}

/// How strict [`same_origin`] is about a request without `Origin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoOrigin {
    /// Allow it unless `Sec-Fetch-Site` names another site (a typed URL, `none`, is fine).
    AllowNavigation,
    /// Allow it only when `Sec-Fetch-Site` is absent (not a browser) or `same-origin`.
    SameOriginOnly,
}

/// Whether a request comes from our own pages: its `Origin` matches the scheme and host it was
/// sent to. Browsers always send `Origin` on WebSocket handshakes and POSTs; without one,
/// `Sec-Fetch-Site` decides.
pub fn same_origin(headers: &HeaderMap, no_origin: NoOrigin) -> bool {
    if let Some(origin) = headers.get(header::ORIGIN) {
        let Some((scheme, host)) = origin.to_str().ok().and_then(|o| o.split_once("://")) else {
            return false;
        };
        let scheme = scheme.to_ascii_lowercase();
        return request_origin(headers)
            .is_some_and(|ours| ours == format!("{scheme}://{}", normalize_host(host, &scheme)));
    }
    match headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        None | Some("same-origin") => true,
        Some("none") => no_origin == NoOrigin::AllowNavigation,
        Some(_) => false,
    }
}

/// Verifies the request's token; every failure is the same `401`. The gateway's own tokens (and
/// cookies) first; a token the gateway's key does not verify may be the identity provider's
/// (never from the cookie, which only the gateway sets). A cookie from a sign-in through the
/// provider is good only while that sign-in is.
pub async fn authenticate(
    ids: &Identities,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<Identity, Unauthorized> {
    let Some((token, source)) = find_token(headers, query) else {
        crate::infra::metrics::auth_failure("missing");
        return Err(Unauthorized);
    };
    if source == Source::Cookie && !same_origin(headers, NoOrigin::AllowNavigation) {
        crate::infra::metrics::auth_failure("cross_origin");
        tracing::warn!("cookie-authenticated request from another origin refused");
        return Err(Unauthorized);
    }
    let own = match ids.auth.verify(&token) {
        Ok(who) => return still_signed_in(ids, who).await,
        Err(e) => e,
    };
    if source != Source::Cookie
        && let Some(keys) = provider_keys(ids).await
    {
        return provider_token(ids, &keys, &token).await;
    }
    crate::infra::metrics::auth_failure(own.reason());
    tracing::info!(error = %own, source = ?source, "token refused");
    Err(Unauthorized)
}

/// `who`, unless their cookie is a sign-in's (through the provider, or a login link or token
/// form) and that sign-in has ended.
async fn still_signed_in(ids: &Identities, who: Identity) -> Result<Identity, Unauthorized> {
    let Some(sid) = &who.session else { return Ok(who) };
    let live = crate::identity::oidc::is_live(&ids.store, sid, &who.user).await;
    if live {
        Ok(who)
    } else {
        crate::infra::metrics::auth_failure("signed_out");
        tracing::info!(user = %who.user, "cookie of an ended sign-in refused");
        Err(Unauthorized)
    }
}

/// The identity provider's keys, asking discovery for them if it has not named them yet.
async fn provider_keys(ids: &Identities) -> Option<Arc<crate::identity::auth::jwks::Jwks>> {
    if let Some(keys) = ids.provider_keys() {
        return Some(keys);
    }
    let oidc = ids.oidc.as_ref()?;
    let _ = oidc.provider(false).await;
    oidc.api_keys()
}

/// A token from the identity provider: verified with its keys, the user its claims name (the
/// [`Policy`](crate::identity::oidc::Policy) of `[oidc]`, else `sub`).
async fn provider_token(
    ids: &Identities,
    keys: &crate::identity::auth::jwks::Jwks,
    token: &str,
) -> Result<Identity, Unauthorized> {
    let claims = keys.verify(token).await.map_err(|e| {
        crate::infra::metrics::auth_failure(e.reason());
        tracing::info!(error = %e, "provider token refused");
        Unauthorized
    })?;
    // An ID token (it carries the login's `nonce`) is the browser sign-in's, checked against its
    // sign-in by the gateway's cookie; replayed as a bearer token it would outlive a sign-out.
    if claims.contains_key("nonce") {
        crate::infra::metrics::auth_failure("invalid");
        tracing::info!("an ID token used as a bearer token refused");
        return Err(Unauthorized);
    }
    let user = match &ids.oidc {
        Some(oidc) => {
            let user = oidc.policy.admit(&claims).map_err(|r| {
                crate::infra::metrics::auth_failure("not_allowed");
                tracing::info!(account = %r.account, reason = %r.why, "provider token of a person not allowed here refused");
                Unauthorized
            })?;
            oidc.bind(&user, &claims).await.map_err(|e| {
                match e {
                    crate::identity::oidc::BindError::Refused(r) => {
                        crate::infra::metrics::auth_failure("another_account");
                        tracing::info!(account = %r.account, reason = %r.why, "provider token of another account than the user's refused");
                    }
                    crate::identity::oidc::BindError::Store(e) => {
                        crate::infra::metrics::auth_failure("store_unavailable");
                        tracing::warn!(error = %e, "cannot check which account a user name belongs to; refused");
                    }
                }
                Unauthorized
            })?;
            user
        }
        None => claims
            .get("sub")
            .and_then(serde_json::Value::as_str)
            .filter(|s| !s.trim().is_empty())
            .map(String::from)
            .ok_or_else(|| {
                crate::infra::metrics::auth_failure("missing_claim");
                Unauthorized
            })?,
    };
    let expires_at = claims.get("exp").and_then(serde_json::Value::as_u64).unwrap_or(0);
    let admin = ids
        .oidc
        .as_ref()
        .is_some_and(|o| o.policy.in_any_group(&claims, &ids.admin.groups));
    Ok(Identity {
        user,
        expires_at,
        session: None,
        admin,
    })
}

/// Records what a caller of an HTTP route did in the audit log, with their address.
pub fn audit(
    log: &Audit,
    peer: Option<&super::server::Peer>,
    actor: &str,
    action: &'static str,
    target: Option<&str>,
    outcome: &'static str,
    detail: Option<serde_json::Value>,
) {
    log.record(crate::audit::Event {
        actor,
        action,
        target,
        outcome,
        detail,
        connection: None,
        client: peer.map(|p| p.client.to_string()),
    });
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

impl<S> FromRequestParts<S> for Caller
where
    Arc<Identities>: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = Unauthorized;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        // `?access_token=` is for `/acp` only: tokens in URLs end up in logs.
        authenticate(&Arc::<Identities>::from_ref(state), &parts.headers, None)
            .await
            .map(Caller)
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
    fn reads_either_cookie_but_only_the_host_one_over_https() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("acp_gateway_token=plain; __Host-acp_gateway_token=host"),
        );
        assert_eq!(find_token(&h, None), Some(("host".into(), Source::Cookie)));
        h.insert(header::COOKIE, HeaderValue::from_static("acp_gateway_token=plain"));
        assert_eq!(find_token(&h, None), Some(("plain".into(), Source::Cookie)));
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        assert_eq!(
            find_token(&h, None),
            None,
            "over HTTPS a plain-named cookie may be planted"
        );
        h.insert(header::COOKIE, HeaderValue::from_static("x_acp_gateway_token=nope"));
        h.remove("x-forwarded-proto");
        assert_eq!(find_token(&h, None), None, "names match exactly");
    }

    #[test]
    fn the_scheme_comes_from_the_proxy() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("gw.example:8080"));
        assert!(!is_https(&h));
        assert_eq!(request_origin(&h).as_deref(), Some("http://gw.example:8080"));
        h.insert("x-forwarded-proto", HeaderValue::from_static("https, http"));
        assert!(is_https(&h));
        h.remove("x-forwarded-proto");
        h.insert(
            "forwarded",
            HeaderValue::from_static("for=192.0.2.1;proto=https;host=\"GW.example:443\", for=10.0.0.1;proto=http"),
        );
        assert!(is_https(&h));
        assert_eq!(request_origin(&h).as_deref(), Some("https://gw.example"));
        h.remove("forwarded");
        h.insert("x-forwarded-host", HeaderValue::from_static("public.example"));
        assert_eq!(request_origin(&h).as_deref(), Some("http://public.example"));
    }

    #[test]
    fn origin_must_match_scheme_and_host() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("gw.example:8080"));
        assert!(same_origin(&h, NoOrigin::SameOriginOnly), "no Origin: not a browser");
        h.insert(header::ORIGIN, HeaderValue::from_static("http://gw.example:8080"));
        assert!(same_origin(&h, NoOrigin::SameOriginOnly));
        h.insert(header::ORIGIN, HeaderValue::from_static("https://gw.example:8080"));
        assert!(!same_origin(&h, NoOrigin::AllowNavigation), "https page, http request");
        h.insert(header::ORIGIN, HeaderValue::from_static("https://evil.example"));
        assert!(!same_origin(&h, NoOrigin::AllowNavigation));
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(!same_origin(&h, NoOrigin::AllowNavigation));
        h.insert(header::ORIGIN, HeaderValue::from_static("https://gw.example"));
        h.insert(header::HOST, HeaderValue::from_static("gw.example:443"));
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        assert!(same_origin(&h, NoOrigin::SameOriginOnly), "default ports are equal");
        h.insert(header::ORIGIN, HeaderValue::from_static("http://gw.example"));
        assert!(!same_origin(&h, NoOrigin::SameOriginOnly), "http page, https request");

        let mut h = HeaderMap::new();
        h.insert("sec-fetch-site", HeaderValue::from_static("none"));
        assert!(same_origin(&h, NoOrigin::AllowNavigation), "a typed URL");
        assert!(!same_origin(&h, NoOrigin::SameOriginOnly));
        for site in ["cross-site", "same-site"] {
            h.insert("sec-fetch-site", HeaderValue::from_str(site).expect("value"));
            assert!(!same_origin(&h, NoOrigin::AllowNavigation), "{site}");
        }
    }
}
