//! Issue 9, item 7: faults and fuzz. Hostile frames from a client, misbehaving agent processes
//! (`tests/agents/misbehaving_agent.py`), and random frames through the real router. Every case
//! runs a real gateway, real agent processes and a real WebSocket client, and checks four things:
//! exactly what the client gets; that the connection lives where it should (a valid request
//! afterwards is answered); that the gateway lives (`/healthz`, another user's prompt, a clean
//! stop); and that nothing acknowledged is lost (the replayed transcript holds every update the
//! client saw, numbered without a gap). A panic hook fails a test when any code outside `tests/`
//! panicked (a gateway task's panic would otherwise only be printed).

mod common;

use std::collections::HashMap;
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

use acp_gateway::config::Config;
use common::{Client, Db, TestGateway, WAIT, agent, eventually, seq};
use futures_util::{SinkExt, StreamExt};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};

const BAD_AGENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/misbehaving_agent.py");

/// The line cap the misbehaving-agent gateways run with.
const MAX_LINE: usize = 64 * 1024;

// ---------------------------------------------------------------------------------------------
// Panics, survival, transcripts
// ---------------------------------------------------------------------------------------------

/// Panics whose location is outside `tests/` (the gateway's own code or a dependency's).
static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Records every panic outside the tests themselves (then prints it as usual).
fn watch_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let at = info.location().map(|l| l.file().to_string()).unwrap_or_default();
            if !(at.starts_with("tests/") || at.contains("/tests/")) {
                PANICS.lock().unwrap_or_else(|e| e.into_inner()).push(format!("{info}"));
            }
            default(info);
        }));
    });
}

fn assert_no_panics() {
    let panics = PANICS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert!(panics.is_empty(), "code outside the tests panicked: {panics:#?}");
}

/// The gateway is alive and well: `/healthz` answers, a user nobody has touched runs a prompt on
/// the default agent and gets its whole transcript back, and nothing panicked.
async fn assert_gateway_lives(gw: &TestGateway) {
    let r = reqwest::get(gw.http_url("/healthz")).await.expect("/healthz answers");
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.expect("JSON"), json!({"status": "ok"}));
    let mut w = gw.client("witness").await;
    let s = w.new_session().await;
    let r = w.prompt(&s, "still there?").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let live = w.take_updates(&s);
    assert_replay_holds(gw, "witness", &s, &live).await;
    w.close().await;
    assert_no_panics();
}

/// Stops the gateway (it must stop cleanly and in time) and checks, last, for panics.
async fn finish(gw: TestGateway) {
    assert_gateway_lives(&gw).await;
    gw.stop().await;
    assert_no_panics();
}

/// Replays `session` on a fresh connection: the stored transcript is numbered 1, 2, 3… without a
/// gap, and every update in `live` (what a client received) is in it, same seq, same content.
/// Returns the replay.
async fn assert_replay_holds(gw: &TestGateway, user: &str, session: &str, live: &[Value]) -> Vec<Value> {
    let mut c = gw.client(user).await;
    let r = c
        .request("session/load", json!({"sessionId": session, "mcpServers": []}))
        .await;
    assert!(r.get("result").is_some(), "session/load failed: {r}");
    let replay = c.take_updates(session);
    let seqs: Vec<u64> = replay.iter().map(seq).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "the transcript is numbered without a gap"
    );
    for u in live {
        let n = seq(u);
        let stored = replay
            .get(n as usize - 1)
            .unwrap_or_else(|| panic!("update {n} the client saw is not stored: {u}"));
        assert_eq!(
            stored["params"]["update"], u["params"]["update"],
            "update {n} replays as it was sent"
        );
    }
    c.close().await;
    replay
}

