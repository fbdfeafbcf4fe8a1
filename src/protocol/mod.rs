//! JSON-RPC 2.0 plumbing shared by both sides of the bridge.
//!
//! Messages are parsed once, into [`Incoming`], which borrows `id`, `params`, `result` and `error`
//! as raw JSON slices. Frames going out are built by splicing those slices into a new envelope, so
//! payloads are never re-serialized (an agent's `session/update` reaches the browser byte for byte).

pub mod frames;

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

pub use frames::*;

/// JSON-RPC and ACP error codes the gateway emits.
pub mod codes {
    /// Invalid JSON was received.
    pub const PARSE_ERROR: i64 = -32700;
    /// The JSON sent is not a valid request object (or is a batch, which ACP refuses).
    pub const INVALID_REQUEST: i64 = -32600;
    /// The method does not exist or is not available.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// Invalid method parameters.
    pub const INVALID_PARAMS: i64 = -32602;
    /// Internal error: the agent crashed, the database failed, and the like.
    pub const INTERNAL_ERROR: i64 = -32603;
    /// ACP: resource (session) not found. Unknown and foreign ids both get this.
    pub const RESOURCE_NOT_FOUND: i64 = -32002;
}

/// A JSON-RPC error the gateway answers with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} ({code})")]
pub struct RpcError {
    /// One of [`codes`].
    pub code: i64,
    /// Human-readable, safe to show a client: never carries internal detail.
    pub message: Cow<'static, str>,
    /// Optional structured detail (already serialized JSON).
    pub data: Option<String>,
}

impl RpcError {
    /// An error with a code and message.
    pub fn new(code: i64, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }
    /// Attaches structured detail.
    pub fn with_data(mut self, data: serde_json::Value) -> Self {
        self.data = Some(data.to_string());
        self
    }
    /// `-32602` with a reason.
    pub fn invalid_params(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(codes::INVALID_PARAMS, message)
    }
    /// `-32603` with a reason.
    pub fn internal(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(codes::INTERNAL_ERROR, message)
    }
    /// `-32601` naming the method.
    pub fn method_not_found(method: &str) -> Self {
        Self::new(codes::METHOD_NOT_FOUND, format!("method not found: {method}"))
    }
    /// `-32002`: the one answer for an unknown session and for another user's session.
    pub fn session_not_found() -> Self {
        Self::new(codes::RESOURCE_NOT_FOUND, "session not found")
    }
}

/// One JSON-RPC message as it arrived, borrowing from the frame or line it came in.
#[derive(Debug, Deserialize)]
pub struct Incoming<'a> {
    /// The request id, if any (a `null` id reads as `None`).
    #[serde(borrow, default)]
    pub id: Option<&'a RawValue>,
    /// The method, for requests and notifications.
    #[serde(borrow, default)]
    pub method: Option<Cow<'a, str>>,
    /// Parameters, untouched.
    #[serde(borrow, default, deserialize_with = "present")]
    pub params: Option<&'a RawValue>,
    /// A response's result, untouched (`Some("null")` for a `null` result).
    #[serde(borrow, default, deserialize_with = "present")]
    pub result: Option<&'a RawValue>,
    /// A response's error, untouched.
    #[serde(borrow, default, deserialize_with = "present")]
    pub error: Option<&'a RawValue>,
}

/// What kind of message an [`Incoming`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Has a method and an id.
    Request,
    /// Has a method and no id.
    Notification,
    /// Has an id and a result or an error.
    Response,
}

