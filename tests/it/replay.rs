//! Issue 4: transcripts, replay, and faults that lose nothing — on SQLite and Postgres.

use crate::common;

use common::{Client, Db, TestGateway, both_backends, seq};
use serde_json::{Value, json};

fn kind(u: &Value) -> &str {
    u["params"]["update"]["sessionUpdate"].as_str().unwrap_or_default()
}

fn load(session: &str, after: Option<u64>) -> Value {
    let mut p = json!({"sessionId": session, "mcpServers": []});
    if let Some(n) = after {
        p["_meta"] = json!({"gateway": {"afterSeq": n}});
    }
    p
}

/// Loads a session on a fresh connection and returns every replayed update.
async fn replay_all(gw: &TestGateway, user: &str, session: &str) -> Vec<Value> {
    let mut c = gw.client(user).await;
    let r = c.request("session/load", load(session, None)).await;
    assert!(r.get("result").is_some(), "load failed: {r}");
    c.take_updates(session)
}

fn assert_contiguous(updates: &[Value], from: u64) {
    let seqs: Vec<u64> = updates.iter().map(seq).collect();
    let expected: Vec<u64> = (from..from + seqs.len() as u64).collect();
    assert_eq!(seqs, expected, "every update exactly once, in order");
}

/// Updates one demo-agent prompt produces besides its chunks: the user's prompt, a plan, a
/// tool call and two tool call updates.
const EXTRAS: u64 = 5;

both_backends!(
    a_dropped_socket_mid_stream_loses_nothing_sqlite,
    a_dropped_socket_mid_stream_loses_nothing_postgres,
    dropped_socket
);
async fn dropped_socket(db: Db) {
    let gw = TestGateway::start(db, |_| {}).await;
    let mut c = gw.client("alice").await;
    let s = c.new_session().await;
    let n = 10_000;
    let total = n + EXTRAS;
    c.start(
        "session/prompt",
        json!({"sessionId": s, "prompt": [{"type": "text", "text": format!("go [chunks={n}] [delay_us=50]")}]}),
    )
    .await;
    let mut got: Vec<Value> = Vec::new();
    while got.len() < 2_000 {
        let m = c.next().await;
        if m["method"] == "session/update" {
            got.push(m);
        }
    }
    // Pull the plug: no close handshake, the TCP connection just goes away.
    drop(c);
    let last = seq(got.last().expect("some"));
    let mut c2 = gw.client("alice").await;
    let r = c2.request("session/load", load(&s, Some(last))).await;
    assert!(r.get("result").is_some(), "{r}");
    // Stored updates came with the load; the rest arrive live on the new connection.
    got.extend(c2.updates_until(&s, |u| seq(u) >= total).await);
    assert_contiguous(&got, 1);
    assert_eq!(got.len() as u64, total);
    // And a full replay from scratch gives the same transcript.
    let again = replay_all(&gw, "alice", &s).await;
    assert_eq!(again.len() as u64, total);
    for (a, b) in got.iter().zip(&again) {
        assert_eq!(
            a["params"]["update"], b["params"]["update"],
            "replay is byte-for-byte the live stream"
        );
    }
}

