//! `/acp` as Streamable HTTP (transport RFD): status codes, streams, `Last-Event-ID`, a session
//! used over both transports, and isolation, against a real gateway with real agent processes.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::http_acp::{Event, HttpAcp, answers};
use crate::common::{Db, TestGateway, seq};

fn root(c: &HttpAcp) -> String {
    c.init["result"]["_meta"]["gateway"]["workspaceRoots"][0]
        .as_str()
        .expect("a workspace root")
        .to_string()
}

fn prompt(sid: &str, text: &str) -> Value {
    json!({"sessionId": sid, "prompt": [{"type": "text", "text": text}]})
}

fn update_seqs(events: &[Event]) -> Vec<u64> {
    events
        .iter()
        .filter(|e| e.data["method"] == "session/update")
        .map(|e| {
            let s = seq(&e.data);
            assert_eq!(e.id.as_deref(), Some(s.to_string().as_str()), "id: is the seq");
            s
        })
        .collect()
}

/// A new session over HTTP: its id, read off the connection's stream.
async fn new_session(c: &mut HttpAcp, conn_stream: &mut crate::common::http_acp::Sse) -> String {
    let id = c
        .request("session/new", json!({"cwd": root(c), "mcpServers": []}), None)
        .await;
    let got = conn_stream.until(|v| answers(v, id)).await;
    got.last().expect("answer").data["result"]["sessionId"]
        .as_str()
        .expect("sessionId")
        .to_string()
}

#[tokio::test]
async fn status_codes_are_the_rfds() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let http = reqwest::Client::new();
    let url = gw.http_url("/acp");
    let token = gw.token("alice");
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}});
    let status = |r: reqwest::Response| r.status();

    // No token: 401 before anything else is looked at.
    assert_eq!(
        status(http.post(&url).json(&init).send().await.expect("post")),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        status(
            http.get(&url)
                .header("accept", "text/event-stream")
                .send()
                .await
                .expect("get")
        ),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        status(http.delete(&url).send().await.expect("delete")),
        StatusCode::UNAUTHORIZED
    );
    // Not JSON: 415. A batch: 501. Not JSON-RPC: 400 with a JSON-RPC error.
    let r = http
        .post(&url)
        .bearer_auth(&token)
        .header("content-type", "text/plain")
        .body(init.to_string())
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let r = http
        .post(&url)
        .bearer_auth(&token)
        .json(&json!([init]))
        .send()
        .await
        .expect("batch");
    assert_eq!(r.status(), StatusCode::NOT_IMPLEMENTED);
    assert_eq!(r.json::<Value>().await.expect("json")["error"]["code"], -32600);
    let r = http
        .post(&url)
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(r.json::<Value>().await.expect("json")["error"]["code"], -32700);
    // Over max_frame_bytes: 413, naming the setting.
    let big = json!({"jsonrpc": "2.0", "id": 1, "method": "x", "params": {"pad": "x".repeat(5 << 20)}});
    let r = http
        .post(&url)
        .bearer_auth(&token)
        .json(&big)
        .send()
        .await
        .expect("big");
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(r.text().await.expect("body").contains("max_frame_bytes"));
    // Anything but initialize without a connection: 400; an unknown one: 404.
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "session/list", "params": {}});
    let r = http
        .post(&url)
        .bearer_auth(&token)
        .json(&list)
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = http
        .post(&url)
        .bearer_auth(&token)
        .header("acp-connection-id", "nope")
        .json(&list)
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), StatusCode::NOT_FOUND);

    let c = HttpAcp::connect(&gw.http_url(""), &token).await;
    assert!(
        c.init["result"]["agentCapabilities"]["loadSession"] == true,
        "{}",
        c.init
    );
    // initialize again on the connection: 400.
    assert_eq!(c.post(&init, None).await, StatusCode::BAD_REQUEST);
    // A GET that does not accept SSE: 406; without the connection: 400; unknown: 404.
    let r = http
        .get(&url)
        .bearer_auth(&token)
        .header("acp-connection-id", &c.conn)
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), StatusCode::NOT_ACCEPTABLE);
    let r = http
        .get(&url)
        .bearer_auth(&token)
        .header("accept", "text/event-stream")
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        c.open(Some("no-such-session"), None).await.err(),
        Some(StatusCode::NOT_FOUND)
    );
    // A request acting on a session without Acp-Session-Id: 400; naming two sessions: 400.
    let p = json!({"jsonrpc": "2.0", "id": 5, "method": "session/prompt", "params": prompt("s1", "hi")});
    assert_eq!(c.post(&p, None).await, StatusCode::BAD_REQUEST);
    assert_eq!(c.post(&p, Some("s2")).await, StatusCode::BAD_REQUEST);
    // DELETE: 202, then the connection is gone.
    assert_eq!(c.delete().await, StatusCode::ACCEPTED);
    assert_eq!(c.post(&list, None).await, StatusCode::NOT_FOUND);
    assert_eq!(c.delete().await, StatusCode::NOT_FOUND);
    gw.stop().await;
}