fn chunk_texts(updates: &[Value]) -> Vec<String> {
    updates
        .iter()
        .filter(|u| u["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .map(|u| {
            u["params"]["update"]["content"]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Raw frames
// ---------------------------------------------------------------------------------------------

/// The next text frame, raw (pings skipped); panics when the socket closes instead.
async fn next_text(c: &mut Client) -> String {
    loop {
        match c.recv_frame().await {
            Some(Message::Text(t)) => return t.to_string(),
            Some(Message::Close(f)) => panic!("the connection was closed: {f:?}"),
            None => panic!("the connection ended"),
            Some(_) => {}
        }
    }
}

/// The next text frame if one comes within `wait` (for an answer that may never come).
async fn next_text_within(c: &mut Client, wait: Duration) -> Option<String> {
    tokio::time::timeout(wait, next_text(c)).await.ok()
}

/// The close code the gateway ends the connection with (`None`: it ended without a close frame).
async fn close_code(c: &mut Client) -> Option<u16> {
    loop {
        match c.recv_frame().await {
            Some(Message::Close(frame)) => return frame.map(|f| u16::from(f.code)),
            Some(_) => {}
            None => return None,
        }
    }
}

/// A message's `id`, raw (byte for byte as the gateway wrote it).
fn raw_id(text: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct IdOf<'a> {
        #[serde(borrow)]
        id: Option<&'a RawValue>,
    }
    serde_json::from_str::<IdOf<'_>>(text)
        .ok()
        .map(|m| m.id.map_or_else(|| "null".to_string(), |id| id.get().to_string()))
}

fn code_of(text: &str) -> Option<i64> {
    // Not through `Value`: an id like `1e400` is JSON that `Value` cannot hold.
    #[derive(Deserialize)]
    struct E {
        code: i64,
    }
    #[derive(Deserialize)]
    struct M {
        error: Option<E>,
    }
    serde_json::from_str::<M>(text).ok()?.error.map(|e| e.code)
}

/// Sends `frame`, then a sentinel request the gateway answers at once in its read loop: the next
/// frame must be the sentinel's answer, or `frame` was answered. Returns what came instead.
async fn unanswered(c: &mut Client, frame: Message, n: usize) -> Result<(), String> {
    c.send_message(frame).await;
    let sentinel = format!("sentinel-{n}");
    c.send(json!({"jsonrpc": "2.0", "id": sentinel, "method": "x/sentinel"}))
        .await;
    let next = next_text(c).await;
    if raw_id(&next).as_deref() == Some(&format!("\"{sentinel}\"")) {
        assert_eq!(code_of(&next), Some(-32601), "{next}");
        Ok(())
    } else {
        // Drain up to the sentinel so the next check starts clean.
        loop {
            let t = next_text(c).await;
            if raw_id(&t).as_deref() == Some(&format!("\"{sentinel}\"")) {
                break;
            }
        }
        Err(next)
    }
}

// ---------------------------------------------------------------------------------------------
// Hostile frames from a client
// ---------------------------------------------------------------------------------------------

/// JSON-RPC 2.0: an id is a string, a number or null; anything else makes the request invalid
/// (`-32600`, id null). Valid ids come back byte for byte, whatever the method.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_of_every_json_type_are_echoed_raw_or_refused_with_a_null_id() {
    watch_panics();
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut c = gw.client("alice").await;
    let long = format!("\"{}\"", "x".repeat(10 * 1024));
    let valid = [
        r#""abc""#,
        r#""""#,
        r#""a\"b\\c\u00e9\ud83d\ude00 \/""#,
        "\"é😀\"",
        "7",
        "0",
        "-7",
        "1.5",
        "-0.0",
        "1e3",
        "2.5E-7",
        "123456789012345678901234567890",
        "-123456789012345678901234567890",
        "1e400",
        &long,
        "null",
    ];
    let invalid = ["true", "false", "{}", r#"{"a":1}"#, "[]", "[1]"];
    let mut wrong = Vec::new();
    for (i, id) in valid.iter().chain(&invalid).enumerate() {
        let is_valid = i < valid.len();
        // One method the read loop answers itself (-32601), one a spawned handler answers.
        for method in ["x/unknown", "session/list"] {
            let frame = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{}}}}"#);
            c.send_text(&frame).await;
            // Answered or not, the sentinel tells.
            let sentinel = format!("sentinel-{i}-{method}");
            c.send(json!({"jsonrpc": "2.0", "id": sentinel, "method": "x/sentinel"}))
                .await;
            let mut answers = Vec::new();
            loop {
                let t = next_text(&mut c).await;
                if raw_id(&t).as_deref() == Some(&format!("\"{sentinel}\"")) {
                    if method == "x/unknown" || !answers.is_empty() || !is_valid {
                        break;
                    }
                    // A spawned answer may come after the sentinel's (if it comes at all).
                    answers.extend(next_text_within(&mut c, Duration::from_secs(2)).await);
                    break;
                }
                answers.push(t);
            }
            let short = &id[..id.len().min(40)];
            let expected_code = match (is_valid, method) {
                (false, _) => Some(-32600),
                (true, "x/unknown") => Some(-32601),
                (true, _) => None,
            };
            let expected_id = if is_valid { id.to_string() } else { "null".into() };
            match answers.as_slice() {
                [one] if raw_id(one).as_deref() == Some(&expected_id) && code_of(one) == expected_code => {}
                other => wrong.push(format!(
                    "id {short} with {method}: expected one answer with id {} and {}, got {:?}",
                    &expected_id[..expected_id.len().min(40)],
                    expected_code.map_or("a result".into(), |c| format!("error {c}")),
                    other.iter().map(|t| &t[..t.len().min(160)]).collect::<Vec<_>>()
                )),
            }
        }
    }
    // The connection lives through all of it.
    let s = c.new_session().await;
    assert_eq!(c.prompt(&s, "after the ids").await["result"]["stopReason"], "end_turn");
    let live = c.take_updates(&s);
    assert_replay_holds(&gw, "alice", &s, &live).await;
    finish(gw).await;
    assert!(wrong.is_empty(), "ids answered wrongly:\n{}", wrong.join("\n"));
}

