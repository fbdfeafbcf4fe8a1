//! Issue 2: ACP over WebSocket bridged to pooled stdio agents. Real gateway, real agent
//! processes over real pipes, real WebSocket clients.

use crate::common;
mod early_updates;
mod pool;

use std::time::{Duration, Instant};

use common::{Client, Db, TestGateway, agent, eventually, seq};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

fn text_of(update: &Value) -> String {
    update["params"]["update"]["content"]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn kind(update: &Value) -> &str {
    update["params"]["update"]["sessionUpdate"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_prompts_on_one_process_reach_only_their_own_client() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut a = gw.client("alice").await;
    let mut b = gw.client("alice").await;
    let sa = a.new_session().await;
    let sb = b.new_session().await;
    assert_eq!(
        gw.gw.agents.pools.get("default").expect("pool").process_count(),
        1,
        "one user's sessions share a process"
    );

    let n = 300;
    let pa = json!({"sessionId": sa, "prompt": [{"type": "text", "text": format!("a [chunks={n}] [delay_us=0]")}]});
    let pb = json!({"sessionId": sb, "prompt": [{"type": "text", "text": format!("b [chunks={n}] [delay_us=0]")}]});
    let ida = a.start("session/prompt", pa).await;
    let idb = b.start("session/prompt", pb).await;
    let (ra, rb) = tokio::join!(a.answer(ida), b.answer(idb));
    assert_eq!(ra["result"]["stopReason"], "end_turn", "{ra}");
    assert_eq!(rb["result"]["stopReason"], "end_turn", "{rb}");

    for (client, own, other, tag) in [(&mut a, &sa, &sb, "a "), (&mut b, &sb, &sa, "b ")] {
        assert!(
            client.inbox.iter().all(|m| m["params"]["sessionId"] != **other),
            "no foreign updates"
        );
        let updates = client.take_updates(own);
        let seqs: Vec<u64> = updates.iter().map(seq).collect();
        assert_eq!(
            seqs,
            (1..=seqs.len() as u64).collect::<Vec<_>>(),
            "seq starts at 1 and rises by one"
        );
        let chunks: Vec<String> = updates
            .iter()
            .filter(|u| kind(u) == "agent_message_chunk")
            .map(text_of)
            .collect();
        assert_eq!(chunks.len(), n);
        assert!(
            chunks.iter().all(|c| c.contains(tag)),
            "every chunk answers this client's own prompt"
        );
        assert_eq!(kind(&updates[0]), "user_message_chunk", "the user's prompt is update 1");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permission_requests_reach_the_owning_client_and_the_answer_reaches_the_agent() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut alice = gw.client("alice").await;
    let mut bob = gw.client("bob").await;
    let sa = alice.new_session().await;
    let _sb = bob.new_session().await;

    let id = alice
        .start(
            "session/prompt",
            json!({"sessionId": sa, "prompt": [{"type": "text", "text": "write it [permission]"}]}),
        )
        .await;
    let req = alice.wait_for(|m| m["method"] == "session/request_permission").await;
    assert_eq!(
        req["params"]["sessionId"],
        sa.as_str(),
        "the request names the gateway's session id"
    );
    assert!(req["params"]["options"].as_array().is_some_and(|o| o.len() == 2));
    alice.send(json!({"jsonrpc": "2.0", "id": req["id"], "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}})).await;
    let done = alice.answer(id).await;
    assert_eq!(done["result"]["stopReason"], "end_turn");
    let chunks: Vec<String> = alice
        .take_updates(&sa)
        .iter()
        .filter(|u| kind(u) == "agent_message_chunk")
        .map(text_of)
        .collect();
    assert!(
        !chunks.is_empty() && chunks.iter().all(|c| c.contains("allowed")),
        "the agent got 'allow': {chunks:?}"
    );

    // Reject goes through too.
    let id = alice
        .start(
            "session/prompt",
            json!({"sessionId": sa, "prompt": [{"type": "text", "text": "again [permission]"}]}),
        )
        .await;
    let req = alice.wait_for(|m| m["method"] == "session/request_permission").await;
    alice.send(json!({"jsonrpc": "2.0", "id": req["id"], "result": {"outcome": {"outcome": "selected", "optionId": "reject"}}})).await;
    alice.answer(id).await;
    assert!(alice.take_updates(&sa).iter().any(|u| text_of(u).contains("rejected")));

    // Bob saw nothing of it: a request of his own answers at once with only his traffic before it.
    let r = bob.request("session/list", json!({})).await;
    assert!(bob.inbox.is_empty(), "bob received alice's traffic: {:?}", bob.inbox);
    assert_eq!(r["result"]["sessions"].as_array().map(Vec::len), Some(1));
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_official_python_sdk_agent_works_through_the_gateway() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/sdk_echo_agent.py");
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.agents.insert("sdk".into(), agent("python3", &[script]));
    })
    .await;
    let mut c = Client::connect(&format!("{}?agent=sdk", gw.ws_url()), &gw.token("alice"))
        .await
        .expect("connect");
    let init = c.initialize().await;
    assert_eq!(init["result"]["agentInfo"]["name"], "sdk-echo-agent", "{init}");
    assert_eq!(
        init["result"]["agentCapabilities"]["loadSession"], true,
        "the gateway adds loadSession"
    );
    let s = c.new_session().await;
    let id = c
        .start(
            "session/prompt",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": "hello [permission]"}]}),
        )
        .await;
    let req = c.wait_for(|m| m["method"] == "session/request_permission").await;
    c.send(
        json!({"jsonrpc": "2.0", "id": req["id"], "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}}),
    )
    .await;
    let r = c.answer(id).await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let texts: Vec<String> = c
        .take_updates(&s)
        .iter()
        .filter(|u| kind(u) == "agent_message_chunk")
        .map(text_of)
        .collect();
    assert_eq!(texts.len(), 3, "{texts:?}");
    assert!(texts.iter().all(|t| t.contains("allowed")), "{texts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_errors_are_answered_and_the_connection_lives() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut c = Client::connect(&gw.ws_url(), &gw.token("alice"))
        .await
        .expect("connect");
    assert!(
        c.connection_id.as_deref().is_some_and(|id| id.len() > 8),
        "Acp-Connection-Id on the 101"
    );

    let r = c.request("session/new", json!({"cwd": "/tmp", "mcpServers": []})).await;
    assert_eq!(r["error"]["code"], -32600, "first request must be initialize: {r}");
    // `initialize` without the params the schema asks for is refused, and may be sent again.
    for params in [json!(42), Value::Null, json!({}), json!({"protocolVersion": "1"})] {
        let r = c.request("initialize", params.clone()).await;
        assert_eq!(r["error"]["code"], -32602, "initialize with {params}: {r}");
        assert!(
            r["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("protocolVersion")),
            "{r}"
        );
    }
    let r = c.request("session/list", json!({})).await;
    assert_eq!(r["error"]["code"], -32600, "still not initialized: {r}");
    let r = c.initialize().await;
    assert!(r["result"]["agentCapabilities"]["sessionCapabilities"]["list"].is_object());

    c.send_text("{not json").await;
    let r = c.next().await;
    assert_eq!(
        (r["error"]["code"].clone(), r["id"].clone()),
        (json!(-32700), Value::Null)
    );
    c.send_text(r#"[{"jsonrpc":"2.0","id":1,"method":"session/list"}]"#)
        .await;
    assert_eq!(c.next().await["error"]["code"], -32600);
    c.send_text(r#"{"jsonrpc":"2.0","id":"str-id","method":"nope/nope","params":{}}"#)
        .await;
    let r = c.next().await;
    assert_eq!(
        (r["error"]["code"].clone(), r["id"].clone()),
        (json!(-32601), json!("str-id"))
    );
    let r = c.request("_vendor/thing", json!({})).await;
    assert_eq!(r["error"]["code"], -32601, "extension without a session");
    let r = c
        .request("session/prompt", json!({"sessionId": "made-up", "prompt": []}))
        .await;
    assert_eq!(r["error"]["code"], -32002);
    let r = c.request("session/new", json!({"mcpServers": []})).await;
    assert_eq!(r["error"]["code"], -32602, "missing cwd: {r}");
    // Binary frames are ignored; the connection still works after all of the above.
    c.send_binary(vec![1u8, 2, 3]).await;
    let s = c.new_session().await;
    assert_eq!(c.prompt(&s, "still here").await["result"]["stopReason"], "end_turn");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_upgrades_get_401_and_browsers_can_use_the_subprotocol() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let err = Client::connect_request(gw.ws_url().into_client_request().expect("req"))
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("401"), "{err}");
    let err = Client::connect(&gw.ws_url(), "not-a-jwt").await.err().expect("refused");
    assert!(err.to_string().contains("401"), "{err}");

    let mut req = gw.ws_url().into_client_request().expect("req");
    let offered = format!("acp, bearer.{}", gw.token("carol"));
    req.headers_mut()
        .insert("sec-websocket-protocol", offered.parse().expect("header"));
    let (ws, resp) = tokio_tungstenite::connect_async(req).await.expect("subprotocol auth");
    assert_eq!(
        resp.headers()
            .get("sec-websocket-protocol")
            .and_then(|v| v.to_str().ok()),
        Some("acp")
    );
    drop(ws);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_frame_closes_with_1009_and_other_connections_live_on() {
    let gw = TestGateway::start(Db::Sqlite, |c| c.limits.max_frame_bytes = 64 * 1024).await;
    let mut other = gw.client("alice").await;
    let mut c = gw.client("alice").await;
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":9,"method":"session/list","params":{{"search":"{}"}}}}"#,
        "x".repeat(100_000)
    );
    c.send_text(&huge).await;
    let close = loop {
        match c.recv_frame().await {
            Some(tokio_tungstenite::tungstenite::Message::Close(frame)) => break frame,
            Some(_) => continue,
            None => panic!("closed without a close frame"),
        }
    };
    assert_eq!(close.map(|f| u16::from(f.code)), Some(1009));
    let r = other.request("session/list", json!({})).await;
    assert!(r.get("result").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_answering_pings_is_closed_with_1013_after_the_slow_client_timeout() {
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.limits.ping_interval_secs = 1;
        c.limits.slow_client_timeout_secs = 4;
    })
    .await;
    let drops = common::metric_sum("acp_gateway_slow_clients_dropped_total");
    let mut c = gw.client("alice").await;
    // Not reading means not answering pings: from the server's side the peer has gone silent.
    // The pings fit in the socket's buffers, so the writer never waits on it: the silence is
    // what tells, and only after the slow-client timeout (not two ping intervals).
    let closed = common::wait_until(Duration::from_secs(20), || {
        common::metric_sum("acp_gateway_slow_clients_dropped_total") > drops
    })
    .await
    .expect("the silent client was closed");
    assert!(
        closed >= Duration::from_secs(4) && closed < Duration::from_secs(10),
        "closed after {closed:?}"
    );
    // Reading again, it gets the pings it missed and then the 1013 (its socket is held for it
    // a while).
    let ending = c.read_to_end().await;
    assert_eq!(ending.close_code, Some(1013), "{ending:?}");
    eventually("the connection to be released", || open_connections(&gw) == 0).await;
}

/// WebSocket connections the gateway is serving.
fn open_connections(gw: &TestGateway) -> usize {
    gw.gw.config.limits.max_connections - gw.gw.life.connection_slots.available_permits()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_sdk_client_talks_to_the_gateway() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/sdk_ws_client.py");
    let root = gw.gw.agents.tenancy.roots("alice").expect("roots")[0]
        .display()
        .to_string();
    let run = |token: String| {
        let url = gw.ws_url();
        tokio::process::Command::new("python3")
            .args([
                script,
                "--url",
                &url,
                "--cwd",
                &root,
                "--token",
                &token,
                "--prompt",
                "hi from the SDK [permission]",
                "--timeout",
                "20",
            ])
            .kill_on_drop(true)
            .output()
    };
    let out = tokio::time::timeout(common::WAIT, run(gw.token("alice")))
        .await
        .expect("in time")
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let updates: Vec<Value> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("UPDATE "))
        .map(|j| serde_json::from_str(j).expect("json"))
        .collect();
    assert!(updates.len() >= 5, "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("RESULT ") && l.contains("end_turn")),
        "{stdout}"
    );
    assert!(
        stdout.contains("allowed"),
        "the SDK client's permission answer reached the agent: {stdout}"
    );
    let out = tokio::time::timeout(common::WAIT, run("forged".into()))
        .await
        .expect("in time")
        .expect("runs");
    assert_eq!(out.status.code(), Some(3), "handshake refused with 401");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_closes_first_gets_the_close_frame_back() {
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut c = gw.client("alice").await;
    c.send_message(Message::Close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "bye".into(),
    })))
    .await;
    // The closing handshake completes (RFC 6455 5.5.1): the client sees the server's close frame,
    // not a dropped socket.
    loop {
        match c.recv_frame().await {
            Some(Message::Close(frame)) => {
                assert_eq!(frame.map(|f| f.code), Some(CloseCode::Normal));
                break;
            }
            Some(Message::Ping(_) | Message::Pong(_)) => {}
            other => panic!("expected the server's close frame, got {other:?}"),
        }
    }
}
