//! HTTP routes, merged in one place: health and metrics, the `/acp` WebSocket endpoint, the REST
//! API, the web UI's workspace browser (`fs`), agents' terminal sign-ins (`signin`), the web UI's
//! login, and the static web UI; with
//! what they share: who the caller is (`auth`) and how a failed call becomes an answer (`error`).

mod acp;
mod admin;
mod auth;
mod device;
mod error;
mod export;
mod fs;
mod h2c;
mod health;
mod keys;
mod mcp;
mod oidc;
mod push;
mod ratelimit;
mod rest;
mod server;
mod shares;
mod signin;
mod streamable;
mod usage;

pub(crate) use server::serve;

use axum::Router;
use axum::http::{HeaderValue, header};
use tower_http::services::{ServeDir, ServeFile};
use tower_http::set_header::SetResponseHeaderLayer;
use tower_http::timeout::RequestBodyTimeoutLayer;

use crate::gateway::Gateway;

/// The web UI loads only its own files: no inline script or style, no framing (clickjacking the
/// permission buttons), forms post only here.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; \
     form-action 'self'; frame-ancestors 'none'";

/// The terminal sign-in page's policy: the same, but xterm.js makes `<style>` elements of its own
/// (sizes, colours), so this one page may have inline styles. Its scripts stay `'self'`, and
/// what the terminal shows are characters on its canvas or in its text rows, never markup.
const TERMINAL_PAGE_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
     img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; \
     form-action 'self'; frame-ancestors 'none'";

/// The whole HTTP surface.
pub fn router(gw: Gateway) -> Router {
    let static_files = ServeDir::new(&gw.config.static_dir);
    let terminal_page = axum::routing::get_service(ServeFile::new(gw.config.static_dir.join("signin-terminal.html")))
        .layer(SetResponseHeaderLayer::overriding(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(TERMINAL_PAGE_POLICY),
        ));
    // A request body that stops arriving ends the request as the headers' timeout would.
    let body_timeout = std::time::Duration::from_secs(gw.config.limits.header_read_timeout_secs.max(1));
    Router::new()
        .merge(health::router())
        .merge(acp::router(crate::connection::streamable::Registry::new(
            gw.config.limits.max_streams_per_user,
            gw.config.limits.max_streams_per_connection,
        )))
        .merge(rest::router())
        .merge(export::router())
        .merge(shares::router())
        .merge(fs::router())
        .merge(keys::router())
        .merge(mcp::router())
        .merge(push::router())
        .merge(signin::router())
        .merge(oidc::router())
        .merge(admin::router())
        .merge(usage::router())
        .merge(device::router(&gw.config.static_dir))
        .route_service("/signin-terminal.html", terminal_page)
        .fallback_service(static_files)
        .layer(SetResponseHeaderLayer::if_not_present(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ))
        .layer(SetResponseHeaderLayer::if_not_present(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        ))
        .layer(SetResponseHeaderLayer::if_not_present(
            header::X_FRAME_OPTIONS,
            HeaderValue::from_static("DENY"),
        ))
        .layer(SetResponseHeaderLayer::if_not_present(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ))
        .layer(RequestBodyTimeoutLayer::new(body_timeout))
        .layer(axum::middleware::from_fn_with_state(
            ratelimit::AuthLimit::new(gw.config.limits.auth_requests_per_minute_per_ip),
            ratelimit::client_address,
        ))
        .with_state(gw)
}