/// Two prompts in flight under one id: each gets its own answer under that id, and neither
/// loses an update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_in_flight_ids_each_get_their_answer() {
    watch_panics();
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut c = gw.client("alice").await;
    let s1 = c.new_session().await;
    let s2 = c.new_session().await;
    let n = 100;
    for s in [&s1, &s2] {
        c.send(
            json!({"jsonrpc": "2.0", "id": "dup", "method": "session/prompt", "params": {
            "sessionId": s, "prompt": [{"type": "text", "text": format!("{s} [chunks={n}] [delay_us=1000]")}]}}),
        )
        .await;
    }
    let mut answers = Vec::new();
    while answers.len() < 2 {
        let m = c.recv_raw().await.expect("open");
        if m.get("method").is_none() {
            answers.push(m);
        } else {
            c.inbox.push_back(m);
        }
    }
    for a in &answers {
        assert_eq!(a["id"], "dup", "{a}");
        assert_eq!(a["result"]["stopReason"], "end_turn", "{a}");
    }
    for s in [&s1, &s2] {
        let updates = c.take_updates(s);
        let chunks = chunk_texts(&updates);
        assert_eq!(chunks.len(), n, "every chunk of {s}'s prompt");
        assert!(
            chunks.iter().all(|t| t.contains(s.as_str())),
            "only its own prompt's chunks"
        );
        assert_replay_holds(&gw, "alice", s, &updates).await;
    }
    // Two requests the gateway answers itself, one id.
    c.send_text(r#"{"jsonrpc":"2.0","id":5,"method":"session/list","params":{}}"#)
        .await;
    c.send_text(r#"{"jsonrpc":"2.0","id":5,"method":"session/list","params":{}}"#)
        .await;
    for _ in 0..2 {
        let a = c.next().await;
        assert_eq!(a["id"], 5, "{a}");
        assert_eq!(a["result"]["sessions"].as_array().map(Vec::len), Some(2), "{a}");
    }
    finish(gw).await;
}

/// What is not a request gets no answer: responses to requests the gateway never sent (or
/// already settled), notifications, binary frames (even one holding a valid request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_to_nothing_notifications_and_binary_frames_are_never_answered() {
    watch_panics();
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut c = gw.client("alice").await;
    let s = c.new_session().await;
    let frames = [
        r#"{"jsonrpc":"2.0","id":424242,"result":{}}"#.to_string(),
        r#"{"jsonrpc":"2.0","id":0,"result":null}"#.into(),
        r#"{"jsonrpc":"2.0","id":"never-sent","result":{"outcome":{"outcome":"cancelled"}}}"#.into(),
        r#"{"jsonrpc":"2.0","id":424243,"error":{"code":-32000,"message":"no"}}"#.into(),
        r#"{"jsonrpc":"2.0","id":-1,"error":"not even an object"}"#.into(),
        r#"{"jsonrpc":"2.0","id":1.5,"result":1}"#.into(),
        // A response with a null id is how a peer reports a request it could not read.
        r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse error"}}"#.into(),
        r#"{"jsonrpc":"2.0","method":"x/notify","params":{}}"#.into(),
        r#"{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"nope"}}"#.into(),
        format!(r#"{{"jsonrpc":"2.0","method":"session/cancel","params":{{"sessionId":"{s}"}}}}"#),
        r#"{"jsonrpc":"2.0","method":"session/cancel","params":[1]}"#.into(),
        r#"{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":{"x":[]}}}"#.into(),
        r#"{"jsonrpc":"2.0","method":"$/cancel_request"}"#.into(),
    ];
    let mut wrong = Vec::new();
    for (n, f) in frames.iter().enumerate() {
        if let Err(got) = unanswered(&mut c, Message::text(f.as_str()), n).await {
            wrong.push(format!("{f} was answered: {got}"));
        }
    }
    let binaries = [
        br#"{"jsonrpc":"2.0","id":1,"method":"session/list","params":{}}"#.to_vec(),
        vec![0xff, 0xfe, 0x00],
        Vec::new(),
    ];
    for (n, b) in binaries.into_iter().enumerate() {
        if let Err(got) = unanswered(&mut c, Message::binary(b), 100 + n).await {
            wrong.push(format!("binary frame {n} was answered: {got}"));
        }
    }
    // A real agent request answered twice: the agent gets the first answer only.
    let id = c
        .start(
            "session/prompt",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": "write [permission]"}]}),
        )
        .await;
    let req = c.wait_for(|m| m["method"] == "session/request_permission").await;
    for option in ["allow", "reject"] {
        c.send(json!({"jsonrpc": "2.0", "id": req["id"], "result": {"outcome": {"outcome": "selected", "optionId": option}}}))
            .await;
    }
    let r = c.answer(id).await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let updates = c.take_updates(&s);
    let chunks = chunk_texts(&updates);
    assert!(
        !chunks.is_empty() && chunks.iter().all(|t| t.contains("allowed")),
        "the first answer counted: {chunks:?}"
    );
    assert!(c.inbox.is_empty(), "nothing else arrived: {:?}", c.inbox);
    assert_replay_holds(&gw, "alice", &s, &updates).await;
    finish(gw).await;
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Batches (JSON arrays) are refused whole with `-32600`, id null; nothing inside them runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_are_refused_whole() {
    watch_panics();
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut c = gw.client("alice").await;
    let batches = [
        "[]",
        " [ ] ",
        r#"[{"jsonrpc":"2.0","id":"in-batch","method":"session/new","params":{"cwd":"/","mcpServers":[]}}]"#,
        r#"[{"jsonrpc":"2.0","id":1,"method":"x/a"},{"jsonrpc":"2.0","method":"x/b"}]"#,
        "[1,2,3]",
        "[[]]",
    ];
    for b in batches {
        c.send_text(b).await;
        let t = next_text(&mut c).await;
        assert_eq!(
            (raw_id(&t).as_deref(), code_of(&t)),
            (Some("null"), Some(-32600)),
            "{b}: {t}"
        );
    }
    c.send_text("[").await;
    let t = next_text(&mut c).await;
    assert_eq!(
        (raw_id(&t).as_deref(), code_of(&t)),
        (Some("null"), Some(-32700)),
        "{t}"
    );
    // Nothing in them ran: no session was made, and no late answer came.
    let r = c.request("session/list", json!({})).await;
    assert_eq!(r["result"]["sessions"], json!([]), "{r}");
    assert!(c.inbox.is_empty(), "{:?}", c.inbox);
    finish(gw).await;
}

/// Frames that are not JSON, not an object, or not a JSON-RPC message get the precise error
/// (id null when none can be read), and the connection lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_messages_get_precise_errors_and_the_connection_lives() {
    watch_panics();
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut c = gw.client("alice").await;
    let cases: &[(&str, i64, &str)] = &[
        ("{not json", -32700, "null"),
        ("", -32700, "null"),
        ("   ", -32700, "null"),
        ("nul", -32700, "null"),
        (r#"{"jsonrpc":"2.0","id":1,"method":"x"}}"#, -32700, "null"),
        (r#"{"jsonrpc":"2.0","id":1,"method":"x""#, -32700, "null"),
        ("\u{feff}{}", -32700, "null"),
        ("42", -32600, "null"),
        (r#""a string""#, -32600, "null"),
        ("null", -32600, "null"),
        ("true", -32600, "null"),
        ("{}", -32600, "null"),
        (r#"{"jsonrpc":"2.0","id":5}"#, -32600, "5"),
        (r#"{"jsonrpc":"2.0","id":"m","params":{}}"#, -32600, r#""m""#),
        (r#"{"jsonrpc":"2.0","id":6,"method":3}"#, -32600, "6"),
        (r#"{"jsonrpc":"2.0","id":6,"method":null}"#, -32600, "6"),
        (r#"{"jsonrpc":"2.0","id":6,"method":{"a":1}}"#, -32600, "6"),
        (r#"{"jsonrpc":"2.0","id":6,"method":["session/list"]}"#, -32600, "6"),
        (r#"{"jsonrpc":"2.0","id":7,"method":"nope/nope"}"#, -32601, "7"),
        (r#"{"jsonrpc":"2.0","id":7,"method":""}"#, -32601, "7"),
        (
            r#"{"jsonrpc":"2.0","id":8,"method":"session/new","params":[1]}"#,
            -32602,
            "8",
        ),
        (
            r#"{"jsonrpc":"2.0","id":8,"method":"session/new","params":"x"}"#,
            -32602,
            "8",
        ),
        (r#"{"jsonrpc":"2.0","id":8,"method":"session/new"}"#, -32602, "8"),
        (
            r#"{"jsonrpc":"2.0","id":9,"method":"session/prompt","params":[]}"#,
            -32602,
            "9",
        ),
        (
            r#"{"jsonrpc":"2.0","id":9,"method":"session/prompt","params":{"sessionId":1,"prompt":[]}}"#,
            -32602,
            "9",
        ),
        (
            r#"{"jsonrpc":"2.0","id":9,"method":"session/prompt","params":{"sessionId":"s","prompt":null}}"#,
            -32602,
            "9",
        ),
        (
            r#"{"jsonrpc":"2.0","id":10,"method":"session/load","params":7}"#,
            -32602,
            "10",
        ),
        (
            r#"{"jsonrpc":"2.0","id":10,"method":"session/load","params":{"sessionId":"s","_meta":{"gateway":{"afterSeq":-1}}}}"#,
            -32602,
            "10",
        ),
        (
            r#"{"jsonrpc":"2.0","id":11,"method":"session/close","params":null}"#,
            -32602,
            "11",
        ),
        (
            r#"{"jsonrpc":"2.0","id":12,"method":"session/list","params":[1]}"#,
            -32602,
            "12",
        ),
        (
            r#"{"jsonrpc":"2.0","id":12,"method":"session/list","params":{"limit":"ten"}}"#,
            -32602,
            "12",
        ),
        (
            r#"{"jsonrpc":"2.0","id":12,"method":"session/list","params":{"cursor":"forged"}}"#,
            -32602,
            "12",
        ),
        (
            r#"{"jsonrpc":"2.0","id":13,"method":"authenticate","params":[]}"#,
            -32602,
            "13",
        ),
        (
            r#"{"jsonrpc":"2.0","id":14,"method":"session/prompt","params":{"sessionId":"made-up","prompt":[]}}"#,
            -32002,
            "14",
        ),
    ];
    let mut wrong = Vec::new();
    // ACP params are objects: a by-position array is bad params, even one that lines up with
    // the fields the gateway reads.
    let s = c.new_session().await;
    let positional = [
        format!(r#"{{"jsonrpc":"2.0","id":20,"method":"session/close","params":["{s}"]}}"#),
        format!(r#"{{"jsonrpc":"2.0","id":21,"method":"session/load","params":["{s}"]}}"#),
        format!(
            r#"{{"jsonrpc":"2.0","id":22,"method":"session/prompt","params":["{s}",[{{"type":"text","text":"hi"}}]]}}"#
        ),
    ];
    for (frame, id) in positional.iter().zip(["20", "21", "22"]) {
        c.send_text(frame).await;
        // Skip what the request may have set off (a replay) up to its answer.
        let t = loop {
            let t = next_text(&mut c).await;
            if raw_id(&t).as_deref() == Some(id) {
                break t;
            }
        };
        if code_of(&t) != Some(-32602) {
            wrong.push(format!("{frame:?}: expected -32602 with id {id}, got {t}"));
        }
    }
    for &(frame, code, id) in cases {
        c.send_text(frame).await;
        let t = next_text(&mut c).await;
        if (raw_id(&t).as_deref(), code_of(&t)) != (Some(id), Some(code)) {
            wrong.push(format!("{frame:?}: expected {code} with id {id}, got {t}"));
        }
    }
    // And after all that, the connection does real work.
    assert_eq!(c.prompt(&s, "still here").await["result"]["stopReason"], "end_turn");
    let live = c.take_updates(&s);
    assert_replay_holds(&gw, "alice", &s, &live).await;
    finish(gw).await;
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// RFC 6455 §8.1: a text frame that is not UTF-8 fails the connection with `1007`. Other
/// connections, the same user's included, live on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_utf8_in_a_text_frame_closes_with_1007() {
    watch_panics();
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut other = gw.client("alice").await;
    let s = other.new_session().await;
    let mut c = gw.client("alice").await;
    let bad = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\xff\xfe\"}".to_vec();
    c.send_message(Message::Frame(Frame::message(bad, OpCode::Data(Data::Text), true)))
        .await;
    let code = close_code(&mut c).await;
    assert_eq!(other.prompt(&s, "unaffected").await["result"]["stopReason"], "end_turn");
    let live = other.take_updates(&s);
    assert_replay_holds(&gw, "alice", &s, &live).await;
    finish(gw).await;
    assert_eq!(code, Some(1007), "the close code for a text frame that is not UTF-8");
}

/// A frame of exactly `max_frame_bytes` is served; one byte more closes with `1009`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_at_the_size_cap_is_served_and_one_byte_more_closes_with_1009() {
    watch_panics();
    let max = 64 * 1024;
    let gw = TestGateway::start(Db::Sqlite, |c| c.limits.max_frame_bytes = max).await;
    let frame_of = |len: usize, id: &str| {
        let head = format!(r#"{{"jsonrpc":"2.0","id":"{id}","method":"x/pad","params":{{"pad":""#);
        let tail = r#""}}"#;
        format!("{head}{}{tail}", "p".repeat(len - head.len() - tail.len()))
    };
    let mut c = gw.client("alice").await;
    for (len, id) in [(max - 1, "under"), (max, "at")] {
        let f = frame_of(len, id);
        assert_eq!(f.len(), len);
        c.send_text(&f).await;
        let t = next_text(&mut c).await;
        assert_eq!(
            (raw_id(&t), code_of(&t)),
            (Some(format!("\"{id}\"")), Some(-32601)),
            "{len} bytes"
        );
    }
    let s = c.new_session().await;
    let mut over = gw.client("alice").await;
    over.send_text(&frame_of(max + 1, "over")).await;
    assert_eq!(close_code(&mut over).await, Some(1009));
    // The same user's other connection, and a new one, carry on.
    assert_eq!(c.prompt(&s, "unaffected").await["result"]["stopReason"], "end_turn");
    let live = c.take_updates(&s);
    assert_replay_holds(&gw, "alice", &s, &live).await;
    finish(gw).await;
}

/// 10 000 small requests sent without reading a byte: each is answered exactly once, the ones
/// over the user's rate with `-32029` naming the cap; the connection lives, and another user's
/// prompt runs meanwhile as if nothing happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_requests_is_rate_limited_and_other_users_are_unaffected() {
    watch_panics();
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut bob = gw.client("bob").await;
    let sb = bob.new_session().await;

    let mut req = gw.ws_url().into_client_request().expect("request");
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", gw.token("flooder")).parse().expect("header"),
    );
    let (ws, _) = tokio_tungstenite::connect_async(req).await.expect("connects");
    let (mut tx, mut rx) = ws.split();
    tx.send(Message::text(
        json!({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {"protocolVersion": 1, "clientCapabilities": {}}}).to_string(),
    ))
    .await
    .expect("send");
    let n = 10_000;
    let flood = tokio::spawn(async move {
        for i in 0..n {
            let f = format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"x/flood","params":{{}}}}"#);
            tx.feed(Message::text(f)).await.expect("send");
        }
        tx.flush().await.expect("flush");
        tx
    });
    // Bob's prompt runs while the flooder's answers pile up unread (and, once its queue is full,
    // while the gateway stops reading the flooder).
    let started = Instant::now();
    let r = bob.prompt(&sb, "[chunks=20] during the flood").await;
    let took = started.elapsed();
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    assert!(took < Duration::from_secs(5), "bob waited {took:?}");

    // Now the flooder reads: every request answered once, or the connection closed with 1013.
    let mut seen: HashMap<u64, i64> = HashMap::new();
    let mut init = None;
    let mut closed = None;
    while seen.len() < n as usize {
        let m = tokio::time::timeout(WAIT, rx.next())
            .await
            .expect("answers keep coming")
            .expect("the connection lives")
            .expect("frame");
        let t = match m {
            Message::Text(t) => t,
            Message::Close(frame) => {
                closed = Some(frame.map(|f| u16::from(f.code)));
                break;
            }
            _ => continue,
        };
        let v: Value = serde_json::from_str(&t).expect("JSON");
        if v["id"] == "init" {
            init = Some(v);
            continue;
        }
        let id = v["id"].as_u64().unwrap_or_else(|| panic!("unexpected {v}"));
        let code = v["error"]["code"]
            .as_i64()
            .unwrap_or_else(|| panic!("not an error: {v}"));
        if code == -32029 {
            assert_eq!(v["error"]["data"]["cap"], "requests_per_second", "{v}");
        } else {
            assert_eq!(code, -32601, "{v}");
        }
        assert!(seen.insert(id, code).is_none(), "answered twice: {v}");
    }
    assert!(init.is_some_and(|i| i.get("result").is_some()), "initialize answered");
    let limited = seen.values().filter(|c| **c == -32029).count();
    if let Some(code) = closed {
        assert_eq!(code, Some(1013), "a flooder is closed with 1013 if at all");
        let _ = flood.await;
        let mut again = gw.client("flooder").await;
        assert!(again.request("session/list", json!({})).await.get("result").is_some());
        let live = bob.take_updates(&sb);
        assert_replay_holds(&gw, "bob", &sb, &live).await;
        finish(gw).await;
        return;
    }
    assert!(limited > 0, "10 000 requests at once are over the rate");
    assert!(limited < n as usize, "the burst is served");
    let mut tx = tokio::time::timeout(WAIT, flood)
        .await
        .expect("the flood was sent")
        .expect("task");

    // The flooder's connection still serves it, once the rate allows.
    let deadline = Instant::now() + WAIT;
    loop {
        tx.send(Message::text(
            json!({"jsonrpc": "2.0", "id": "after", "method": "session/list", "params": {}}).to_string(),
        ))
        .await
        .expect("send");
        let v = loop {
            let m = tokio::time::timeout(WAIT, rx.next())
                .await
                .expect("answer")
                .expect("open")
                .expect("frame");
            if let Message::Text(t) = m {
                break serde_json::from_str::<Value>(&t).expect("JSON");
            }
        };
        assert_eq!(v["id"], "after", "{v}");
        if v.get("result").is_some() {
            break;
        }
        assert_eq!(v["error"]["code"], -32029, "{v}");
        assert!(Instant::now() < deadline, "still limited");
        // The rate limiter refills with time; there is no event to wait on.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let live = bob.take_updates(&sb);
    assert_eq!(chunk_texts(&live).len(), 20);
    assert_replay_holds(&gw, "bob", &sb, &live).await;
    finish(gw).await;
}

/// Within the rate, a flood of requests the gateway answers from its database meets the
/// connection's in-flight cap: every request is answered exactly once (a result, or an error),
/// and the connection and other users carry on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_within_the_rate_meets_the_in_flight_cap() {
    watch_panics();
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.limits.requests_per_second_per_user = 1_000_000;
        c.limits.request_burst_per_user = 1_000_000;
        c.limits.max_inflight_per_connection = 16;
    })
    .await;
    let mut bob = gw.client("bob").await;
    let sb = bob.new_session().await;
    let mut c = gw.client("flooder").await;
    let n = 2000;
    for i in 0..n {
        c.send_text(&format!(
            r#"{{"jsonrpc":"2.0","id":{i},"method":"session/list","params":{{}}}}"#
        ))
        .await;
    }
    let r = bob.prompt(&sb, "during the flood").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let mut seen: HashMap<u64, Value> = HashMap::new();
    while seen.len() < n {
        let v = c.next().await;
        let id = v["id"].as_u64().unwrap_or_else(|| panic!("unexpected {v}"));
        assert!(v["result"]["sessions"].is_array() || v["error"]["code"].is_i64(), "{v}");
        assert!(seen.insert(id, v).is_none(), "answered twice");
    }
    let refused: Vec<&Value> = seen.values().filter(|v| v.get("error").is_some()).collect();
    assert!(
        !refused.is_empty(),
        "2000 requests at once are over a cap of 16 in flight"
    );
    for v in &refused {
        assert_eq!(v["error"]["code"], -32029, "{v}");
        assert_eq!(v["error"]["data"]["cap"], "requests_in_flight", "{v}");
        assert!(
            v["error"]["message"].as_str().is_some_and(|m| m.contains("in flight")),
            "{v}"
        );
    }
    let r = c.request("session/list", json!({})).await;
    assert!(r.get("result").is_some(), "{r}");
    let live = bob.take_updates(&sb);
    assert_replay_holds(&gw, "bob", &sb, &live).await;
    finish(gw).await;
}

// ---------------------------------------------------------------------------------------------
// Random frames through the real router
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Misbehaving agents
// ---------------------------------------------------------------------------------------------

/// A gateway whose agent `bad` is the misbehaving agent run with `args`; short timeouts (the
/// request timeout, the prompt idle timeout, the permission wait) so faults show in seconds.
async fn with_bad_agent(args: &[&str], tweak: impl FnOnce(&mut Config)) -> TestGateway {
    let mut argv = vec![BAD_AGENT];
    argv.extend_from_slice(args);
    TestGateway::start(Db::Sqlite, |c| {
        let mut bad = agent("/usr/bin/python3", &argv);
        bad.pool.request_timeout_secs = 2;
        bad.pool.prompt_idle_timeout_secs = 2;
        c.agents.insert("bad".into(), bad);
        c.limits.max_line_bytes = MAX_LINE;
        c.limits.permission_wait_secs = 1;
        tweak(c);
    })
    .await
}

/// A connection to the `bad` agent, not initialized yet.
async fn connect_bad(gw: &TestGateway, user: &str) -> Client {
    Client::connect(&format!("{}?agent=bad", gw.ws_url()), &gw.token(user))
        .await
        .expect("connects")
}

/// An initialized connection to the `bad` agent.
async fn bad_client(gw: &TestGateway, user: &str) -> Client {
    let mut c = connect_bad(gw, user).await;
    let init = c.initialize().await;
    assert_eq!(init["result"]["agentInfo"]["name"], "misbehaving-agent", "{init}");
    c
}

fn prompt_params(session: &str, text: &str) -> Value {
    json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]})
}

/// `-32603` whose data names the agent `bad`.
fn assert_agent_error(answer: &Value) {
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    assert_eq!(
        answer["error"]["data"]["agent"], "bad",
        "the error names the agent: {answer}"
    );
}

/// A prompt that ends well on `session`, with `chunks` chunks; returns its updates.
async fn good_prompt(c: &mut Client, session: &str, text: &str, chunks: usize) -> Vec<Value> {
    let r = c.prompt(session, text).await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{text}: {r}");
    let updates = c.take_updates(session);
    assert_eq!(chunk_texts(&updates).len(), chunks, "{text}: {updates:?}");
    updates
}

/// Garbage lines around every message (the `initialize` answer included) are skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_lines_on_agent_stdout_are_skipped() {
    watch_panics();
    let gw = with_bad_agent(&["--garbage-always"], |_| {}).await;
    let mut c = bad_client(&gw, "alice").await;
    let s1 = c.new_session().await;
    let s2 = c.new_session().await;
    let mut live = good_prompt(&mut c, &s1, "one [chunks=5]", 5).await;
    live.extend(good_prompt(&mut c, &s1, "two [chunks=2]", 2).await);
    let live2 = good_prompt(&mut c, &s2, "other", 3).await;
    assert!(
        c.inbox.is_empty(),
        "nothing but the sessions' own traffic: {:?}",
        c.inbox
    );
    assert_eq!(assert_replay_holds(&gw, "alice", &s1, &live).await.len(), live.len());
    assert_replay_holds(&gw, "alice", &s2, &live2).await;
    finish(gw).await;
}

/// Hundreds of random lines (random text, random JSON, JSON-RPC-shaped messages with random
/// members, cut-off lines, requests and updates naming no session) before each reply: every
/// prompt is answered, nothing reaches any client, no update is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_agent_lines_never_break_a_session() {
    watch_panics();
    let gw = with_bad_agent(&[], |_| {}).await;
    let mut c = bad_client(&gw, "alice").await;
    let mut bob = bad_client(&gw, "bob").await;
    let s = c.new_session().await;
    let sb = bob.new_session().await;
    let mut live = Vec::new();
    for seed in 1..=4 {
        live.extend(good_prompt(&mut c, &s, &format!("seed {seed} [fuzz=300:{seed}]"), 3).await);
    }
    assert!(c.inbox.is_empty(), "{:?}", c.inbox);
    let bob_live = good_prompt(&mut bob, &sb, "bob's turn", 3).await;
    assert!(bob.inbox.is_empty(), "{:?}", bob.inbox);
    assert_replay_holds(&gw, "alice", &s, &live).await;
    assert_replay_holds(&gw, "bob", &sb, &bob_live).await;
    finish(gw).await;
}

/// A line over `max_line_bytes` is skipped and the rest of the stream arrives; one just under
/// passes whole. An answer over the cap is lost, so the prompt ends as a silent agent's does
/// ("agent timed out", the process recycled) and the session carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_over_the_cap_is_skipped_and_the_session_carries_on() {
    watch_panics();
    let gw = with_bad_agent(&[], |_| {}).await;
    let pool = gw.gw.pools.get("bad").expect("pool").clone();
    let mut c = bad_client(&gw, "alice").await;
    let s = c.new_session().await;
    let other = c.new_session().await;
    let mut live = good_prompt(&mut c, &s, &format!("[huge-update={}]", MAX_LINE * 2), 3).await;
    assert_eq!(live.len(), 4, "the prompt and three chunks: {live:?}");
    let near = MAX_LINE - 1024;
    let updates = good_prompt(&mut c, &s, &format!("[huge-update={near}] [chunks=1]"), 2).await;
    assert!(
        chunk_texts(&updates)[0].len() == near,
        "an update just under the cap arrives whole"
    );
    live.extend(updates);

    let before = pool.pids();
    let started = Instant::now();
    let r = c
        .prompt(&s, &format!("[huge-answer={}] [chunks=2]", MAX_LINE * 2))
        .await;
    assert_eq!(r["error"]["message"], "agent timed out", "{r}");
    assert_agent_error(&r);
    assert!(started.elapsed() < Duration::from_secs(6), "{:?}", started.elapsed());
    let updates = c.take_updates(&s);
    assert_eq!(
        chunk_texts(&updates).len(),
        2,
        "the chunks before the lost answer arrived"
    );
    live.extend(updates);
    eventually("the silent process to be recycled", || pool.pids() != before).await;

    live.extend(good_prompt(&mut c, &s, "after", 3).await);
    let other_live = good_prompt(&mut c, &other, "the other session", 3).await;
    assert_replay_holds(&gw, "alice", &s, &live).await;
    assert_replay_holds(&gw, "alice", &other, &other_live).await;
    finish(gw).await;
}

/// Answers to ids the gateway never used, of every type, are dropped; a prompt answered twice
/// reaches the client once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_to_unknown_ids_are_dropped_and_a_prompt_is_answered_once() {
    watch_panics();
    let gw = with_bad_agent(&[], |_| {}).await;
    let mut c = bad_client(&gw, "alice").await;
    let s = c.new_session().await;
    let id = c.start("session/prompt", prompt_params(&s, "[unknown-ids]")).await;
    let r = c.answer(id).await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "the first answer: {r}");
    let mut live = c.take_updates(&s);
    // The duplicate comes right after the first answer: by the next prompt's answer it has been
    // read and dropped.
    live.extend(good_prompt(&mut c, &s, "next", 3).await);
    assert!(
        !c.inbox.iter().any(|m| m.get("method").is_none()),
        "a second answer reached the client: {:?}",
        c.inbox
    );
    assert_eq!(chunk_texts(&live).len(), 6);
    assert_replay_holds(&gw, "alice", &s, &live).await;
    finish(gw).await;
}

/// Updates for sessions that do not exist (or naming none, or not by a string) go nowhere; a
/// request for a session that does not exist is answered to the agent `-32602`; other sessions
/// and users see none of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_and_requests_for_unknown_sessions_go_nowhere() {
    watch_panics();
    let gw = with_bad_agent(&[], |_| {}).await;
    let mut c = bad_client(&gw, "alice").await;
    let mut bob = bad_client(&gw, "bob").await;
    let s = c.new_session().await;
    let s2 = c.new_session().await;
    let sb = bob.new_session().await;
    let live = good_prompt(&mut c, &s, "[foreign-session]", 4).await;
    let report = chunk_texts(&live)
        .into_iter()
        .find(|t| t.starts_with("foreign answer: "))
        .expect("the agent reports the answer it got");
    let answer: Value = serde_json::from_str(&report["foreign answer: ".len()..]).expect("JSON");
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    assert!(c.inbox.is_empty(), "{:?}", c.inbox);
    let live2 = good_prompt(&mut c, &s2, "unaffected", 3).await;
    let bob_live = good_prompt(&mut bob, &sb, "unaffected", 3).await;
    assert!(bob.inbox.is_empty(), "{:?}", bob.inbox);
    assert_replay_holds(&gw, "alice", &s, &live).await;
    assert_replay_holds(&gw, "alice", &s2, &live2).await;
    assert_replay_holds(&gw, "bob", &sb, &bob_live).await;
    finish(gw).await;
}