#[tokio::test]
async fn a_session_streams_on_its_own_stream_with_seq_ids() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut c = HttpAcp::connect(&gw.http_url(""), &gw.token("alice")).await;
    let mut conn_stream = c.open(None, None).await.expect("connection stream");
    let sid = new_session(&mut c, &mut conn_stream).await;
    let mut session_stream = c.open(Some(&sid), None).await.expect("session stream");
    let id = c
        .request("session/prompt", prompt(&sid, "hello [chunks=20]"), Some(&sid))
        .await;
    let events = session_stream.until(|v| answers(v, id)).await;
    let answer = &events.last().expect("answer").data;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let seqs = update_seqs(&events);
    // The answer is numbered after the update it follows, for Last-Event-ID.
    let last = seqs.last().expect("updates");
    assert_eq!(events.last().expect("answer").id, Some(format!("{last}.1")));
    assert!(seqs.len() >= 20, "{seqs:?}");
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "in order, none missing: {seqs:?}"
    );
    // session/list over HTTP answers on the connection's stream.
    let id = c.request("session/list", json!({}), None).await;
    let listed = conn_stream.until(|v| answers(v, id)).await;
    let sessions = &listed.last().expect("answer").data["result"]["sessions"];
    assert_eq!(sessions.as_array().map(Vec::len), Some(1), "{sessions}");
    gw.stop().await;
}

/// Reads 5 events of `sid`'s stream, drops it, resumes after the last one read, and returns
/// the updates' seqs across both, checking the prompt's answer (`id`) came once, at the end.
async fn drop_and_resume(c: &HttpAcp, sid: &str, id: u64, resume_from: Option<&str>) -> Vec<u64> {
    let mut first = c.open(Some(sid), resume_from).await.expect("session stream");
    let mut seen = Vec::new();
    while seen.len() < 5 {
        seen.push(first.next_within(Duration::from_secs(20)).await.expect("an event"));
    }
    // Whatever the stream had taken beyond these is lost with it.
    drop(first);
    let last = seen.last().and_then(|e| e.id.clone()).expect("events carry ids");
    let mut second = c.open(Some(sid), Some(&last)).await.expect("resumed");
    let rest = second.until(|v| answers(v, id)).await;
    let all: Vec<Event> = seen.into_iter().chain(rest).collect();
    assert_eq!(
        all.iter().filter(|e| answers(&e.data, id)).count(),
        1,
        "the answer once"
    );
    update_seqs(&all)
}

#[tokio::test]
async fn a_dropped_stream_resumes_after_last_event_id_from_the_store() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut c = HttpAcp::connect(&gw.http_url(""), &gw.token("alice")).await;
    let mut conn_stream = c.open(None, None).await.expect("connection stream");
    let sid = new_session(&mut c, &mut conn_stream).await;
    // A burst: the first reader takes far more than the client reads before it drops, so the
    // rest comes from the store.
    let id = c
        .request("session/prompt", prompt(&sid, "burst [chunks=400]"), Some(&sid))
        .await;
    let burst = drop_and_resume(&c, &sid, id, None).await;
    assert!(
        burst.windows(2).all(|w| w[1] == w[0] + 1),
        "every update once, in order: {burst:?}"
    );
    assert!(burst.len() >= 400, "{}", burst.len());
    // Paced: most of it comes live after the drop.
    let id = c
        .request(
            "session/prompt",
            prompt(&sid, "paced [chunks=40] [delay_us=20000]"),
            Some(&sid),
        )
        .await;
    let last = burst.last().expect("burst").to_string();
    let paced = drop_and_resume(&c, &sid, id, Some(&last)).await;
    assert_eq!(
        paced.first(),
        Some(&(burst.last().expect("burst") + 1)),
        "nothing of the first prompt again"
    );
    assert!(paced.windows(2).all(|w| w[1] == w[0] + 1), "{paced:?}");
    assert!(paced.len() >= 40, "{paced:?}");
    // Reopened after the last update, the answer that followed it comes again; after the
    // answer, nothing (only keep-alives).
    let after = paced.last().expect("paced").to_string();
    let mut again = c.open(Some(&sid), Some(&after)).await.expect("again");
    let e = again
        .next_within(Duration::from_secs(5))
        .await
        .expect("the answer again");
    assert!(answers(&e.data, id), "{e:?}");
    drop(again);
    let after = e.id.expect("numbered");
    let mut third = c.open(Some(&sid), Some(&after)).await.expect("again");
    assert!(third.next_within(Duration::from_millis(300)).await.is_none());
    gw.stop().await;
}

