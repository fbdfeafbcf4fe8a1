//! `/acp` as Streamable HTTP (transport RFD): `POST` a JSON-RPC message (`initialize` makes the
//! connection and is answered in the body, `200`; everything else `202`, answered on a stream),
//! `GET` with `Accept: text/event-stream` reads the connection's stream or, with
//! `Acp-Session-Id`, a session's (`Last-Event-ID` resumes it), `DELETE` ends the connection.
//! Every request carries the same token a WebSocket's handshake does; a connection is its
//! user's alone (another user's id is as unknown as a made-up one).
//!
//! Status codes: `400` a missing or mismatched header, a message that is not JSON-RPC, or
//! `initialize` on a connection; `401` no valid token; `404` an unknown connection (or session,
//! on a `GET`); `406` a `GET` that does not accept `text/event-stream`; `413` a body over
//! `max_frame_bytes`; `415` a `POST` that is not `application/json`; `429` too many streams;
//! `501` a batch.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::acp::{AcpQuery, Admitted, admit, connection_headers};
use super::auth::authenticate;
use super::error::refuse;
use crate::connection::streamable::{self, Conn, ReadRefused, Refused, Registry};
use crate::gateway::Gateway;
use crate::identity::auth::Identity;
use crate::protocol::{self, Incoming, Kind, ParseFailure, RpcError, codes};

/// The connection's id, on every request after `initialize`.
const CONNECTION_ID: &str = "acp-connection-id";
/// A session's id, on requests for a session and on its stream.
const SESSION_ID: &str = "acp-session-id";

/// Methods whose POST must name their session in `Acp-Session-Id` (the ones that act on a
/// session already open on the connection; `session/load`, `resume` and `fork` open one).
const SESSION_SCOPED: &[&str] = &[
    "session/prompt",
    "session/cancel",
    "session/set_mode",
    "session/set_model",
    "session/set_config_option",
    "session/close",
];

type Registered = axum::Extension<Arc<Registry>>;

fn rpc_error(status: StatusCode, id: Option<&str>, error: &RpcError) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        protocol::error(id, error),
    )
        .into_response()
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// The caller, or the answer for one without a valid token.
async fn caller(gw: &Gateway, headers: &HeaderMap, uri: &axum::http::Uri) -> Result<Identity, Response> {
    authenticate(&gw.identity, headers, uri.query())
        .await
        .map_err(IntoResponse::into_response)
}

/// The caller's connection named in `Acp-Connection-Id`: `400` without one, `404` for one that
/// is unknown here, ended, or another user's.
fn connection(registry: &Registry, headers: &HeaderMap, user: &str) -> Result<Arc<Conn>, (StatusCode, &'static str)> {
    let Some(id) = header_str(headers, CONNECTION_ID) else {
        return Err((StatusCode::BAD_REQUEST, "Acp-Connection-Id is missing"));
    };
    registry
        .get(id, user)
        .ok_or((StatusCode::NOT_FOUND, "unknown Acp-Connection-Id"))
}

/// `POST /acp`.
pub(super) async fn post(
    State(gw): State<Gateway>,
    registry: Registered,
    peer: Option<axum::Extension<super::server::Peer>>,
    headers: HeaderMap,
    uri: axum::http::Uri,
    q: Result<Query<AcpQuery>, QueryRejection>,
    body: Body,
) -> Response {
    let identity = match caller(&gw, &headers, &uri).await {
        Ok(identity) => identity,
        Err(unauthorized) => return unauthorized,
    };
    let json = header_str(&headers, header::CONTENT_TYPE.as_str())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type must be application/json",
        );
    }
    let max = gw.config.limits.max_frame_bytes;
    let Ok(bytes) = axum::body::to_bytes(body, max).await else {
        return refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is over limits.max_frame_bytes ({max} bytes), or was cut short"),
        );
    };
    let Ok(body) = String::from_utf8(bytes.to_vec()) else {
        return rpc_error(
            StatusCode::BAD_REQUEST,
            None,
            &RpcError::new(codes::PARSE_ERROR, "parse error: the body is not UTF-8"),
        );
    };
    let (msg, kind) = match Incoming::parse(&body) {
        Ok(parsed) => parsed,
        Err(ParseFailure::Batch) => {
            return rpc_error(
                StatusCode::NOT_IMPLEMENTED,
                None,
                &RpcError::new(codes::INVALID_REQUEST, "batch requests are not supported"),
            );
        }
        Err(ParseFailure::NotJson(detail)) => {
            return rpc_error(
                StatusCode::BAD_REQUEST,
                None,
                &RpcError::new(codes::PARSE_ERROR, format!("parse error: {detail}")),
            );
        }
        Err(ParseFailure::Invalid(id, why)) => {
            return rpc_error(
                StatusCode::BAD_REQUEST,
                id.as_deref().map(|i| i.get()),
                &RpcError::new(codes::INVALID_REQUEST, why),
            );
        }
    };
    let method = msg.method.as_deref();
    let id = msg.id.map(|id| id.get().to_string());
    let named_connection = header_str(&headers, CONNECTION_ID).is_some();
    if method == Some("initialize") && kind == Kind::Request {
        if named_connection {
            return refuse(
                StatusCode::BAD_REQUEST,
                "initialize makes a connection: send it without Acp-Connection-Id",
            );
        }
        let id = id.unwrap_or_default();
        return initialize(&gw, &registry, peer, &headers, &uri, q, (&id, body.clone())).await;
    }
    let conn = match connection(&registry, &headers, &identity.user) {
        Ok(conn) => conn,
        Err((status, why)) => return refuse(status, why),
    };
    let header_session = header_str(&headers, SESSION_ID);
    let params_session = msg.params.and_then(session_of);
    if let (Some(h), Some(p)) = (header_session, params_session.as_deref())
        && h != p
    {
        return refuse(
            StatusCode::BAD_REQUEST,
            "Acp-Session-Id and params.sessionId name different sessions",
        );
    }
    if method.is_some_and(|m| SESSION_SCOPED.contains(&m)) && header_session.is_none() {
        return refuse(
            StatusCode::BAD_REQUEST,
            format!(
                "{} acts on a session: Acp-Session-Id is missing",
                method.unwrap_or_default()
            ),
        );
    }
    let session = header_session.map(str::to_string).or(params_session);
    let route = match (&id, &session, kind) {
        (Some(id), Some(sid), Kind::Request) => Some((id.as_str(), sid.as_str())),
        _ => None,
    };
    // Only a session named in the header gets its stream now: a client that names it only in
    // the params (the Python SDK's `session/load`) may open it later, and gets it on the
    // connection's stream until then. And only one of the caller's: an answer about another
    // user's session goes where the caller reads.
    let stream_for =
        header_session.filter(|sid| conn.has_stream(sid) || gw.sessions.live(&identity.user, sid).is_some());
    match conn.post(body.clone(), route, stream_for).await {
        Ok(()) => StatusCode::ACCEPTED.into_response(),
        Err(_) => refuse(StatusCode::NOT_FOUND, "unknown Acp-Connection-Id"),
    }
}