/// An agent that exits as it starts: `initialize` gets `-32603` naming the agent and how it
/// ended; the connection stays open (and uninitialized), and may try again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_exits_at_start_fails_initialize_naming_it() {
    watch_panics();
    let gw = with_bad_agent(&["--exit-at-start"], |_| {}).await;
    let pool = gw.gw.pools.get("bad").expect("pool").clone();
    let mut c = connect_bad(&gw, "alice").await;
    let init = json!({"protocolVersion": 1, "clientCapabilities": {}});
    for _ in 0..2 {
        let started = Instant::now();
        let r = c.request("initialize", init.clone()).await;
        assert_eq!(r["error"]["code"], -32603, "{r}");
        assert!(
            r["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("agent bad") && m.contains("exit code 3")),
            "names the agent and how it ended: {r}"
        );
        assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
        let r = c.request("session/list", json!({})).await;
        assert_eq!(r["error"]["code"], -32600, "still not initialized: {r}");
    }
    eventually("no process left", || pool.process_count() == 0).await;
    finish(gw).await;
}

/// An agent that never answers `initialize`: `-32603` "agent timed out" naming it, within the
/// request timeout; the connection stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_never_answers_initialize_times_out_naming_it() {
    watch_panics();
    let gw = with_bad_agent(&["--mute-init"], |_| {}).await;
    let mut c = connect_bad(&gw, "alice").await;
    let started = Instant::now();
    let r = c
        .request("initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}))
        .await;
    assert_eq!(r["error"]["message"], "agent timed out", "{r}");
    assert_agent_error(&r);
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    let r = c.request("session/list", json!({})).await;
    assert_eq!(r["error"]["code"], -32600, "{r}");
    finish(gw).await;
}