/// Why a frame could not be read as a JSON-RPC message.
#[derive(Debug)]
pub enum ParseFailure {
    /// Not JSON at all: answer `-32700` with a null id.
    NotJson(String),
    /// A JSON array: ACP refuses batches.
    Batch,
    /// JSON, but not a JSON-RPC message; carries the id when one could be read.
    Invalid(Option<Box<RawValue>>, &'static str),
}

impl<'a> Incoming<'a> {
    /// Parses one frame or line. Whitespace-only input is `NotJson`.
    pub fn parse(text: &'a str) -> Result<(Self, Kind), ParseFailure> {
        let trimmed = text.trim_start();
        if trimmed.starts_with('[') {
            return Err(if serde_json::from_str::<&RawValue>(text).is_ok() {
                ParseFailure::Batch
            } else {
                ParseFailure::NotJson("invalid JSON".into())
            });
        }
        let msg: Incoming<'a> = match serde_json::from_str(text) {
            Ok(m) => m,
            Err(e) if e.is_data() => {
                // Valid JSON of the wrong shape (a string, a number, `method: 3`...).
                let id = serde_json::from_str::<IdOnly>(text).ok().and_then(|i| i.id);
                return Err(ParseFailure::Invalid(id, "not a JSON-RPC 2.0 message"));
            }
            Err(e) => return Err(ParseFailure::NotJson(e.to_string())),
        };
        let kind = match (&msg.method, msg.id.is_some()) {
            (Some(_), true) => Kind::Request,
            (Some(_), false) => Kind::Notification,
            (None, true) if msg.result.is_some() || msg.error.is_some() => Kind::Response,
            (None, _) => {
                return Err(ParseFailure::Invalid(
                    msg.id.map(RawValue::to_owned),
                    "message has no method",
                ));
            }
        };
        Ok((msg, kind))
    }

    /// The method name, or `""` for responses.
    pub fn method(&self) -> &str {
        self.method.as_deref().unwrap_or("")
    }
}

/// A member that is present, even as `null`, reads as `Some` (serde's `Option` would say `None`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
struct IdOnly {
    #[serde(default)]
    id: Option<Box<RawValue>>,
}

/// Reads a numeric id the gateway issued itself (ids it hands out are always unsigned integers).
pub fn own_id(id: &RawValue) -> Option<u64> {
    id.get().parse().ok()
}

/// The common shape of params that name a session.
#[derive(Debug, Deserialize)]
pub struct SessionParams<'a> {
    /// The session id.
    #[serde(rename = "sessionId", borrow)]
    pub session_id: Cow<'a, str>,
}

/// Reads `params.sessionId`, if the params are an object that has one.
pub fn session_id_of(params: Option<&RawValue>) -> Option<String> {
    let params = params?;
    serde_json::from_str::<SessionParams<'_>>(params.get())
        .ok()
        .map(|p| p.session_id.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_messages() {
        let (m, k) = Incoming::parse(r#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":[1, 2]}}"#).unwrap();
        assert_eq!(k, Kind::Request);
        assert_eq!(m.params.unwrap().get(), r#"{"a":[1, 2]}"#);
        let (_, k) = Incoming::parse(r#"{"jsonrpc":"2.0","method":"x"}"#).unwrap();
        assert_eq!(k, Kind::Notification);
        let (m, k) = Incoming::parse(r#"{"jsonrpc":"2.0","id":"a","result":null}"#).unwrap();
        assert_eq!(k, Kind::Response);
        assert_eq!(m.id.unwrap().get(), r#""a""#);
    }

    #[test]
    fn refuses_bad_input() {
        assert!(matches!(Incoming::parse("{nope"), Err(ParseFailure::NotJson(_))));
        assert!(matches!(Incoming::parse("[1,2]"), Err(ParseFailure::Batch)));
        assert!(matches!(Incoming::parse("[1,"), Err(ParseFailure::NotJson(_))));
        assert!(matches!(Incoming::parse("42"), Err(ParseFailure::Invalid(None, _))));
        match Incoming::parse(r#"{"id":7,"method":3}"#) {
            Err(ParseFailure::Invalid(Some(id), _)) => assert_eq!(id.get(), "7"),
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(
            Incoming::parse(r#"{"id":7}"#),
            Err(ParseFailure::Invalid(Some(_), _))
        ));
    }
}
