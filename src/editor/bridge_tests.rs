//! The bridge's state over scripted frames: what each side gets, across a dropped connection.

use super::*;

fn editor(out: &[Out]) -> Vec<Value> {
    out.iter()
        .filter_map(|o| match o {
            Out::Editor(f) => Some(serde_json::from_str(f).expect("json")),
            Out::Gateway(_) => None,
        })
        .collect()
}

fn gateway(out: &[Out]) -> Vec<Value> {
    out.iter()
        .filter_map(|o| match o {
            Out::Gateway(f) => Some(serde_json::from_str(f).expect("json")),
            Out::Editor(_) => None,
        })
        .collect()
}

fn update(sid: &str, seq: u64, kind: &str) -> String {
    json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid,
        "update": {"sessionUpdate": kind, "content": {"type": "text", "text": format!("u{seq}")}},
        "_meta": {"gateway": {"seq": seq}}}})
    .to_string()
}

/// A bridge connected and initialized, with session `s` open (from `session/new`, id 1).
fn live_with_session(opts: Options) -> Bridge {
    let mut b = Bridge::new(opts);
    assert!(b.connected().is_empty(), "nothing held yet");
    let out = b.from_editor(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{"fs":{"readTextFile":true,"writeTextFile":true},"terminal":true}}}"#);
    assert_eq!(gateway(&out).len(), 1);
    b.from_gateway(r#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1}}"#);
    b.from_editor(
        r#"{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/srv/w/alice/p","mcpServers":[]}}"#,
    );
    let out = b.from_gateway(r#"{"jsonrpc":"2.0","id":1,"result":{"sessionId":"s"}}"#);
    assert_eq!(editor(&out)[0]["result"]["sessionId"], "s");
    b
}

fn roots() -> Options {
    Options {
        roots: vec!["/srv/w/alice".into()],
        ..Options::default()
    }
}

/// Drops the connection, reconnects and answers the bridge's `initialize`: what it sends then.
fn reconnect(b: &mut Bridge) -> Vec<Value> {
    b.disconnected();
    let init = gateway(&b.connected());
    assert_eq!(init.len(), 1);
    assert_eq!(init[0]["method"], "initialize");
    let id = init[0]["id"].as_str().expect("own id").to_string();
    gateway(&b.from_gateway(&json!({"jsonrpc": "2.0", "id": id, "result": {}}).to_string()))
}

#[test]
fn the_remote_agent_is_offered_no_fs_or_terminal_unless_asked() {
    for (pass, fs, terminal) in [(false, json!(false), json!(false)), (true, json!(true), json!(true))] {
        let mut b = Bridge::new(Options {
            pass_client_capabilities: pass,
            ..Options::default()
        });
        b.connected();
        let out = gateway(&b.from_editor(
            r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{"fs":{"readTextFile":true,"writeTextFile":true},"terminal":true}}}"#,
        ));
        let caps = &out[0]["params"]["clientCapabilities"];
        assert_eq!(caps["fs"]["readTextFile"], fs, "{caps}");
        assert_eq!(caps["terminal"], terminal, "{caps}");
    }
}

