//! How a failed API call becomes an HTTP answer.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::protocol::{RpcError, codes};

/// An error of the sessions API (shared with ACP, hence a JSON-RPC error) answered over HTTP:
/// `{"error": message}` with the status its code maps to. The message is already safe to show
/// (whatever failed inside was logged where the error was made), so nothing is logged here.
#[derive(Debug)]
pub(super) struct HttpError(RpcError);

impl From<RpcError> for HttpError {
    fn from(e: RpcError) -> Self {
        Self(e)
    }
}

impl HttpError {
    /// `400` for bad parameters, `404` for an unknown (or another user's) session, `429` for a
    /// cap reached, else `500`.
    fn status_code(&self) -> StatusCode {
        match self.0.code {
            codes::INVALID_PARAMS => StatusCode::BAD_REQUEST,
            codes::RESOURCE_NOT_FOUND => StatusCode::NOT_FOUND,
            crate::usage::quota::CAP_REACHED => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        (self.status_code(), Json(json!({ "error": self.0.message }))).into_response()
    }
}

/// The answer to a failed request about a user's sealed list (MCP servers, push devices): `400`
/// naming what is wrong, `403` when the operator turned it off, `503` when the store failed.
pub(super) fn list_refusal(user: &str, e: crate::store::sealed_list::ListError) -> Response {
    use crate::store::sealed_list::ListError;
    match e {
        ListError::Invalid(m) => refuse(StatusCode::BAD_REQUEST, m),
        ListError::Off(m) => refuse(StatusCode::FORBIDDEN, m),
        ListError::Unavailable(e) => {
            tracing::error!(user, error = %e, "a user's sealed list");
            refuse(StatusCode::SERVICE_UNAVAILABLE, e.what_failed())
        }
    }
}

/// A refusal that is not a JSON-RPC error (sign-in routes): `status` with `{"error": message}`.
pub(super) fn refuse(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_statuses() {
        let cases = [
            (RpcError::invalid_params("bad cursor"), StatusCode::BAD_REQUEST),
            (RpcError::session_not_found(), StatusCode::NOT_FOUND),
            (
                RpcError::internal("session store unavailable"),
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
            (RpcError::method_not_found("x"), StatusCode::INTERNAL_SERVER_ERROR),
        ];
        for (e, status) in cases {
            assert_eq!(HttpError::from(e).into_response().status(), status);
        }
    }
}
