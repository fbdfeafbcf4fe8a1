//! Per-user caps: one user at a cap is refused with an answer that names the cap, and another
//! user is not slowed. Real gateway, real WebSocket clients.

use crate::common;

use common::{Client, Db, TestGateway};
use serde_json::{Value, json};

/// Checks `r` is the `-32029` of `cap` at `limit`.
fn assert_cap(r: &Value, cap: &str, limit: u64) {
    assert_eq!(r["error"]["code"], -32029, "{r}");
    assert_eq!(
        (r["error"]["data"]["cap"].clone(), r["error"]["data"]["limit"].clone()),
        (json!(cap), json!(limit)),
        "{r}"
    );
}

/// Fills alice's cap of two with sessions and checks the third is refused naming `cap`, that
/// bob is not held back, and that closing one of hers makes room again.
async fn two_sessions_then_the_cap(gw: &TestGateway, cap: &str) {
    let mut alice = gw.client("alice").await;
    let a1 = alice.new_session().await;
    alice.new_session().await;
    let r = alice
        .request("session/new", json!({"cwd": alice.root, "mcpServers": []}))
        .await;
    assert_cap(&r, cap, 2);
    let mut bob = gw.client("bob").await;
    bob.new_session().await;
    bob.new_session().await;
    let r = alice.request("session/close", json!({"sessionId": a1})).await;
    assert!(r.get("result").is_some(), "{r}");
    alice.new_session().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_at_the_connection_cap_is_refused_before_the_upgrade_and_others_are_not() {
    let gw = TestGateway::start(Db::Sqlite, |c| c.limits.max_connections_per_user = 2).await;
    let first = gw.client("alice").await;
    let _second = gw.client("alice").await;
    let refused = Client::connect(&gw.ws_url(), &gw.token("alice"))
        .await
        .err()
        .expect("a third connection of alice is refused");
    assert!(refused.to_string().contains("429"), "{refused}");
    let body = reqwest::Client::new()
        .get(gw.http_url("/acp"))
        .bearer_auth(gw.token("alice"))
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .send()
        .await
        .expect("http");
    assert_eq!(body.status(), 429);
    let body: serde_json::Value = body.json().await.expect("json");
    assert_eq!(
        (body["cap"].clone(), body["limit"].clone()),
        (json!("connections"), json!(2)),
        "{body}"
    );
    let mut bob = gw.client("bob").await;
    assert!(bob.request("session/list", json!({})).await.get("result").is_some());
    // A slot comes back when a connection ends.
    first.close().await;
    let url = gw.ws_url();
    let token = gw.token("alice");
    let mut again = None;
    let deadline = tokio::time::Instant::now() + common::WAIT;
    while again.is_none() {
        assert!(tokio::time::Instant::now() < deadline, "alice's slot never came back");
        again = Client::connect(&url, &token).await.ok();
        if again.is_none() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_over_the_request_rate_gets_an_error_naming_it_and_others_are_served() {
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.limits.requests_per_second_per_user = 1;
        c.limits.request_burst_per_user = 5;
    })
    .await;
    let mut alice = gw.client("alice").await;
    let mut bob = gw.client("bob").await;
    let ids: Vec<u64> = {
        let mut ids = Vec::new();
        for _ in 0..20 {
            ids.push(alice.start("session/list", json!({})).await);
        }
        ids
    };
    let mut refused = 0;
    for id in ids {
        let r = alice.answer(id).await;
        if r.get("error").is_some() {
            assert_eq!(r["error"]["code"], -32029, "{r}");
            assert_eq!(r["error"]["data"]["cap"], "requests_per_second", "{r}");
            refused += 1;
        }
    }
    assert!(
        refused >= 14,
        "at most the burst (5) and a second's worth pass: {refused} refused"
    );
    let r = bob.request("session/list", json!({})).await;
    assert!(r.get("result").is_some(), "bob is not alice: {r}");
    // The connection lives on, and the rate comes back (a token a second).
    let deadline = tokio::time::Instant::now() + common::WAIT;
    loop {
        let r = alice.request("session/list", json!({})).await;
        if r.get("result").is_some() {
            break;
        }
        assert_eq!(r["error"]["code"], -32029, "{r}");
        assert!(tokio::time::Instant::now() < deadline, "alice's rate never came back");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_at_the_live_session_cap_is_told_which_cap_and_others_are_not() {
    let gw = TestGateway::start(Db::Sqlite, |c| c.limits.max_live_sessions_per_user = 2).await;
    two_sessions_then_the_cap(&gw, "live_sessions").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_at_the_agent_process_cap_is_told_which_cap_and_others_are_not() {
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.limits.max_agent_processes_per_user = 2;
        // One session per process: each session needs a process of its own.
        let agent = c
            .agents
            .get_mut(acp_gateway::infra::config::DEFAULT_AGENT)
            .expect("agent");
        agent.pool.max_sessions_per_process = 1;
        agent.pool.min_idle = 0;
    })
    .await;
    two_sessions_then_the_cap(&gw, "agent_processes").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_over_the_stored_bytes_cap_is_refused_until_they_delete_and_others_are_not() {
    let gw = TestGateway::start(Db::Sqlite, |c| c.limits.max_stored_bytes_per_user = 2000).await;
    let mut alice = gw.client("alice").await;
    let s = alice.new_session().await;
    // Each prompt stores a few KiB of transcript; the count is re-read every few seconds, so
    // prompts are refused once a read sees the cap passed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let refused = loop {
        let r = alice.prompt(&s, "fill the transcript").await;
        if r.get("error").is_some() {
            break r;
        }
        assert!(std::time::Instant::now() < deadline, "never refused: {r}");
    };
    assert_cap(&refused, "stored_bytes", 2000);
    let r = alice
        .request("session/new", json!({"cwd": alice.root, "mcpServers": []}))
        .await;
    assert_eq!(r["error"]["data"]["cap"], "stored_bytes", "{r}");
    // Bob stores as much as he likes.
    let mut bob = gw.client("bob").await;
    let b = bob.new_session().await;
    let r = bob.prompt(&b, "mine").await;
    assert!(r.get("result").is_some(), "{r}");
    // Deleting her session makes room at once.
    let r = alice.request("session/delete", json!({"sessionId": s})).await;
    assert!(r.get("result").is_some(), "{r}");
    let s2 = alice.new_session().await;
    let r = alice.prompt(&s2, "again").await;
    assert!(r.get("result").is_some(), "{r}");
}
