//! Client requests, parsed once (in the connection's read loop) into what the gateway reads of
//! them: the official ACP schema types (`agent-client-protocol-schema`) where the gateway
//! interprets params, raw JSON where it only forwards them. A prompt is never re-serialized.

use crate::protocol::method::ClientMethod;
use std::borrow::Cow;

use agent_client_protocol_schema::v1::{AuthenticateRequest, NewSessionRequest};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::protocol::{RpcError, codes};

/// One request from a client, parsed.
#[derive(Debug)]
pub(super) enum ClientRequest {
    /// `initialize` (answered once, before anything else).
    Initialize,
    /// `authenticate`: checked against the schema, forwarded (filtered) to the user's process.
    Authenticate(Box<RawValue>),
    /// The draft `auth/status`: forwarded (filtered) to the user's process.
    AuthStatus(Box<RawValue>),
    /// `session/new`.
    New(Box<NewSessionRequest>),
    /// `session/fork` (draft), raw params.
    Fork(Box<RawValue>),
    /// `session/load` (`replay`) or `session/resume`.
    Load {
        session_id: String,
        /// The client's cwd, when it sent one (it must still be inside its roots).
        cwd: Option<String>,
        additional_dirs: Vec<String>,
        /// `_meta.gateway.afterSeq`: replay only what came after it.
        after_seq: u64,
        replay: bool,
    },
    /// `session/attach` (the draft multi-client RFD): the caller's session, or one shared with
    /// them, live, with the history `history` asks for.
    Attach {
        session_id: String,
        /// The role asked for (`None`: the most the caller may have).
        role: Option<crate::sharing::Role>,
        history: History,
        /// `_meta.gateway.afterSeq`, for `full`.
        after_seq: u64,
    },
    /// `session/detach`: stop receiving a session's updates.
    Detach { session_id: String },
    /// `session/list`, raw params (the gateway's own filters beside ACP's).
    List(Option<Box<RawValue>>),
    /// `session/close` or (`delete`) `session/delete`.
    Close { session_id: String, delete: bool },
    /// A session method the agent answers (`session/prompt`, `set_mode`, …, extension methods).
    Forward {
        method: String,
        session_id: String,
        /// The whole params, raw (the session id and `_meta` are rewritten on the way).
        params: Box<RawValue>,
        /// `prompt` of a `session/prompt`, raw.
        prompt: Option<Box<RawValue>>,
    },
}

/// What an attaching client is given of what came before (`historyPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum History {
    /// The stored transcript, then live (the default).
    Full,
    /// Only the agent's requests nobody has answered yet, then live.
    PendingOnly,
    /// Live from now on.
    None,
}

impl History {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::PendingOnly => "pending_only",
            Self::None => "none",
        }
    }
}

#[derive(Deserialize)]
struct AttachParams<'a> {
    #[serde(rename = "sessionId", borrow)]
    session_id: Cow<'a, str>,
    #[serde(default)]
    role: Option<String>,
    #[serde(rename = "historyPolicy", default)]
    history_policy: Option<String>,
    #[serde(rename = "_meta", default)]
    meta: Option<LoadMeta>,
}

impl ClientRequest {
    /// The session it names, for requests that name one.
    pub(super) fn session_id(&self) -> Option<&str> {
        match self {
            Self::Load { session_id, .. }
            | Self::Close { session_id, .. }
            | Self::Forward { session_id, .. }
            | Self::Attach { session_id, .. }
            | Self::Detach { session_id } => Some(session_id),
            _ => None,
        }
    }
}

/// What the gateway reads of a forwarded request.
#[derive(Deserialize)]
struct Forwarded<'a> {
    #[serde(rename = "sessionId", borrow)]
    session_id: Cow<'a, str>,
    #[serde(borrow, default)]
    prompt: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct SessionOnly<'a> {
    #[serde(rename = "sessionId", borrow)]
    session_id: Cow<'a, str>,
}

/// `session/load` and `session/resume`: `cwd` may be left out (the stored one is what the agent
/// gets on restore anyway).
#[derive(Deserialize)]
struct LoadParams<'a> {
    #[serde(rename = "sessionId", borrow)]
    session_id: Cow<'a, str>,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(rename = "additionalDirectories", default)]
    additional_dirs: Option<Vec<String>>,
    #[serde(rename = "_meta", default)]
    meta: Option<LoadMeta>,
}

