//! Builders for outgoing JSON-RPC frames. Each splices raw JSON into a fresh envelope with one
//! allocation; none of them re-serializes a payload it was handed.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::value::RawValue;

use super::RpcError;

/// Appends `s` as a JSON string literal.
pub fn push_json_str(out: &mut String, s: &str) {
    // Writing to a String cannot fail, and serializing a &str cannot fail either.
    out.push_str(&serde_json::to_string(s).unwrap_or_else(|_| String::from("\"\"")));
}

/// Appends `n` in decimal (without `fmt`'s machinery: this is on every streamed frame).
fn push_u64(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    out.push_str(std::str::from_utf8(&digits[at..]).unwrap_or("0"));
}

/// `{"jsonrpc":"2.0","id":ID,"result":RESULT}` with both parts raw JSON.
pub fn response(id: &str, result: &str) -> String {
    let mut out = String::with_capacity(40 + id.len() + result.len());
    out.push_str(r#"{"jsonrpc":"2.0","id":"#);
    out.push_str(id);
    out.push_str(r#","result":"#);
    out.push_str(result);
    out.push('}');
    out
}

/// `{"jsonrpc":"2.0","id":ID,"error":ERROR}` with both parts raw JSON (forwarding an agent's error).
pub fn error_passthrough(id: &str, error: &str) -> String {
    let mut out = String::with_capacity(40 + id.len() + error.len());
    out.push_str(r#"{"jsonrpc":"2.0","id":"#);
    out.push_str(id);
    out.push_str(r#","error":"#);
    out.push_str(error);
    out.push('}');
    out
}

/// An error response; `id` is raw JSON or `None` for `null`.
pub fn error(id: Option<&str>, err: &RpcError) -> String {
    let mut out = String::with_capacity(96);
    out.push_str(r#"{"jsonrpc":"2.0","id":"#);
    out.push_str(id.unwrap_or("null"));
    let _ = write!(out, r#","error":{{"code":{},"message":"#, err.code);
    push_json_str(&mut out, &err.message);
    if let Some(data) = &err.data {
        out.push_str(r#","data":"#);
        out.push_str(data);
    }
    out.push_str("}}");
    out
}

/// A request with a numeric id the gateway issued.
pub fn request(id: u64, method: &str, params: &str) -> String {
    let mut out = String::with_capacity(48 + method.len() + params.len());
    let _ = write!(out, r#"{{"jsonrpc":"2.0","id":{id},"method":"#);
    push_json_str(&mut out, method);
    out.push_str(r#","params":"#);
    out.push_str(params);
    out.push('}');
    out
}

/// A notification.
pub fn notification(method: &str, params: &str) -> String {
    let mut out = String::with_capacity(40 + method.len() + params.len());
    out.push_str(r#"{"jsonrpc":"2.0","method":"#);
    push_json_str(&mut out, method);
    out.push_str(r#","params":"#);
    out.push_str(params);
    out.push('}');
    out
}

/// The `session/update` the gateway sends a client: the gateway's session id (already a JSON
/// string literal, escaped once per session), the agent's `update` object verbatim, and
/// `_meta.gateway.seq`. An agent's own `_meta` is kept beside ours.
pub fn session_update_raw_id(session_id_json: &str, update: &str, seq: u64, agent_meta: Option<&RawValue>) -> String {
    const HEAD: &str = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"#;
    const META: &str = r#","_meta":{"gateway":{"seq":"#;
    // Sized for the frame without an agent's `_meta` (20 digits of seq and the closing braces):
    // the stream's frames are built in one allocation, never grown.
    let mut out = String::with_capacity(HEAD.len() + session_id_json.len() + 10 + update.len() + META.len() + 24);
    out.push_str(HEAD);
    out.push_str(session_id_json);
    out.push_str(r#","update":"#);
    out.push_str(update);
    match agent_meta.and_then(|m| serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(m.get()).ok()) {
        Some(mut meta) => {
            meta.insert("gateway".into(), serde_json::json!({ "seq": seq }));
            out.push_str(r#","_meta":"#);
            out.push_str(&serde_json::Value::Object(meta).to_string());
            out.push_str("}}");
        }
        None => {
            out.push_str(META);
            push_u64(&mut out, seq);
            out.push_str("}}}}");
        }
    }
    out
}

/// Returns `params` (a JSON object) with `sessionId` set to `session_id`; every other member is
/// copied as raw JSON. `None` when `params` is not an object.
pub fn with_session_id(params: &RawValue, session_id: &str) -> Option<String> {
    rewrite_params(params, Some(session_id), None)
}

/// [`with_session_id`] for what a client sends an agent: `sessionId` set when given, and the
/// root `_meta` keeping only the keys in `keep_meta` (`None`: all of it), left out when nothing
/// of it is kept. Members are copied as raw JSON, never re-serialized.
pub fn rewrite_params(params: &RawValue, session_id: Option<&str>, keep_meta: Option<&[String]>) -> Option<String> {
    let mut members: BTreeMap<std::borrow::Cow<'_, str>, &RawValue> = serde_json::from_str(params.get()).ok()?;
    if session_id.is_some() {
        members.remove("sessionId");
    }
    let meta = match keep_meta {
        Some(keep) => members.remove("_meta").and_then(|m| filtered_meta(m, keep)),
        None => None,
    };
    let mut out = String::with_capacity(params.get().len() + 16);
    if let Some(session_id) = session_id {
        out.push_str(r#"{"sessionId":"#);
        push_json_str(&mut out, session_id);
    }
    for (key, value) in members {
        out.push(if out.is_empty() { '{' } else { ',' });
        push_json_str(&mut out, &key);
        out.push(':');
        out.push_str(value.get());
    }
    if let Some(meta) = meta {
        out.push(if out.is_empty() { '{' } else { ',' });
        out.push_str(r#""_meta":"#);
        out.push_str(&meta);
    }
    if out.is_empty() {
        out.push('{');
    }
    out.push('}');
    Some(out)
}

/// A `_meta` object with only the keys in `keep`, or `None` when none of them is there (or it
/// is not an object).
pub fn filtered_meta(meta: &RawValue, keep: &[String]) -> Option<String> {
    let members: BTreeMap<std::borrow::Cow<'_, str>, &RawValue> = serde_json::from_str(meta.get()).ok()?;
    let mut out = String::new();
    for (key, value) in members.iter().filter(|(k, _)| keep.iter().any(|w| w == k.as_ref())) {
        out.push(if out.is_empty() { '{' } else { ',' });
        push_json_str(&mut out, key);
        out.push(':');
        out.push_str(value.get());
    }
    if out.is_empty() {
        return None;
    }
    out.push('}');
    Some(out)
}

/// `params` (a JSON object) with string members of its root `_meta` set (`Some`) or removed
/// (`None`), `_meta` created if need be; every other member is copied as raw JSON. `None` when
/// `params` or its `_meta` is not an object. (The trace context the gateway hands agents.)
pub fn with_meta_strings(params: &str, entries: &[(&str, Option<&str>)]) -> Option<String> {
    let mut members: BTreeMap<std::borrow::Cow<'_, str>, &RawValue> = serde_json::from_str(params).ok()?;
    let mut meta: serde_json::Map<String, serde_json::Value> = match members.get("_meta") {
        Some(meta) => serde_json::from_str(meta.get()).ok()?,
        None => serde_json::Map::new(),
    };
    for (key, value) in entries {
        match value {
            Some(value) => meta.insert((*key).to_string(), serde_json::Value::from(*value)),
            None => meta.remove(*key),
        };
    }
    let meta = serde_json::value::to_raw_value(&meta).ok()?;
    members.insert("_meta".into(), &meta);
    serde_json::to_string(&members).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_strings_are_set_or_removed_and_the_rest_is_kept() {
        let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let out = with_meta_strings(
            r#"{"sessionId":"s","prompt":[{"type":"text","text":"x"}],"_meta":{"traceparent":"old","tracestate":"a=b","k":1}}"#,
            &[("traceparent", Some(tp)), ("tracestate", None)],
        )
        .expect("object");
        assert_eq!(
            parse(&out),
            json!({"sessionId":"s","prompt":[{"type":"text","text":"x"}],"_meta":{"traceparent":tp,"k":1}})
        );
        let out = with_meta_strings("{}", &[("traceparent", Some(tp))]).expect("object");
        assert_eq!(parse(&out), json!({"_meta":{"traceparent":tp}}));
        assert!(with_meta_strings("[1]", &[("traceparent", Some(tp))]).is_none());
        assert!(with_meta_strings(r#"{"_meta":3}"#, &[("traceparent", Some(tp))]).is_none());
    }

    fn session_update(session_id: &str, update: &str, seq: u64, agent_meta: Option<&RawValue>) -> String {
        let mut id = String::new();
        push_json_str(&mut id, session_id);
        session_update_raw_id(&id, update, seq, agent_meta)
    }
    use serde_json::{Value, json};

    fn parse(s: &str) -> Value {
        serde_json::from_str(s).expect("valid JSON")
    }

    #[test]
    fn update_frame_keeps_payload_bytes_and_adds_seq() {
        let update = r#"{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi \"there\""}}"#;
        let frame = session_update("gw-1", update, 7, None);
        assert!(frame.contains(update), "payload must be spliced verbatim: {frame}");
        let v = parse(&frame);
        assert_eq!(v["params"]["_meta"]["gateway"]["seq"], 7);
        assert_eq!(v["params"]["sessionId"], "gw-1");
        let meta: Box<RawValue> = serde_json::from_str(r#"{"agent":{"x":1}}"#).expect("raw");
        let v = parse(&session_update("gw-1", update, 8, Some(&meta)));
        assert_eq!(v["params"]["_meta"], json!({"agent":{"x":1},"gateway":{"seq":8}}));
    }

    #[test]
    fn rewrites_session_id_only() {
        let params: Box<RawValue> =
            serde_json::from_str(r#"{"sessionId":"a","prompt":[{"type":"text","text":"x"}],"z":null}"#).expect("raw");
        let out = with_session_id(&params, "b\"c").expect("object");
        assert_eq!(
            parse(&out),
            json!({"sessionId":"b\"c","prompt":[{"type":"text","text":"x"}],"z":null})
        );
        let not_object: Box<RawValue> = serde_json::from_str("[1]").expect("raw");
        assert!(with_session_id(&not_object, "b").is_none());
    }

    #[test]
    fn client_meta_keeps_only_allowed_keys() {
        let keep = vec![String::from("traceparent")];
        let p = RawValue::from_string(
            r#"{"sessionId":"c","prompt":[{"type":"text","text":"x","_meta":{"k":1}}],"_meta":{"traceparent":"00-a-b-01","claudeCode":{"options":{"env":{}}}}}"#.into(),
        )
        .expect("raw");
        let out = parse(&rewrite_params(&p, Some("agent-1"), Some(&keep)).expect("object"));
        assert_eq!(out["sessionId"], "agent-1");
        assert_eq!(out["_meta"], json!({"traceparent": "00-a-b-01"}));
        assert_eq!(
            out["prompt"][0]["_meta"],
            json!({"k": 1}),
            "only the root _meta is the client's options"
        );
        let p = RawValue::from_string(r#"{"sessionId":"c","_meta":{"claudeCode":{}}}"#.into()).expect("raw");
        let out = parse(&rewrite_params(&p, Some("a"), Some(&keep)).expect("object"));
        assert!(out.get("_meta").is_none(), "{out}");
        let p = RawValue::from_string(r#"{"sessionId":"c","_meta":"not an object"}"#.into()).expect("raw");
        assert!(
            parse(&rewrite_params(&p, Some("a"), Some(&keep)).expect("object"))
                .get("_meta")
                .is_none()
        );
        let p = RawValue::from_string(r#"{"methodId":"m","_meta":{"x":1}}"#.into()).expect("raw");
        assert_eq!(
            parse(&rewrite_params(&p, None, Some(&keep)).expect("object")),
            json!({"methodId": "m"})
        );
        let p = RawValue::from_string(r#"{"_meta":{"x":1}}"#.into()).expect("raw");
        assert_eq!(rewrite_params(&p, None, Some(&keep)).as_deref(), Some("{}"));
    }

    #[test]
    fn error_frames_escape_messages() {
        let e = RpcError::new(-32602, "bad \"cursor\"").with_data(json!({"k":1}));
        let v = parse(&error(Some("3"), &e));
        assert_eq!(
            v,
            json!({"jsonrpc":"2.0","id":3,"error":{"code":-32602,"message":"bad \"cursor\"","data":{"k":1}}})
        );
        assert_eq!(parse(&error(None, &e))["id"], Value::Null);
    }
}

/// Properties of the frame builders: whatever they are handed (a client's message, an agent's
/// update or `_meta`), what they build is JSON that says exactly that.
#[cfg(test)]
mod props {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Map, Value, json};

    fn config() -> ProptestConfig {
        ProptestConfig {
            cases: 512,
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    fn json_value() -> impl Strategy<Value = Value> {
        super::super::props::json_value_keyed(".{0,6}|sessionId|_meta|gateway|traceparent")
    }

    fn object() -> impl Strategy<Value = Map<String, Value>> {
        prop::collection::btree_map("[a-z]{0,4}|sessionId|_meta|gateway|traceparent", json_value(), 0..5)
            .prop_map(|m| m.into_iter().collect())
    }

    fn parse(s: &str) -> Result<Value, TestCaseError> {
        serde_json::from_str(s).map_err(|e| TestCaseError::fail(format!("{e}: {s}")))
    }

    fn raw(v: &Value) -> Box<RawValue> {
        RawValue::from_string(v.to_string())
            .unwrap_or_else(|_| RawValue::from_string("null".into()).unwrap_or_default())
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn strings_and_errors_are_escaped(s in any::<String>(), code in any::<i64>(), data in prop::option::of(json_value())) {
            let mut out = String::new();
            push_json_str(&mut out, &s);
            prop_assert_eq!(parse(&out)?, json!(s));
            let mut err = RpcError::new(code, s.clone());
            if let Some(d) = &data {
                err = err.with_data(d.clone());
            }
            let frame = parse(&error(Some(r#""i""#), &err))?;
            prop_assert_eq!(&frame["error"]["message"], &json!(s));
            prop_assert_eq!(&frame["error"]["code"], &json!(code));
            prop_assert_eq!(frame["error"].get("data"), data.as_ref());
            prop_assert_eq!(parse(&notification(&s, "{}"))?["method"].clone(), json!(s));
            prop_assert_eq!(parse(&request(7, &s, "[]"))?["method"].clone(), json!(s));
        }

        /// An agent's update is spliced verbatim, its `_meta` kept beside the gateway's seq
        /// (which wins over an agent's own `gateway` key).
        #[test]
        fn session_updates_carry_the_agents_payload_and_the_seq(
            sid in any::<String>(),
            update in json_value(),
            meta in prop::option::of(json_value()),
            seq in any::<u64>(),
        ) {
            let mut id = String::new();
            push_json_str(&mut id, &sid);
            let update_raw = raw(&update);
            let meta_raw = meta.as_ref().map(raw);
            let frame = session_update_raw_id(&id, update_raw.get(), seq, meta_raw.as_deref());
            prop_assert!(frame.contains(update_raw.get()), "verbatim");
            let v = parse(&frame)?;
            prop_assert_eq!(&v["params"]["sessionId"], &json!(sid));
            prop_assert_eq!(&v["params"]["update"], &update);
            prop_assert_eq!(&v["params"]["_meta"]["gateway"], &json!({"seq": seq}));
            if let Some(Value::Object(m)) = &meta {
                for (k, val) in m.iter().filter(|(k, _)| *k != "gateway") {
                    prop_assert_eq!(v["params"]["_meta"].get(k), Some(val));
                }
            }
        }

        /// Rewriting a client's params sets the session id, keeps every other member as it was,
        /// and keeps of `_meta` only the allowed keys.
        #[test]
        fn rewritten_params_keep_every_member_but_the_session_and_meta(
            params in object(),
            sid in prop::option::of(any::<String>()),
            keep in prop::option::of(prop::collection::vec("[a-z]{0,4}|traceparent", 0..3)),
        ) {
            let input = raw(&Value::Object(params.clone()));
            let out = parse(&rewrite_params(&input, sid.as_deref(), keep.as_deref()).ok_or_else(|| TestCaseError::fail("an object"))?)?;
            let out = out.as_object().cloned().unwrap_or_default();
            match &sid {
                Some(sid) => prop_assert_eq!(out.get("sessionId"), Some(&json!(sid))),
                None => prop_assert_eq!(out.get("sessionId"), params.get("sessionId")),
            }
            for (k, v) in params.iter().filter(|(k, _)| *k != "sessionId" && *k != "_meta") {
                prop_assert_eq!(out.get(k), Some(v));
            }
            let expected_meta = match (&keep, params.get("_meta")) {
                (None, m) => m.cloned(),
                (Some(keep), Some(Value::Object(m))) => {
                    let kept: Map<String, Value> = m.iter().filter(|(k, _)| keep.contains(k)).map(|(k, v)| (k.clone(), v.clone())).collect();
                    (!kept.is_empty()).then_some(Value::Object(kept))
                }
                (Some(_), _) => None,
            };
            prop_assert_eq!(out.get("_meta"), expected_meta.as_ref());
        }
    }
}