#[test]
fn a_cwd_outside_the_roots_is_replaced_and_the_editor_told_which() {
    let mut b = live_with_session(roots());
    let out = gateway(&b.from_editor(
        r#"{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/home/me/project","mcpServers":[]}}"#,
    ));
    assert_eq!(out[0]["params"]["cwd"], "/srv/w/alice");
    let out = editor(&b.from_gateway(r#"{"jsonrpc":"2.0","id":2,"result":{"sessionId":"t"}}"#));
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!(out[1]["params"]["sessionId"], "t");
    assert!(
        out[1]["params"]["update"]["content"]["text"]
            .as_str()
            .expect("present")
            .contains("/srv/w/alice")
    );
    // Inside the roots: as it is, and nothing told. `/srv/w/alicex` is not inside `/srv/w/alice`.
    let out = gateway(&b.from_editor(
        r#"{"jsonrpc":"2.0","id":3,"method":"session/new","params":{"cwd":"/srv/w/alicex","mcpServers":[]}}"#,
    ));
    assert_eq!(out[0]["params"]["cwd"], "/srv/w/alice");
    let out = gateway(&b.from_editor(
        r#"{"jsonrpc":"2.0","id":4,"method":"session/new","params":{"cwd":"/srv/w/alice/x","mcpServers":[]}}"#,
    ));
    assert_eq!(out[0]["params"]["cwd"], "/srv/w/alice/x");
    let out = editor(&b.from_gateway(r#"{"jsonrpc":"2.0","id":4,"result":{"sessionId":"u"}}"#));
    assert_eq!(out.len(), 1);
}

#[test]
fn after_a_reconnect_each_update_reaches_the_editor_once_and_in_order() {
    let mut b = live_with_session(roots());
    for seq in 1..=2 {
        assert_eq!(
            editor(&b.from_gateway(&update("s", seq, "agent_message_chunk"))).len(),
            1
        );
    }
    let sent = reconnect(&mut b);
    assert_eq!(sent[0]["method"], "session/load");
    assert_eq!(sent[0]["params"]["_meta"]["gateway"]["afterSeq"], 2);
    assert_eq!(sent[0]["params"]["cwd"], "/srv/w/alice/p");
    // A replay that overlaps (a live update raced the drop) passes only what is new.
    let mut seen = Vec::new();
    for seq in [2, 3, 4, 3] {
        for f in editor(&b.from_gateway(&update("s", seq, "agent_message_chunk"))) {
            seen.push(f["params"]["_meta"]["gateway"]["seq"].as_u64().expect("present"));
        }
    }
    assert_eq!(seen, [3, 4]);
    // The bridge's own load answer is not the editor's.
    let id = sent[0]["id"].as_str().expect("present");
    assert!(editor(&b.from_gateway(&json!({"jsonrpc": "2.0", "id": id, "result": {}}).to_string())).is_empty());
}

fn prompt(b: &mut Bridge, id: u64) {
    let out = b.from_editor(
        &json!({"jsonrpc": "2.0", "id": id, "method": "session/prompt",
            "params": {"sessionId": "s", "prompt": [{"type": "text", "text": "hi"}]}})
        .to_string(),
    );
    assert_eq!(gateway(&out).len(), usize::from(b.is_live()));
}

fn load_answer(b: &mut Bridge, turn: Value) -> Vec<Out> {
    b.from_gateway(
        &json!({"jsonrpc": "2.0", "id": "acp-gateway-connect:load:s",
        "result": {"_meta": {"gateway": {"turn": turn}}}})
        .to_string(),
    )
}

#[test]
fn a_prompt_running_across_the_drop_is_answered_when_its_turn_ends() {
    let mut b = live_with_session(roots());
    prompt(&mut b, 7);
    b.from_gateway(&update("s", 1, "user_message_chunk"));
    reconnect(&mut b);
    let out = load_answer(&mut b, json!({"running": true}));
    assert!(out.is_empty(), "{out:?}");
    b.from_gateway(&update("s", 2, "agent_message_chunk"));
    let out = editor(
        &b.from_gateway(
            &json!({"jsonrpc": "2.0", "method": "_gateway/queue", "params": {"sessionId": "s", "running": false,
            "held": false, "queue": [], "lastAnswer": {"result": {"stopReason": "end_turn"}}}})
            .to_string(),
        ),
    );
    assert_eq!(
        out[0],
        json!({"jsonrpc": "2.0", "id": 7, "result": {"stopReason": "end_turn"}})
    );
}

#[test]
fn a_prompt_that_ended_while_away_is_answered_from_the_load() {
    let mut b = live_with_session(roots());
    prompt(&mut b, 7);
    reconnect(&mut b);
    // The replay brings its chunk: the gateway got it; the turn is over.
    b.from_gateway(&update("s", 1, "user_message_chunk"));
    let out = editor(&load_answer(
        &mut b,
        json!({"running": false, "lastAnswer": {"error": {"code": -32603, "message": "agent timed out"}}}),
    ));
    assert_eq!(out[0]["id"], 7);
    assert_eq!(out[0]["error"]["code"], -32603);
}

#[test]
fn a_prompt_the_gateway_never_got_is_sent_again() {
    let mut b = live_with_session(roots());
    b.disconnected();
    prompt(&mut b, 7);
    // Held while down, sent once the connection is back and initialized.
    let init = gateway(&b.connected());
    let id = init[0]["id"].as_str().expect("present").to_string();
    let out = gateway(&b.from_gateway(&json!({"jsonrpc": "2.0", "id": id, "result": {}}).to_string()));
    assert_eq!(
        out.iter()
            .map(|f| f["method"].as_str().expect("present"))
            .collect::<Vec<_>>(),
        ["session/load", "session/prompt"]
    );
    // The load's answer on the connection it was sent on does not send it twice.
    assert!(gateway(&load_answer(&mut b, json!({"running": true}))).is_empty());
    // Dropped again before it came back: the load says nothing of it, so it goes again.
    let sent = reconnect(&mut b);
    assert_eq!(sent.len(), 1);
    let out = gateway(&load_answer(&mut b, json!({"running": false})));
    assert_eq!(out[0]["method"], "session/prompt");
    assert_eq!(out[0]["id"], 7);
}

#[test]
fn a_permission_asked_again_after_a_reconnect_is_the_one_the_editor_has() {
    let mut b = live_with_session(roots());
    let ask = |gw_id: u64| {
        json!({"jsonrpc": "2.0", "id": gw_id, "method": "session/request_permission",
            "params": {"sessionId": "s", "toolCall": {"toolCallId": "t1"}, "options": []}})
        .to_string()
    };
    let out = editor(&b.from_gateway(&ask(40)));
    let editor_id = out[0]["id"].clone();
    b.disconnected();
    // Answered while the gateway is unreachable: kept.
    let answer =
        json!({"jsonrpc": "2.0", "id": editor_id, "result": {"outcome": {"outcome": "selected", "optionId": "ok"}}});
    assert!(b.from_editor(&answer.to_string()).is_empty());
    reconnect(&mut b);
    // The new connection's ask, with its own id, gets the answer; the editor is not asked twice.
    let out = b.from_gateway(&ask(3));
    assert!(editor(&out).is_empty());
    let sent = gateway(&out);
    assert_eq!(sent[0]["id"], 3);
    assert_eq!(sent[0]["result"]["outcome"]["optionId"], "ok");
}

#[test]
fn asks_of_two_connections_get_ids_that_never_collide() {
    let mut b = live_with_session(roots());
    let ask = |gw_id: u64, call: &str| {
        json!({"jsonrpc": "2.0", "id": gw_id, "method": "session/request_permission",
            "params": {"sessionId": "s", "toolCall": {"toolCallId": call}, "options": []}})
        .to_string()
    };
    let first = editor(&b.from_gateway(&ask(1, "a")))[0]["id"].clone();
    reconnect(&mut b);
    let second = editor(&b.from_gateway(&ask(1, "b")))[0]["id"].clone();
    assert_ne!(first, second);
    // Each answer goes to the connection's ask it answers.
    let out = gateway(&b.from_editor(&json!({"jsonrpc": "2.0", "id": second, "result": {}}).to_string()));
    assert_eq!(out[0]["id"], 1);
}

#[test]
fn giving_up_ends_what_is_in_flight_with_an_error_that_says_so() {
    let mut b = live_with_session(roots());
    prompt(&mut b, 7);
    b.disconnected();
    let out = editor(&b.give_up());
    assert_eq!(out.len(), 1);
    assert_eq!(out[0]["id"], 7);
    assert!(
        out[0]["error"]["message"]
            .as_str()
            .expect("present")
            .contains("connection to the gateway was lost")
    );
    // New requests are refused at once while it is down...
    let out = editor(&b.from_editor(r#"{"jsonrpc":"2.0","id":8,"method":"session/list","params":{}}"#));
    assert_eq!(out[0]["id"], 8);
    // ...and pass again once it is back.
    reconnect(&mut b);
    let out = gateway(&b.from_editor(r#"{"jsonrpc":"2.0","id":9,"method":"session/list","params":{}}"#));
    assert_eq!(out[0]["id"], 9);
}