#[derive(Deserialize, Default)]
struct LoadMeta {
    #[serde(default)]
    gateway: Option<LoadGatewayMeta>,
}

#[derive(Deserialize, Default)]
struct LoadGatewayMeta {
    #[serde(rename = "afterSeq", default)]
    after_seq: Option<u64>,
}

fn typed<'a, T: Deserialize<'a>>(params: Option<&'a RawValue>, method: &str) -> Result<T, RpcError> {
    let text = params.map_or("null", RawValue::get);
    // ACP's params are objects; serde would also read an array as the fields in order.
    if !text.starts_with('{') {
        return Err(RpcError::invalid_params(format!("{method} params must be an object")));
    }
    serde_json::from_str(text).map_err(|e| RpcError::invalid_params(format!("invalid {method} params: {e}")))
}

/// Parses a request for `method`; `-32601` for a method the gateway does not serve, `-32602`
/// for params it cannot read.
pub(super) fn parse(method: &str, params: Option<&RawValue>) -> Result<ClientRequest, RpcError> {
    let owned = || params.map_or_else(|| RawValue::from_string("{}".into()), |p| Ok(p.to_owned()));
    let owned = || owned().map_err(|e| RpcError::invalid_params(format!("invalid params: {e}")));
    use ClientMethod as M;
    let Some(known) = ClientMethod::parse(method) else {
        return if method.starts_with('_') {
            forward(method, params, owned()?)
        } else {
            Err(RpcError::method_not_found(method))
        };
    };
    Ok(match known {
        M::Initialize => ClientRequest::Initialize,
        M::Authenticate => {
            typed::<AuthenticateRequest>(params, method)?;
            ClientRequest::Authenticate(owned()?)
        }
        M::AuthStatus => {
            if params.is_some_and(|p| !p.get().starts_with('{')) {
                return Err(RpcError::invalid_params("auth/status params must be an object"));
            }
            ClientRequest::AuthStatus(owned()?)
        }
        M::SessionNew => ClientRequest::New(Box::new(typed(params, method)?)),
        M::SessionFork => {
            typed::<SessionOnly<'_>>(params, method)?;
            ClientRequest::Fork(owned()?)
        }
        M::SessionLoad | M::SessionResume => {
            let p: LoadParams<'_> = typed(params, method)?;
            ClientRequest::Load {
                session_id: p.session_id.into_owned(),
                cwd: p.cwd,
                additional_dirs: p.additional_dirs.unwrap_or_default(),
                after_seq: p.meta.and_then(|m| m.gateway).and_then(|g| g.after_seq).unwrap_or(0),
                replay: method == "session/load",
            }
        }
        M::SessionAttach => {
            let p: AttachParams<'_> = typed(params, method)?;
            let role = match p.role.as_deref() {
                None => None,
                Some(r) => Some(crate::sharing::Role::parse(r).ok_or_else(|| {
                    RpcError::invalid_params(format!("role must be \"controller\" or \"observer\", not {r:?}"))
                })?),
            };
            let history = match p.history_policy.as_deref() {
                None | Some("full") => History::Full,
                Some("pending_only") => History::PendingOnly,
                Some("none") => History::None,
                Some(h) => {
                    return Err(RpcError::invalid_params(format!(
                        "historyPolicy must be \"full\", \"pending_only\" or \"none\", not {h:?}"
                    )));
                }
            };
            ClientRequest::Attach {
                session_id: p.session_id.into_owned(),
                role,
                history,
                after_seq: p.meta.and_then(|m| m.gateway).and_then(|g| g.after_seq).unwrap_or(0),
            }
        }
        M::SessionDetach => {
            let p: SessionOnly<'_> = typed(params, method)?;
            ClientRequest::Detach {
                session_id: p.session_id.into_owned(),
            }
        }
        M::SessionList => ClientRequest::List(params.map(RawValue::to_owned)),
        M::SessionClose | M::SessionDelete => {
            let p: SessionOnly<'_> = typed(params, method)?;
            ClientRequest::Close {
                session_id: p.session_id.into_owned(),
                delete: known == M::SessionDelete,
            }
        }
        M::SessionPrompt | M::SetMode | M::SetConfigOption | M::SetModel => forward(method, params, owned()?)?,
        // Notifications, never requests.
        M::SessionCancel | M::CancelRequest => return Err(RpcError::method_not_found(method)),
    })
}