/// `params.sessionId`, when `params` is an object that has one.
fn session_of(params: &serde_json::value::RawValue) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Named {
        #[serde(rename = "sessionId")]
        session_id: String,
    }
    serde_json::from_str::<Named>(params.get()).ok().map(|n| n.session_id)
}

/// `initialize`: a new connection, answered in the body with its id in `Acp-Connection-Id`.
async fn initialize(
    gw: &Gateway,
    registry: &Arc<Registry>,
    peer: Option<axum::Extension<super::server::Peer>>,
    headers: &HeaderMap,
    uri: &axum::http::Uri,
    q: Result<Query<AcpQuery>, QueryRejection>,
    (id, body): (&str, String),
) -> Response {
    let Admitted {
        identity,
        pool,
        conn_id,
        client_addr,
        held,
    } = match admit(gw, peer, headers, uri, q).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    let opened = streamable::open(
        registry,
        gw,
        identity,
        conn_id.clone(),
        client_addr,
        pool,
        (id, body),
        Box::new(held),
    )
    .await;
    match opened {
        Ok((_conn, answer)) => {
            let mut response = (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                answer.to_string(),
            )
                .into_response();
            connection_headers(gw, &conn_id, response.headers_mut());
            response
        }
        Err(Refused::Failed(answer)) => (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "application/json")],
            answer.to_string(),
        )
            .into_response(),
        Err(Refused::NoAnswer) => refuse(StatusCode::GATEWAY_TIMEOUT, "initialize was not answered in time"),
    }
}

/// `GET /acp` without an upgrade: an SSE stream.
pub(super) async fn open_stream(
    gw: &Gateway,
    registry: &Registry,
    headers: &HeaderMap,
    uri: &axum::http::Uri,
) -> Response {
    let identity = match caller(gw, headers, uri).await {
        Ok(identity) => identity,
        Err(unauthorized) => return unauthorized,
    };
    let accepts = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("text/event-stream"));
    if !accepts {
        return refuse(
            StatusCode::NOT_ACCEPTABLE,
            "a GET of /acp without Upgrade: websocket reads an SSE stream: Accept must include text/event-stream",
        );
    }
    let conn = match connection(registry, headers, &identity.user) {
        Ok(conn) => conn,
        Err((status, why)) => return refuse(status, why),
    };
    let session: Option<Arc<str>> = header_str(headers, SESSION_ID).map(Arc::from);
    if let Some(sid) = &session
        && !conn.has_stream(sid)
        && gw.sessions.live(&identity.user, sid).is_none()
        && gw.sessions.stored(&identity.user, sid).await.is_err()
    {
        return refuse(StatusCode::NOT_FOUND, "unknown Acp-Session-Id");
    }
    let last_event_id = header_str(headers, "last-event-id");
    match streamable::read(registry, conn, &gw.sessions, session, last_event_id).await {
        Ok(reader) => {
            let mut response = Response::new(Body::from_stream(reader));
            let h = response.headers_mut();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
            h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, no-store"));
            // Proxies that buffer answers (nginx) would hold the stream back.
            h.insert("x-accel-buffering", HeaderValue::from_static("no"));
            response
        }
        Err(ReadRefused::TooManyStreams) => refuse(
            StatusCode::TOO_MANY_REQUESTS,
            "too many streams (limits.max_streams_per_connection, limits.max_streams_per_user)",
        ),
        Err(ReadRefused::Store) => refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "cannot read the session's stored updates to resume after Last-Event-ID",
        ),
    }
}

/// `DELETE /acp`: ends the connection.
pub(super) async fn delete(
    State(gw): State<Gateway>,
    registry: Registered,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Response {
    let identity = match caller(&gw, &headers, &uri).await {
        Ok(identity) => identity,
        Err(unauthorized) => return unauthorized,
    };
    match connection(&registry, &headers, &identity.user) {
        Ok(conn) => {
            conn.delete();
            StatusCode::ACCEPTED.into_response()
        }
        Err((status, why)) => refuse(status, why),
    }
}
