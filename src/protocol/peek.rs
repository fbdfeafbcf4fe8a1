//! Reading an outgoing frame for where it goes, without building it as a tree: which session it
//! belongs to, its `seq` when it is a stored update, its id when it is an answer. The editor
//! bridge reads the bulk of a stream with it, and Streamable HTTP routes each frame to its SSE
//! stream with it. Every member it does not name is skipped, not kept.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

/// What a frame says about where it goes.
#[derive(Debug, Default)]
pub struct Peek<'a> {
    /// The method, for requests and notifications.
    pub method: Option<Cow<'a, str>>,
    /// The id, raw, for requests and answers.
    pub id: Option<&'a RawValue>,
    /// `params.sessionId`, or for an answer `result.sessionId`.
    pub session_id: Option<Cow<'a, str>>,
    /// `params._meta.gateway.seq`: a stored update's number.
    pub seq: Option<u64>,
    /// `params.update.sessionUpdate`: an update's kind.
    pub kind: Option<Cow<'a, str>>,
}

impl Peek<'_> {
    /// An answer: an id and no method.
    pub fn is_answer(&self) -> bool {
        self.method.is_none() && self.id.is_some()
    }

    /// A `session/update` notification.
    pub fn is_update(&self) -> bool {
        self.method.as_deref() == Some("session/update") && self.id.is_none()
    }
}

#[derive(Deserialize)]
struct Frame<'a> {
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    params: Option<Params<'a>>,
    #[serde(borrow, default)]
    result: Option<Result<'a>>,
}

#[derive(Deserialize)]
struct Params<'a> {
    #[serde(rename = "sessionId", borrow, default)]
    session_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    update: Option<Kind<'a>>,
    #[serde(rename = "_meta", default)]
    meta: Option<Meta>,
}

#[derive(Deserialize)]
struct Result<'a> {
    #[serde(rename = "sessionId", borrow, default)]
    session_id: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Kind<'a> {
    #[serde(rename = "sessionUpdate", borrow, default)]
    kind: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Meta {
    #[serde(default)]
    gateway: Option<Gateway>,
}

#[derive(Deserialize)]
struct Gateway {
    #[serde(default)]
    seq: Option<u64>,
}

/// Reads `text` for where it goes; `None` when it is not a JSON object of the usual shapes
/// (`params` and `result` that are not objects read as absent).
pub fn peek(text: &str) -> Option<Peek<'_>> {
    let frame: Frame<'_> = serde_json::from_str(text).ok()?;
    let (mut session_id, mut seq, mut kind) = (None, None, None);
    if let Some(p) = frame.params {
        session_id = p.session_id;
        seq = p.meta.and_then(|m| m.gateway).and_then(|g| g.seq);
        kind = p.update.and_then(|u| u.kind);
    }
    if session_id.is_none() && frame.method.is_none() {
        session_id = frame.result.and_then(|r| r.session_id);
    }
    Some(Peek {
        method: frame.method,
        id: frame.id,
        session_id,
        seq,
        kind,
    })
}

/// [`peek`], tolerating `params` or `result` that are not objects (an answer whose result is
/// `null`, a request whose params are an array): read as absent rather than failing the frame.
pub fn peek_lenient(text: &str) -> Option<Peek<'_>> {
    peek(text).or_else(|| {
        #[derive(Deserialize)]
        struct Bare<'a> {
            #[serde(borrow, default)]
            method: Option<Cow<'a, str>>,
            #[serde(borrow, default)]
            id: Option<&'a RawValue>,
        }
        let bare: Bare<'_> = serde_json::from_str(text).ok()?;
        Some(Peek {
            method: bare.method,
            id: bare.id,
            ..Peek::default()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_is_read_for_its_session_seq_and_kind() {
        let text = crate::protocol::session_update_raw_id(
            r#""s1""#,
            r#"{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}"#,
            42,
            None,
        );
        let p = peek(&text).expect("an update");
        assert!(p.is_update() && !p.is_answer());
        assert_eq!(p.session_id.as_deref(), Some("s1"));
        assert_eq!(p.seq, Some(42));
        assert_eq!(p.kind.as_deref(), Some("agent_message_chunk"));
    }

    #[test]
    fn answers_requests_and_odd_shapes() {
        let p = peek(r#"{"jsonrpc":"2.0","id":7,"result":{"sessionId":"s2","modes":null}}"#).expect("answer");
        assert!(p.is_answer());
        assert_eq!(p.id.map(RawValue::get), Some("7"));
        assert_eq!(
            p.session_id.as_deref(),
            Some("s2"),
            "session/new's answer names its session"
        );
        let p = peek(r#"{"jsonrpc":"2.0","id":"x","method":"session/request_permission","params":{"sessionId":"s3"}}"#)
            .expect("request");
        assert!(!p.is_answer() && !p.is_update());
        assert_eq!(p.session_id.as_deref(), Some("s3"));
        assert_eq!(p.seq, None);
        assert!(peek(r#"{"jsonrpc":"2.0","id":1,"result":null}"#).is_some());
        let p = peek_lenient(r#"{"jsonrpc":"2.0","id":1,"result":[1,2]}"#).expect("lenient");
        assert!(p.is_answer() && p.session_id.is_none());
        assert!(peek_lenient("not json").is_none());
        let escaped = peek(r#"{"method":"session/update","params":{"sessionId":"a\"b"}}"#).expect("escaped");
        assert_eq!(escaped.session_id.as_deref(), Some("a\"b"));
    }
}