#[tokio::test]
async fn a_session_is_used_over_both_transports_with_one_numbering() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut ws = gw.client("alice").await;
    let sid = ws.new_session().await;
    ws.prompt(&sid, "over the socket [chunks=5]").await;
    let over_ws: Vec<u64> = ws.take_updates(&sid).iter().map(seq).collect();
    ws.close().await;

    let mut c = HttpAcp::connect(&gw.http_url(""), &gw.token("alice")).await;
    let mut conn_stream = c.open(None, None).await.expect("connection stream");
    let mut session_stream = c.open(Some(&sid), None).await.expect("session stream");
    let id = c
        .request(
            "session/load",
            json!({"sessionId": sid, "cwd": root(&c), "mcpServers": []}),
            Some(&sid),
        )
        .await;
    let replayed = session_stream.until(|v| answers(v, id)).await;
    let replayed = update_seqs(&replayed);
    assert_eq!(
        &replayed[replayed.len() - over_ws.len()..],
        over_ws.as_slice(),
        "the same numbers"
    );
    let id = c
        .request("session/prompt", prompt(&sid, "over HTTP [chunks=5]"), Some(&sid))
        .await;
    let over_http = update_seqs(&session_stream.until(|v| answers(v, id)).await);
    assert_eq!(
        over_http.first(),
        Some(&(replayed.last().expect("some") + 1)),
        "numbering goes on"
    );
    assert!(
        conn_stream.next_within(Duration::from_millis(200)).await.is_none(),
        "nothing of it on the connection's"
    );

    let mut ws = gw.client("alice").await;
    let all: Vec<u64> = ws.load(&sid).await.iter().map(seq).collect();
    assert!(all.ends_with(&over_http), "{all:?} {over_http:?}");
    assert!(all.windows(2).all(|w| w[1] == w[0] + 1), "one transcript: {all:?}");
    gw.stop().await;
}

