//! JSON-RPC 2.0 plumbing shared by both sides of the bridge.
//!
//! Messages are parsed once, into [`Incoming`], which borrows `id`, `params`, `result` and `error`
//! as raw JSON slices. Frames going out are built by splicing those slices into a new envelope, so
//! payloads are never re-serialized (an agent's `session/update` reaches the browser byte for byte).

pub mod frames;
pub mod method;
pub mod peek;

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
    /// ACP: authentication required (the agent wants its user signed in first).
    pub const AUTH_REQUIRED: i64 = -32000;
    /// The gateway's: a per-user cap was reached (connections, sessions, prompts, processes).
    pub const CAP_REACHED: i64 = -32029;
    /// The gateway's: a user's cost cap was reached.
    pub const COST_CAP_REACHED: i64 = -32030;
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
    /// The request id, if any, raw (a `null` id is `Some("null")`: JSON-RPC allows it, and it is
    /// answered as given).
    #[serde(borrow, default, deserialize_with = "present")]
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
            // serde stops at the first member of the wrong type: only text that is JSON all
            // the way through is an invalid request rather than a parse error.
            Err(e) if e.is_data() && serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok() => {
                // Valid JSON of the wrong shape (a string, a number, `method: 3`...).
                let id = serde_json::from_str::<IdOnly>(text)
                    .ok()
                    .and_then(|i| i.id)
                    .filter(|id| is_valid_id(id));
                return Err(ParseFailure::Invalid(id, "not a JSON-RPC 2.0 message"));
            }
            Err(e) => return Err(ParseFailure::NotJson(e.to_string())),
        };
        if msg.id.is_some_and(|id| !is_valid_id(id)) {
            return Err(ParseFailure::Invalid(None, "id must be a string, a number or null"));
        }
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