/// A permission request nobody answers: after `permission_wait_secs` the agent is answered
/// `cancelled` and the client is told with `$/cancel_request`; the prompt then ends normally
/// (the wait is not agent silence), and a late answer is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_permission_request_is_cancelled_after_the_wait() {
    watch_panics();
    let gw = with_bad_agent(&[], |c| {
        c.agents.get_mut("bad").expect("bad").pool.prompt_idle_timeout_secs = 1
    })
    .await;
    let mut c = bad_client(&gw, "alice").await;
    let s = c.new_session().await;
    let started = Instant::now();
    let id = c.start("session/prompt", prompt_params(&s, "[permission]")).await;
    let req = c.wait_for(|m| m["method"] == "session/request_permission").await;
    assert_eq!(req["params"]["sessionId"], s.as_str());
    let cancel = c.wait_for(|m| m["method"] == "$/cancel_request").await;
    assert_eq!(cancel["params"]["requestId"], req["id"], "{cancel}");
    let r = c.answer(id).await;
    let took = started.elapsed();
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(5),
        "{took:?}"
    );
    let mut live = c.take_updates(&s);
    assert!(
        chunk_texts(&live).contains(&r#"permission answer: {"outcome": {"outcome": "cancelled"}}"#.to_string()),
        "the agent was answered cancelled: {:?}",
        chunk_texts(&live)
    );
    let late =
        json!({"jsonrpc": "2.0", "id": req["id"], "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}});
    if let Err(got) = unanswered(&mut c, Message::text(late.to_string()), 0).await {
        panic!("a late answer was answered: {got}");
    }
    live.extend(good_prompt(&mut c, &s, "next", 3).await);
    assert_replay_holds(&gw, "alice", &s, &live).await;
    finish(gw).await;
}

/// An agent that writes a line that is not UTF-8: either the line is skipped (like any line
/// that is not JSON-RPC) and the prompt ends well, or the prompt is answered `-32603` naming the
/// agent and the process is recycled; either way every session carries on, nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_writing_invalid_utf8_fails_its_prompt_and_its_sessions_carry_on() {
    watch_panics();
    let gw = with_bad_agent(&[], |_| {}).await;
    let pool = gw.gw.pools.get("bad").expect("pool").clone();
    let mut c = bad_client(&gw, "alice").await;
    let mut bob = bad_client(&gw, "bob").await;
    let s = c.new_session().await;
    let other = c.new_session().await;
    let sb = bob.new_session().await;
    let mut live = good_prompt(&mut c, &s, "before", 3).await;
    let before = pool.pids();
    assert_eq!(before.len(), 2, "alice's process and bob's");
    let started = Instant::now();
    let r = c.prompt(&s, "[utf8]").await;
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    let updates = c.take_updates(&s);
    if r.get("result").is_some() {
        // The line is skipped like any other line that is not JSON-RPC.
        assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
        assert_eq!(chunk_texts(&updates).len(), 3, "{updates:?}");
        assert_eq!(pool.pids(), before, "the process carries on");
    } else {
        // Or the gateway gives up on the agent, recycling it.
        assert_agent_error(&r);
        eventually("alice's process to be recycled", || pool.process_count() == 1).await;
    }
    live.extend(updates);
    live.extend(good_prompt(&mut c, &s, "after", 3).await);
    let other_live = good_prompt(&mut c, &other, "the other session", 3).await;
    let bob_live = good_prompt(&mut bob, &sb, "bob", 3).await;
    assert_replay_holds(&gw, "alice", &s, &live).await;
    assert_replay_holds(&gw, "alice", &other, &other_live).await;
    assert_replay_holds(&gw, "bob", &sb, &bob_live).await;
    finish(gw).await;
}

/// An agent that closes its stdout and keeps running (ignoring SIGTERM): the prompt is answered
/// `-32603` naming the agent, the process is killed, and the session carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_closes_stdout_but_keeps_running_is_killed_and_its_sessions_carry_on() {
    watch_panics();
    let gw = with_bad_agent(&[], |_| {}).await;
    let pool = gw.gw.pools.get("bad").expect("pool").clone();
    let mut c = bad_client(&gw, "alice").await;
    let s = c.new_session().await;
    let other = c.new_session().await;
    let mut live = good_prompt(&mut c, &s, "before", 3).await;
    let pid = pool.pids()[0];
    let started = Instant::now();
    let r = c.prompt(&s, "[close-stdout]").await;
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    assert_agent_error(&r);
    live.extend(c.take_updates(&s));
    eventually("the agent that ignores SIGTERM to be killed", || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
            stat.rsplit(')').next().is_some_and(|s| s.trim_start().starts_with('Z'))
        })
    })
    .await;
    live.extend(good_prompt(&mut c, &s, "after", 3).await);
    let other_live = good_prompt(&mut c, &other, "the other session", 3).await;
    assert_replay_holds(&gw, "alice", &s, &live).await;
    assert_replay_holds(&gw, "alice", &other, &other_live).await;
    finish(gw).await;
}

/// An agent that writes a stderr line over the gateway's cap for stderr lines (8 KiB) and then
/// keeps writing to stderr: stderr is still drained (an agent never blocks on it, nor gets a
/// broken pipe), and the prompt ends well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_stderr_line_does_not_stop_the_agent() {
    watch_panics();
    let gw = with_bad_agent(&[], |_| {}).await;
    let pool = gw.gw.pools.get("bad").expect("pool").clone();
    let mut c = bad_client(&gw, "alice").await;
    let s = c.new_session().await;
    let before = pool.pids();
    // 100 000 bytes after the long line: more than a pipe holds.
    let mut live = good_prompt(&mut c, &s, "[stderr=1000:20000]", 3).await;
    live.extend(good_prompt(&mut c, &s, "[stderr=1000:10]", 3).await);
    assert_eq!(pool.pids(), before, "the same process carries on");
    assert_replay_holds(&gw, "alice", &s, &live).await;
    finish(gw).await;
}
