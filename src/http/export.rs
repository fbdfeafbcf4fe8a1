//! `GET /api/sessions/{id}/export?format=jsonl|markdown`: a session's stored transcript as a
//! download, for its owner only, streamed from the store at the client's pace.

use crate::audit::Audit;
use crate::session::Sessions;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use serde::Deserialize;
use serde_json::json;

use super::auth::{Caller, audit};
use super::error::HttpError;
use super::server::Peer;
use crate::export::{self, Format};
use crate::gateway::Gateway;
use crate::protocol::RpcError;

pub(super) fn router() -> Router<Gateway> {
    Router::new().route("/api/sessions/{id}/export", get(export_session))
}

#[derive(Deserialize)]
struct ExportQuery {
    format: Option<String>,
}

/// Another user's session answers as an unknown one does (`404`), before anything is read.
async fn export_session(
    State(audit_log): State<Arc<Audit>>,
    State(sessions): State<Arc<Sessions>>,
    Caller(who): Caller,
    peer: Option<Extension<Peer>>,
    Path(id): Path<String>,
    Query(q): Query<ExportQuery>,
) -> Result<Response, HttpError> {
    let format = Format::parse(q.format.as_deref()).map_err(|e| RpcError::invalid_params(e.to_string()))?;
    let record = sessions.stored(&who.user, &id).await?;
    audit(
        &audit_log,
        peer.as_deref(),
        &who.user,
        "session_export",
        Some(&id),
        "ok",
        Some(json!({ "format": format.extension() })),
    );
    let disposition = format!("attachment; filename=\"{}\"", export::file_name(&record, format));
    let body = Body::from_stream(export::stream(sessions.store().clone(), record, format));
    Ok((
        [
            (header::CONTENT_TYPE, format.content_type().to_string()),
            (header::CONTENT_DISPOSITION, disposition),
            (header::CACHE_CONTROL, String::from("no-store")),
        ],
        body,
    )
        .into_response())
}