/// Whether a raw id is one JSON-RPC allows: a string, a number, or `null`.
fn is_valid_id(id: &RawValue) -> bool {
    matches!(id.get().as_bytes().first(), Some(b'"' | b'-' | b'0'..=b'9' | b'n'))
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

/// Properties of the parser both sides of the bridge use: whatever a client's frame or an agent's
/// line holds, parsing never panics and classifies it the way JSON-RPC 2.0 does.
#[cfg(test)]
pub(crate) mod props {
    use super::*;
    use proptest::prelude::*;
    use serde::de::IgnoredAny;
    use serde_json::{Map, Value, json};

    /// Enough cases to find what the generators can reach, few enough to run in a second or two.
    fn config(cases: u32) -> ProptestConfig {
        ProptestConfig {
            cases,
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    /// Any JSON value whose object keys match the regex `keys`, nested three deep. Floats are
    /// ones that read back as themselves (serde_json's parser may be an ulp off otherwise; the
    /// gateway splices raw text, so that is no concern of its).
    pub(crate) fn json_value_keyed(keys: &'static str) -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_filter_map("finite, reads back", |f| {
                let n = serde_json::Number::from_f64(f)?;
                (serde_json::from_str::<f64>(&n.to_string()).ok() == Some(f)).then_some(Value::Number(n))
            }),
            any::<String>().prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map(keys, inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn json_value() -> impl Strategy<Value = Value> {
        json_value_keyed("[a-z]{0,3}|id|method|params|result|error|sessionId|_meta")
    }

    /// An object with any subset of JSON-RPC's members, each of any type (strings more often).
    fn rpc_object() -> impl Strategy<Value = Value> {
        let member = || prop::option::of(prop_oneof![json_value(), any::<String>().prop_map(Value::String)]);
        (member(), member(), member(), member(), member(), member()).prop_map(
            |(v, id, method, params, result, error)| {
                let mut m = Map::new();
                for (name, value) in [
                    ("jsonrpc", v),
                    ("id", id),
                    ("method", method),
                    ("params", params),
                    ("result", result),
                    ("error", error),
                ] {
                    if let Some(value) = value {
                        m.insert(name.into(), value);
                    }
                }
                Value::Object(m)
            },
        )
    }

    /// Text a frame or a line may hold: anything, JSON-looking noise, JSON, JSON-RPC-shaped
    /// objects, and those cut short.
    fn frame_text() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            "[\\[\\]{}\":,0-9a-z .eE+\\\\-]{0,40}",
            json_value().prop_map(|v| v.to_string()),
            rpc_object().prop_map(|v| v.to_string()),
            (rpc_object(), any::<prop::sample::Index>()).prop_map(|(v, cut)| {
                let s = v.to_string();
                let mut at = cut.index(s.len() + 1);
                while !s.is_char_boundary(at) {
                    at -= 1;
                }
                s[..at].to_string()
            }),
        ]
    }

    fn is_json(text: &str) -> bool {
        serde_json::from_str::<IgnoredAny>(text).is_ok()
    }

    /// A JSON-RPC id: a string or a number (`null` only in an error about a request whose id
    /// could not be read).
    fn valid_id(id: &Value) -> bool {
        id.is_string() || id.is_number() || id.is_null()
    }

    proptest! {
        #![proptest_config(config(1024))]

        /// Every text is a request, a notification, a response, or exactly one of: not JSON
        /// (-32700), a batch (-32600), not a JSON-RPC message (-32600, with the id when it
        /// has a valid one).
        #[test]
        fn every_text_is_classified_as_json_rpc_says(text in frame_text()) {
            let parsed = Incoming::parse(&text);
            let value: Option<Value> = serde_json::from_str(&text).ok();
            let object = value.as_ref().and_then(Value::as_object);
            let id = object.and_then(|o| o.get("id"));
            let method = object.and_then(|o| o.get("method"));
            match parsed {
                Ok((msg, kind)) => {
                    prop_assert!(is_json(&text));
                    // Numbers beyond what `Value` holds are still JSON; nothing more to compare.
                    let Some(o) = object else { return Ok(()) };
                    prop_assert!(id.is_none_or(valid_id), "id of a type JSON-RPC forbids: {text}");
                    match kind {
                        Kind::Request | Kind::Notification => {
                            prop_assert_eq!(method.and_then(Value::as_str), Some(msg.method()));
                            prop_assert_eq!(kind == Kind::Request, o.contains_key("id"), "{}", text);
                        }
                        Kind::Response => {
                            prop_assert!(method.is_none_or(Value::is_null));
                            prop_assert!(o.contains_key("result") || o.contains_key("error"));
                            prop_assert!(id.is_some());
                        }
                    }
                    if let (Some(raw), Some(id)) = (msg.id, id) {
                        prop_assert_eq!(serde_json::from_str::<Value>(raw.get()).ok(), Some(id.clone()));
                    }
                }
                Err(ParseFailure::NotJson(_)) => prop_assert!(!is_json(&text), "JSON called not JSON: {text}"),
                Err(ParseFailure::Batch) => prop_assert!(is_json(&text) && text.trim_start().starts_with('[')),
                Err(ParseFailure::Invalid(raw, _)) => {
                    prop_assert!(is_json(&text), "not JSON, yet answered as an invalid request: {text:?}");
                    prop_assert!(!text.trim_start().starts_with('['));
                    if let Some(o) = object {
                        let is_request = method.is_some_and(Value::is_string) && o.contains_key("id");
                        let is_response = method.is_none_or(Value::is_null)
                            && id.is_some_and(|i| !i.is_null())
                            && (o.contains_key("result") || o.contains_key("error"));
                        prop_assert!(
                            !(is_request || is_response) || id.is_some_and(|i| !valid_id(i)),
                            "a valid message refused: {text}"
                        );
                    }
                    match (raw, id) {
                        (Some(raw), Some(id)) => {
                            prop_assert!(valid_id(id), "an invalid id is answered back: {text}");
                            prop_assert_eq!(serde_json::from_str::<Value>(raw.get()).ok(), Some(id.clone()));
                        }
                        (Some(raw), None) => prop_assert!(false, "an id from nowhere: {}", raw.get()),
                        (None, _) => {}
                    }
                }
            }
        }

        /// A valid id is read and written back byte for byte, however it is spelled.
        #[test]
        fn valid_ids_round_trip_byte_for_byte(
            id in prop_oneof![
                any::<String>().prop_map(|s| serde_json::to_string(&s).unwrap_or_default()),
                any::<String>().prop_map(|s| s.chars().map(|c| format!("\\u{:04x}", u32::from(c).min(0xffff))).collect::<String>())
                    .prop_map(|s| format!("\"{s}\"")),
                any::<i64>().prop_map(|n| n.to_string()),
                any::<u64>().prop_map(|n| n.to_string()),
                "-?[1-9][0-9]{20,60}",
                "-?(0|[1-9][0-9]{0,5})(\\.[0-9]{1,8})?([eE][+-]?[0-9]{1,3})?",
            ],
            pad in "[ \t\r\n]{0,2}",
        ) {
            prop_assume!(is_json(&id));
            let text = format!(r#"{{"jsonrpc":"2.0","id":{pad}{id}{pad},"method":"m","params":{{}}}}"#);
            let (msg, kind) = Incoming::parse(&text).map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
            prop_assert_eq!(kind, Kind::Request);
            let raw = msg.id.map(RawValue::get);
            prop_assert_eq!(raw, Some(id.as_str()));
            for frame in [
                error(Some(&id), &RpcError::method_not_found("m")),
                response(&id, "{}"),
                error_passthrough(&id, r#"{"code":1,"message":"x"}"#),
            ] {
                #[derive(Deserialize)]
                struct IdOf<'a> {
                    #[serde(borrow)]
                    id: &'a RawValue,
                }
                let back: IdOf<'_> = serde_json::from_str(&frame).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(back.id.get(), id.as_str());
            }
        }

        /// Whatever an agent writes on a line, reading the parts the gateway reads of it never
        /// panics, and what it builds from it is JSON.
        #[test]
        fn agent_lines_never_panic_and_rewrites_stay_json(
            text in frame_text(),
            sid in any::<String>(),
            keep in prop::collection::vec("[a-z]{0,3}|traceparent", 0..3),
        ) {
            let Ok((msg, _)) = Incoming::parse(&text) else { return Ok(()) };
            if let Some(id) = msg.id
                && let Some(n) = own_id(id)
            {
                prop_assert_eq!(id.get(), n.to_string(), "only the gateway's own spelling is its id");
            }
            let _ = session_id_of(msg.params);
            let _ = msg.method();
            let Some(params) = msg.params else { return Ok(()) };
            let as_value: Option<Value> = serde_json::from_str(params.get()).ok();
            let rewritten = with_session_id(params, &sid);
            prop_assert_eq!(rewritten.is_some(), params.get().starts_with('{'), "{}", params.get());
            if let (Some(out), Some(Value::Object(mut before))) = (rewritten, as_value.clone()) {
                let out: Value = serde_json::from_str(&out).map_err(|e| TestCaseError::fail(format!("{e}: {out}")))?;
                before.insert("sessionId".into(), json!(sid));
                prop_assert_eq!(out, Value::Object(before));
            }
            if let Some(out) = rewrite_params(params, None, Some(&keep)) {
                let out: Value = serde_json::from_str(&out).map_err(|e| TestCaseError::fail(format!("{e}: {out}")))?;
                if let Some(Value::Object(before)) = &as_value {
                    let meta = out.get("_meta").and_then(Value::as_object).cloned().unwrap_or_default();
                    prop_assert!(meta.keys().all(|k| keep.contains(k)));
                    for (k, v) in before.iter().filter(|(k, _)| *k != "_meta") {
                        prop_assert_eq!(out.get(k), Some(v));
                    }
                }
            }
        }
    }
}
