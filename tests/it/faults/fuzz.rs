//! Random frames through the real router.

use super::*;

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f).map(Value::Number)),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{0,3}|id|method|params|result|error", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// The method member of a generated frame.
#[derive(Debug, Clone)]
enum Method {
    Absent,
    /// A name the gateway does not serve.
    Unknown(String),
    Prompt,
    Close,
    /// Not a string.
    Invalid(Value),
}

/// A generated frame and what the gateway must answer.
#[derive(Debug, Clone)]
struct Generated {
    text: String,
    /// `None`: nothing. `Some((raw id, code))`: one error with that code under that raw id.
    answer: Option<(String, i64)>,
}

/// A JSON-RPC-shaped object, built member by member; the id is made unique by `k` (valid types
/// only: the invalid ones have their own test).
fn rpc_frame(k: usize) -> impl Strategy<Value = Generated> {
    let id = prop_oneof![
        Just(None),
        ".{0,8}".prop_map(move |s| Some(serde_json::to_string(&format!("f{k}-{s}")).expect("string"))),
        Just(Some(format!("{}", 1_000_000 + k))),
        Just(Some(format!("-{}", k + 1))),
        Just(Some(format!("{k}.25"))),
        Just(Some(format!("{k}e0"))),
        Just(Some(format!("9{k:020}000000"))),
    ];
    let known =
        |s: &String| !s.starts_with('_') && !s.starts_with("session/") && s != "initialize" && s != "authenticate";
    let method = prop_oneof![
        Just(Method::Absent),
        ".{0,16}".prop_filter("not served", known).prop_map(Method::Unknown),
        Just(Method::Prompt),
        Just(Method::Close),
        json_value()
            .prop_filter("not a string or null", |v| !v.is_string() && !v.is_null())
            .prop_map(Method::Invalid),
    ];
    let session_params = (
        prop_oneof![".{0,8}".prop_map(Value::String), json_value()],
        prop::option::of(json_value()),
    )
        .prop_map(|(sid, prompt)| {
            let mut p = json!({ "sessionId": sid });
            if let Some(prompt) = prompt {
                p["prompt"] = prompt;
            }
            p
        });
    let params = prop::option::of(prop_oneof![json_value(), session_params]);
    let result = prop::option::of(json_value());
    let error = prop::option::of(json_value());
    (id, method, params, result, error).prop_map(|(id, method, params, result, error)| {
        let mut members: Vec<(String, String)> = vec![("jsonrpc".into(), "\"2.0\"".into())];
        if let Some(id) = &id {
            members.push(("id".into(), id.clone()));
        }
        match &method {
            Method::Absent => {}
            Method::Unknown(m) => members.push(("method".into(), json!(m).to_string())),
            Method::Prompt => members.push(("method".into(), "\"session/prompt\"".into())),
            Method::Close => members.push(("method".into(), "\"session/close\"".into())),
            Method::Invalid(v) => members.push(("method".into(), v.to_string())),
        }
        for (name, v) in [("params", &params), ("result", &result), ("error", &error)] {
            if let Some(v) = v {
                members.push((name.into(), v.to_string()));
            }
        }
        let text = format!(
            "{{{}}}",
            members
                .iter()
                .map(|(k, v)| format!("{}:{v}", json!(k)))
                .collect::<Vec<_>>()
                .join(",")
        );
        let null = || "null".to_string();
        let session_named = |need_prompt: bool| {
            params.as_ref().is_some_and(|p| {
                p["sessionId"].is_string() && (!need_prompt || p.get("prompt").is_some_and(|v| !v.is_null()))
            })
        };
        let answer = match (&method, &id) {
            (Method::Invalid(_), id) => Some((id.clone().unwrap_or_else(null), -32600)),
            (Method::Absent, Some(_)) if result.is_some() || error.is_some() => None,
            (Method::Absent, id) => Some((id.clone().unwrap_or_else(null), -32600)),
            (_, None) => None,
            (Method::Unknown(_), Some(id)) => Some((id.clone(), -32601)),
            (Method::Prompt, Some(id)) => Some((id.clone(), if session_named(true) { -32002 } else { -32602 })),
            (Method::Close, Some(id)) => Some((id.clone(), if session_named(false) { -32002 } else { -32602 })),
        };
        Generated { text, answer }
    })
}

/// Any text: JSON-RPC's answer for it follows from what `serde_json` makes of it.
fn any_frame(k: usize) -> impl Strategy<Value = Generated> {
    let text = prop_oneof![
        ".{0,40}",
        "[\\[\\]{}\":,0-9a-z \\\\]{0,40}",
        json_value().prop_map(|v| v.to_string()),
    ];
    prop_oneof![
        3 => rpc_frame(k),
        2 => text.prop_filter_map("an object is an rpc_frame's job", |text| {
            let answer = match serde_json::from_str::<Value>(&text) {
                Err(_) => ("null".to_string(), -32700),
                Ok(Value::Object(m)) if !m.is_empty() => return None,
                Ok(_) => ("null".to_string(), -32600),
            };
            Some(Generated { text, answer: Some(answer) })
        }),
    ]
}

/// Random frames, a fixed seed: each gets exactly the answer JSON-RPC calls for (or none), under
/// its own raw id, and the connection lives through all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_frames_get_exactly_the_answer_json_rpc_calls_for() {
    watch_panics();
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut c = gw.client("alice").await;
    let mut runner = TestRunner::deterministic();
    let mut wrong = Vec::new();
    let frames = 300;
    for k in 0..frames {
        let g = any_frame(k).new_tree(&mut runner).expect("a frame").current();
        c.send_text(&g.text).await;
        let sentinel = format!("\"sentinel-{k}\"");
        c.send_text(&format!(r#"{{"jsonrpc":"2.0","id":{sentinel},"method":"x/sentinel"}}"#))
            .await;
        let mut got_sentinel = false;
        let mut got_answer = g.answer.is_none();
        while !(got_sentinel && got_answer) {
            let t = next_text(&mut c).await;
            let id = raw_id(&t).unwrap_or_default();
            if id == sentinel {
                got_sentinel = true;
            } else if let Some((want_id, code)) = g.answer.as_ref().filter(|(want, _)| *want == id && !got_answer) {
                got_answer = true;
                if code_of(&t) != Some(*code) {
                    wrong.push(format!("{:?}: expected {code} with id {want_id}, got {t}", g.text));
                }
            } else {
                wrong.push(format!("{:?}: unexpected {t}", g.text));
                if got_sentinel {
                    got_answer = true;
                }
            }
            if got_sentinel && !got_answer && g.answer.as_ref().is_some_and(|(id, _)| id == "null") {
                // A frame with no readable id is answered in the read loop, before the sentinel.
                wrong.push(format!("{:?}: not answered", g.text));
                break;
            }
        }
    }
    let s = c.new_session().await;
    assert_eq!(c.prompt(&s, "after the fuzz").await["result"]["stopReason"], "end_turn");
    finish(gw).await;
    assert!(
        wrong.is_empty(),
        "{} of {frames} frames answered wrongly:\n{}",
        wrong.len(),
        wrong.iter().take(15).cloned().collect::<Vec<_>>().join("\n")
    );
}