both_backends!(
    a_killed_agent_fails_the_prompt_and_the_session_carries_on_sqlite,
    a_killed_agent_fails_the_prompt_and_the_session_carries_on_postgres,
    killed_agent
);
async fn killed_agent(db: Db) {
    let gw = TestGateway::start(db, |_| {}).await;
    let mut c = gw.client("alice").await;
    let s = c.new_session().await;
    let id = c
        .start(
            "session/prompt",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": "long [chunks=100000] [delay_us=200]"}]}),
        )
        .await;
    c.wait_for(|m| m["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .await;
    let pool = gw.gw.agents.pools.get("default").expect("pool").clone();
    let pids = pool.pids();
    assert_eq!(pids.len(), 1);
    let pid = pids[0];
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill");
    let r = c.answer(id).await;
    assert_eq!(r["error"]["code"], -32603, "{r}");
    common::eventually("dead process dropped", || pool.process_count() == 0).await;
    let r = c.prompt(&s, "after the crash").await;
    assert_eq!(
        r["result"]["stopReason"], "end_turn",
        "the session is restored on a new process: {r}"
    );
    let live = c.take_updates(&s);
    let all = replay_all(&gw, "alice", &s).await;
    assert_contiguous(&all, 1);
    assert_eq!(
        all.iter().map(seq).collect::<Vec<_>>(),
        all.iter().map(seq).collect::<Vec<_>>()
    );
    assert_eq!(
        seq(all.last().expect("some")),
        seq(live.last().expect("some")),
        "everything forwarded was stored"
    );
    let prompts: Vec<&str> = all
        .iter()
        .filter(|u| kind(u) == "user_message_chunk")
        .filter_map(|u| u["params"]["update"]["content"]["text"].as_str())
        .collect();
    assert_eq!(prompts, vec!["long [chunks=100000] [delay_us=200]", "after the crash"]);
}

both_backends!(
    a_restarted_gateway_gives_everything_back_sqlite,
    a_restarted_gateway_gives_everything_back_postgres,
    restart
);
async fn restart(db: Db) {
    let dir = common::DataDir::new();
    let gw = TestGateway::start_in(dir.clone(), db, |_| {}).await;
    let url = gw.db_url.clone();
    let mut c = gw.client("alice").await;
    let mut sessions = Vec::new();
    let mut live = Vec::new();
    for i in 0..3 {
        let s = c.new_session().await;
        c.prompt(&s, &format!("[title=Session {i}] hello [chunks=50]")).await;
        live.push(c.take_updates(&s));
        sessions.push(s);
    }
    drop(c);
    gw.stop().await;

    let gw = TestGateway::start_in(dir, Db::Url(url), |_| {}).await;
    let mut c = gw.client("alice").await;
    let r = c.request("session/list", json!({})).await;
    let listed: Vec<&str> = r["result"]["sessions"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|s| s["sessionId"].as_str())
        .collect();
    assert_eq!(
        listed,
        sessions.iter().rev().map(String::as_str).collect::<Vec<_>>(),
        "newest first, all there"
    );
    let titles: Vec<&str> = r["result"]["sessions"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|s| s["title"].as_str())
        .collect();
    assert_eq!(
        titles,
        vec!["Session 2", "Session 1", "Session 0"],
        "agent's session_info_update titles win"
    );
    for (s, before) in sessions.iter().zip(&live) {
        let after = replay_all(&gw, "alice", s).await;
        assert_eq!(after.len(), before.len());
        for (a, b) in before.iter().zip(&after) {
            assert_eq!(a["params"], b["params"]);
        }
    }
    // And the session carries on after the restart (restored onto a new agent process).
    let r = c.prompt(&sessions[0], "welcome back").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
}

both_backends!(
    two_clients_share_a_session_and_the_first_answer_wins_sqlite,
    two_clients_share_a_session_and_the_first_answer_wins_postgres,
    two_clients
);
async fn two_clients(db: Db) {
    let gw = TestGateway::start(db, |_| {}).await;
    let mut laptop = gw.client("alice").await;
    let s = laptop.new_session().await;
    let mut phone = gw.client("alice").await;
    let r = phone.request("session/resume", load(&s, None)).await;
    assert!(r.get("result").is_some(), "{r}");

    let id = laptop
        .start(
            "session/prompt",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": "[permission] go"}]}),
        )
        .await;
    let ask_laptop = laptop.wait_for(|m| m["method"] == "session/request_permission").await;
    let ask_phone = phone.wait_for(|m| m["method"] == "session/request_permission").await;
    phone.send(json!({"jsonrpc": "2.0", "id": ask_phone["id"], "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}})).await;
    let settled = laptop.wait_for(|m| m["method"] == "$/cancel_request").await;
    assert_eq!(
        settled["params"]["requestId"], ask_laptop["id"],
        "the laptop is told the request is settled"
    );
    // A late answer from the laptop changes nothing.
    laptop.send(json!({"jsonrpc": "2.0", "id": ask_laptop["id"], "result": {"outcome": {"outcome": "selected", "optionId": "reject"}}})).await;
    let r = laptop.answer(id).await;
    assert_eq!(r["result"]["stopReason"], "end_turn");
    let on_laptop = laptop.take_updates(&s);
    let total = seq(on_laptop.last().expect("updates"));
    let on_phone = phone.updates_until(&s, |u| seq(u) >= total).await;
    assert_contiguous(&on_laptop, 1);
    assert_eq!(
        on_laptop.iter().map(seq).collect::<Vec<_>>(),
        on_phone.iter().map(seq).collect::<Vec<_>>(),
        "both tabs get every update"
    );
    assert!(on_laptop.iter().any(|u| {
        u["params"]["update"]["content"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("allowed"))
    }));
}

both_backends!(
    a_permission_request_waits_for_a_client_to_attach_sqlite,
    a_permission_request_waits_for_a_client_to_attach_postgres,
    waiting_permission
);
async fn waiting_permission(db: Db) {
    let gw = TestGateway::start(db, |_| {}).await;
    let mut c = gw.client("alice").await;
    let s = c.new_session().await;
    c.start(
        "session/prompt",
        json!({"sessionId": s, "prompt": [{"type": "text", "text": "[permission] [chunks=4] later"}]}),
    )
    .await;
    let first = c.wait_for(|m| m["method"] == "session/request_permission").await;
    let seen = c.take_updates(&s);
    let last = seen.last().map_or(0, seq);
    c.close().await;

    let mut back: Client = gw.client("alice").await;
    let r = back.request("session/load", load(&s, Some(last))).await;
    assert!(r.get("result").is_some(), "{r}");
    let ask = back.wait_for(|m| m["method"] == "session/request_permission").await;
    assert_eq!(
        ask["params"]["toolCall"], first["params"]["toolCall"],
        "the same request, delivered on attach"
    );
    back.send(
        json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}}),
    )
    .await;
    let updates = back
        .updates_until(&s, |u| {
            u["params"]["update"]["content"]["text"]
                .as_str()
                .is_some_and(|t| t.starts_with("chunk 4/4"))
        })
        .await;
    let mut all = seen;
    all.extend(updates);
    assert_contiguous(&all, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_cannot_restore_gets_a_clear_error_and_the_history_stays_readable() {
    // The official Python SDK agent supports neither session/load nor session/resume.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/sdk_echo_agent.py");
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.agents.insert("sdk".into(), common::agent("python3", &[script]));
    })
    .await;
    let mut c = Client::connect(&format!("{}?agent=sdk", gw.ws_url()), &gw.token("alice"))
        .await
        .expect("connect");
    c.initialize().await;
    let s = c.new_session().await;
    assert_eq!(c.prompt(&s, "remember me").await["result"]["stopReason"], "end_turn");
    let before = c.take_updates(&s);
    let pool = gw.gw.agents.pools.get("sdk").expect("pool").clone();
    for pid in pool.pids() {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("kill");
    }
    common::eventually("the process to be gone", || pool.process_count() == 0).await;
    let r = c.prompt(&s, "are you there?").await;
    assert_eq!(r["error"]["code"], -32603, "{r}");
    let msg = r["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("neither session/resume nor session/load"), "{msg}");
    let mut other = Client::connect(&format!("{}?agent=sdk", gw.ws_url()), &gw.token("alice"))
        .await
        .expect("connect");
    other.request("initialize", json!({"protocolVersion": 1})).await;
    let r = other.request("session/load", load(&s, None)).await;
    assert!(r.get("result").is_some(), "history stays readable: {r}");
    let replayed = other.take_updates(&s);
    assert_eq!(replayed.len(), before.len());
    assert_eq!(
        replayed.iter().map(|u| &u["params"]["update"]).collect::<Vec<_>>(),
        before.iter().map(|u| &u["params"]["update"]).collect::<Vec<_>>()
    );
}