#[tokio::test]
async fn no_user_reaches_another_users_connection_or_sessions_over_http() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut alice = HttpAcp::connect(&gw.http_url(""), &gw.token("alice")).await;
    let mut alice_stream = alice.open(None, None).await.expect("stream");
    let sid = new_session(&mut alice, &mut alice_stream).await;

    // Bob with Alice's connection id: as unknown as a made-up one, whatever the verb.
    let mut bob = HttpAcp::connect(&gw.http_url(""), &gw.token("bob")).await;
    let bob_conn = std::mem::replace(&mut bob.conn, alice.conn.clone());
    let list = json!({"jsonrpc": "2.0", "id": 9, "method": "session/list", "params": {}});
    assert_eq!(bob.post(&list, None).await, StatusCode::NOT_FOUND);
    assert_eq!(bob.open(None, None).await.err(), Some(StatusCode::NOT_FOUND));
    assert_eq!(bob.delete().await, StatusCode::NOT_FOUND);
    bob.conn = bob_conn;
    // On his own connection, Alice's session: no stream, no load, no prompt, not listed.
    assert_eq!(bob.open(Some(&sid), None).await.err(), Some(StatusCode::NOT_FOUND));
    let mut bob_stream = bob.open(None, None).await.expect("his stream");
    let id = bob
        .request(
            "session/load",
            json!({"sessionId": sid, "cwd": "/", "mcpServers": []}),
            None,
        )
        .await;
    let got = bob_stream.until(|v| answers(v, id)).await;
    let answer = &got.last().expect("answer").data;
    assert_eq!(answer["error"]["code"], -32002, "{answer}");
    assert!(
        got.iter().all(|e| e.data["method"] != "session/update"),
        "nothing of hers"
    );
    let id = bob.request("session/prompt", prompt(&sid, "mine?"), Some(&sid)).await;
    let got = bob_stream.until(|v| answers(v, id)).await;
    assert_eq!(got.last().expect("answer").data["error"]["code"], -32002);
    let id = bob.request("session/list", json!({}), None).await;
    let got = bob_stream.until(|v| answers(v, id)).await;
    assert_eq!(got.last().expect("answer").data["result"]["sessions"], json!([]));
    // Alice's connection still works.
    let id = alice.request("session/list", json!({}), None).await;
    let got = alice_stream.until(|v| answers(v, id)).await;
    assert_eq!(
        got.last().expect("answer").data["result"]["sessions"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_connection_nobody_reads_or_posts_to_expires() {
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.limits.ping_interval_secs = 1;
        c.limits.slow_client_timeout_secs = 1;
    })
    .await;
    let c = HttpAcp::connect(&gw.http_url(""), &gw.token("alice")).await;
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "session/list", "params": {}});
    // With a stream open it lives past the silence limit (its keep-alives count).
    let mut stream = c.open(None, None).await.expect("stream");
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        stream.next_within(Duration::from_millis(500)).await;
    }
    assert_eq!(c.post(&list, None).await, StatusCode::ACCEPTED);
    assert!(stream.until(|v| answers(v, 1)).await.len() == 1);
    // Without one, it goes after two ping intervals of silence. (Opening a stream and dropping
    // it at once, before it writes anything, is no sign of life: it is how this test looks.)
    drop(stream);
    let start = std::time::Instant::now();
    let mut expired = false;
    while start.elapsed() < Duration::from_secs(15) {
        if c.open(None, None).await.err() == Some(StatusCode::NOT_FOUND) {
            expired = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(expired, "an abandoned connection expires");
    gw.stop().await;
}

#[tokio::test]
async fn streamable_http_runs_over_h2c_beside_http1_on_one_port() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .expect("client");
    let mut c = HttpAcp::connect_with(h2, &gw.http_url(""), &gw.token("alice")).await;
    // Every request of it (both streams, the POSTs) on one HTTP/2 connection.
    let mut conn_stream = c.open(None, None).await.expect("connection stream");
    let sid = new_session(&mut c, &mut conn_stream).await;
    let mut session_stream = c.open(Some(&sid), None).await.expect("session stream");
    let res = c.http.get(gw.http_url("/healthz")).send().await.expect("healthz");
    assert_eq!(res.version(), reqwest::Version::HTTP_2);
    let id = c
        .request("session/prompt", prompt(&sid, "over h2c [chunks=10]"), Some(&sid))
        .await;
    let seqs = update_seqs(&session_stream.until(|v| answers(v, id)).await);
    assert!(seqs.len() >= 10, "{seqs:?}");
    // HTTP/1.1 and the WebSocket still work on the same port.
    let mut ws = gw.client("alice").await;
    let loaded: Vec<u64> = ws.load(&sid).await.iter().map(seq).collect();
    assert!(loaded.ends_with(&seqs), "{loaded:?} {seqs:?}");
    gw.stop().await;
}

/// An official SDK's client over Streamable HTTP: the flow its `connect` test runs, with only
/// the transport changed.
async fn sdk_over_http(program: &str, args: impl FnOnce(&str, &str, &str) -> Vec<String>) {
    let gw = crate::editor::slow_gateway(3, 0).await;
    let root = gw.gw.agents.tenancy.roots("alice").expect("roots")[0]
        .display()
        .to_string();
    let args = args(&gw.http_url(""), &gw.token("alice"), &root);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let lines = crate::editor::sdk_client(program, &args).await;
    crate::editor::assert_used_through_connect(&lines);
    gw.stop().await;
}

#[tokio::test]
async fn the_official_python_sdk_uses_the_gateway_over_streamable_http() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/sdk_connect_client.py");
    sdk_over_http("python3", |url, token, root| {
        [
            script,
            "--transport",
            "http",
            "--url",
            url,
            "--token",
            token,
            "--cwd",
            root,
        ]
        .map(String::from)
        .to_vec()
    })
    .await;
}

#[tokio::test]
async fn the_official_typescript_sdk_uses_the_gateway_over_streamable_http() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ui/sdk-connect-client.mjs");
    sdk_over_http("node", |url, token, root| {
        [script, "", url, token, root, "http"].map(String::from).to_vec()
    })
    .await;
}
