//! Hostile frames from a client: odd ids, duplicates, unanswerable frames, batches, malformed JSON,
//! invalid UTF-8, frames at the size cap.

use super::*;

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