/// A request the gateway forwards to the session's agent as the client sent it: a prompt, a
/// control, or an extension method (`_…`) that names a session.
fn forward(method: &str, params: Option<&RawValue>, owned: Box<RawValue>) -> Result<ClientRequest, RpcError> {
    let p: Forwarded<'_> = match typed(params, method) {
        Ok(p) => p,
        // An extension method without a session is not ours to forward.
        Err(_) if method.starts_with('_') => return Err(RpcError::method_not_found(method)),
        Err(e) => return Err(e),
    };
    if method == ClientMethod::SessionPrompt.name() && p.prompt.is_none() {
        return Err(RpcError::invalid_params(
            "invalid session/prompt params: missing field `prompt`",
        ));
    }
    Ok(ClientRequest::Forward {
        method: method.to_string(),
        session_id: p.session_id.into_owned(),
        prompt: p.prompt.map(RawValue::to_owned),
        params: owned,
    })
}

/// The error for a request before `initialize`.
pub(super) fn not_initialized() -> RpcError {
    RpcError::new(codes::INVALID_REQUEST, "the first request must be initialize")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_string()).expect("raw")
    }

    #[test]
    fn parses_what_the_gateway_reads_and_keeps_the_rest_raw() {
        let p =
            raw(r#"{"cwd":"/w","mcpServers":[{"name":"x","command":"/bin/sh","args":[],"env":[]}],"_meta":{"k":1}}"#);
        let ClientRequest::New(new) = parse("session/new", Some(&p)).expect("new") else {
            panic!("not new")
        };
        assert_eq!(new.cwd, std::path::PathBuf::from("/w"));
        assert_eq!(new.mcp_servers.len(), 1);
        let p = raw(r#"{"sessionId":"s","prompt":[{"type":"text","text":"hi"}]}"#);
        let ClientRequest::Forward {
            session_id,
            prompt,
            params,
            ..
        } = parse("session/prompt", Some(&p)).expect("prompt")
        else {
            panic!("not forwarded")
        };
        assert_eq!(session_id, "s");
        assert_eq!(prompt.expect("prompt").get(), r#"[{"type":"text","text":"hi"}]"#);
        assert_eq!(params.get(), p.get(), "forwarded bytes are the client's");
        let p = raw(r#"{"sessionId":"s","_meta":{"gateway":{"afterSeq":7}}}"#);
        let ClientRequest::Load { after_seq, replay, .. } = parse("session/load", Some(&p)).expect("load") else {
            panic!("not load")
        };
        assert_eq!((after_seq, replay), (7, true));
    }

    #[test]
    fn bad_params_and_unknown_methods_are_told_apart() {
        let code = |m: &str, p: &str| parse(m, Some(&raw(p))).err().map(|e| e.code);
        assert_eq!(code("session/new", r#"{"mcpServers":[]}"#), Some(codes::INVALID_PARAMS));
        assert_eq!(
            code("session/prompt", r#"{"sessionId":"s"}"#),
            Some(codes::INVALID_PARAMS)
        );
        assert_eq!(code("authenticate", r#"{}"#), Some(codes::INVALID_PARAMS));
        assert_eq!(code("nope/nope", "{}"), Some(codes::METHOD_NOT_FOUND));
        assert_eq!(code("_vendor/x", "{}"), Some(codes::METHOD_NOT_FOUND), "no session");
        let mcp = r#"{"cwd":"/w","mcpServers":[{"type":"websocket","name":"x","url":"ws://x"}]}"#;
        assert_eq!(
            code("session/new", mcp),
            Some(codes::INVALID_PARAMS),
            "unknown MCP type"
        );
    }
}

/// Properties of request parsing: any method with any params is parsed or refused with the
/// precise error, never a panic, and what is forwarded is the client's bytes.
#[cfg(test)]
mod props {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    /// Methods the gateway serves whose params must be an object.
    const OBJECT_PARAMS: [&str; 11] = [
        "authenticate",
        "session/new",
        "session/load",
        "session/resume",
        "session/close",
        "session/delete",
        "session/prompt",
        "session/set_mode",
        "session/set_config_option",
        "session/set_model",
        "_vendor/ext",
    ];

    fn json_value() -> impl Strategy<Value = Value> {
        crate::protocol::props::json_value_keyed("[a-z]{0,3}|sessionId|prompt|cwd|_meta")
    }

    /// Params: anything, session-shaped objects with members of any type, and arrays that line up
    /// with the fields the gateway reads.
    fn params() -> impl Strategy<Value = Option<Value>> {
        let sid = prop_oneof![any::<String>().prop_map(Value::String), json_value()];
        let session_object = (
            sid.clone(),
            prop::option::of(json_value()),
            prop::option::of(json_value()),
            prop::option::of(prop_oneof![any::<u64>().prop_map(Value::from), json_value()]),
        )
            .prop_map(|(sid, prompt, cwd, after)| {
                let mut p = json!({ "sessionId": sid });
                if let Some(prompt) = prompt {
                    p["prompt"] = prompt;
                }
                if let Some(cwd) = cwd {
                    p["cwd"] = cwd;
                }
                if let Some(after) = after {
                    p["_meta"] = json!({"gateway": {"afterSeq": after}});
                }
                p
            });
        let positional = (sid, prop::option::of(json_value()))
            .prop_map(|(sid, second)| Value::Array(std::iter::once(sid).chain(second).collect()));
        prop::option::of(prop_oneof![json_value(), session_object, positional])
    }

    fn method() -> impl Strategy<Value = String> {
        prop_oneof![
            prop::sample::select(OBJECT_PARAMS.to_vec()).prop_map(String::from),
            Just(String::from("initialize")),
            Just(String::from("session/list")),
            any::<String>(),
            "_[a-z/]{0,8}|session/[a-z_]{0,12}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1024, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn any_request_is_parsed_or_refused_precisely(method in method(), params in params()) {
            let raw = params.as_ref().map(|p| RawValue::from_string(p.to_string()).expect("JSON"));
            let is_object = params.as_ref().is_some_and(Value::is_object);
            match parse(&method, raw.as_deref()) {
                Err(e) => {
                    prop_assert!(
                        e.code == codes::METHOD_NOT_FOUND || e.code == codes::INVALID_PARAMS,
                        "{} {:?}: {}", method, params, e
                    );
                    if e.code == codes::METHOD_NOT_FOUND {
                        prop_assert!(!OBJECT_PARAMS.contains(&method.as_str()) || method.starts_with('_'));
                    }
                }
                Ok(request) => {
                    let needs_object = OBJECT_PARAMS.contains(&method.as_str())
                        || method.starts_with('_')
                        || method.starts_with("session/") && method != "session/list";
                    if needs_object {
                        prop_assert!(is_object, "{} accepted params that are not an object: {:?}", method, params);
                    }
                    match request {
                        ClientRequest::Forward { session_id, params: forwarded, prompt, .. } => {
                            let p = params.clone().unwrap_or_default();
                            prop_assert_eq!(forwarded.get(), raw.as_deref().map_or("{}", RawValue::get), "the client's bytes");
                            prop_assert_eq!(Some(session_id.as_str()), p["sessionId"].as_str());
                            prop_assert_eq!(
                                prompt.map(|p| serde_json::from_str::<Value>(p.get()).expect("JSON")),
                                p.get("prompt").filter(|v| !v.is_null()).cloned()
                            );
                        }
                        ClientRequest::Load { session_id, after_seq, replay, .. } => {
                            let p = params.clone().unwrap_or_default();
                            prop_assert_eq!(Some(session_id.as_str()), p["sessionId"].as_str());
                            prop_assert_eq!(after_seq, p["_meta"]["gateway"]["afterSeq"].as_u64().unwrap_or(0));
                            prop_assert_eq!(replay, method == "session/load");
                        }
                        ClientRequest::Close { session_id, delete } => {
                            prop_assert_eq!(Some(session_id.as_str()), params.as_ref().and_then(|p| p["sessionId"].as_str()));
                            prop_assert_eq!(delete, method == "session/delete");
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}
