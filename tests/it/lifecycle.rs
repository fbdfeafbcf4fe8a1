//! Issue 21, item 3: archiving (hidden from the default list, restorable, owner only) and
//! retention (sessions not updated for N days deleted in batches, in the background, while
//! traffic goes on), on both backends.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use acp_gateway::store::{EventChunk, NewSession, SessionWrite, Store, now_micros};
use common::{Client, Db, TestGateway, metric_sum};
use serde_json::{Value, json};

const DAY: i64 = 24 * 3600 * 1_000_000;

fn ids(list: &Value) -> Vec<String> {
    let mut ids: Vec<String> = list["result"]["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|s| s["sessionId"].as_str().expect("id").to_string())
        .collect();
    ids.sort();
    ids
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

async fn list(c: &mut Client, params: Value) -> Value {
    c.request("session/list", params).await
}

async fn archive_and_restore(db: Db) {
    let gw = TestGateway::start(db, |_| {}).await;
    let mut c = gw.client("alice").await;
    let a = c.new_session().await;
    let b = c.new_session().await;
    let kept = c.new_session().await;
    let http = reqwest::Client::new();
    let call = |method: reqwest::Method, user: &str, id: &str| {
        http.request(method, gw.http_url(&format!("/api/sessions/{id}/archived")))
            .bearer_auth(gw.token(user))
            .send()
    };

    for id in [&a, &b] {
        let res = call(reqwest::Method::PUT, "alice", id).await.expect("archive");
        assert_eq!(res.status(), 204);
    }
    // The default list leaves them out; `archived: true` lists only them, `"any"` both.
    assert_eq!(ids(&list(&mut c, json!({})).await), vec![kept.clone()]);
    let archived = list(&mut c, json!({"archived": true})).await;
    assert_eq!(ids(&archived), sorted(vec![a.clone(), b.clone()]));
    for s in archived["result"]["sessions"].as_array().expect("sessions") {
        let at = s["_meta"]["archivedAt"].as_str().expect("archivedAt");
        assert!(acp_gateway::store::parse_iso8601(at).is_some(), "{at}");
    }
    assert_eq!(
        ids(&list(&mut c, json!({"archived": "any"})).await),
        sorted(vec![a.clone(), b.clone(), kept.clone()])
    );
    let (status, page) = gw
        .api(Some("alice"), reqwest::Method::GET, "/api/sessions?archived=true")
        .await;
    assert_eq!(status, 200);
    assert_eq!(page["sessions"].as_array().expect("sessions").len(), 2);
    let bad = list(&mut c, json!({"archived": "maybe"})).await;
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    assert!(
        bad["error"]["message"].as_str().expect("message").contains("archived"),
        "{bad}"
    );

    // An archived session is still the owner's to open and prompt.
    let r = c.prompt(&a, "still here").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    assert_eq!(
        ids(&list(&mut c, json!({"archived": true})).await),
        sorted(vec![a.clone(), b.clone()])
    );

    // Another user can neither archive nor restore it: answered as an unknown id, nothing changes.
    for method in [reqwest::Method::PUT, reqwest::Method::DELETE] {
        let foreign = call(method.clone(), "bob", &kept).await.expect("call");
        let unknown = call(method, "bob", "no-such-session").await.expect("call");
        assert_eq!(foreign.status(), 404);
        assert_eq!(unknown.status(), 404);
        assert_eq!(foreign.text().await.expect("body"), unknown.text().await.expect("body"));
    }
    let mut bob = gw.client("bob").await;
    assert_eq!(
        ids(&list(&mut bob, json!({"archived": "any"})).await),
        Vec::<String>::new()
    );

    // Restored, it is back in the default list.
    let res = call(reqwest::Method::DELETE, "alice", &b).await.expect("restore");
    assert_eq!(res.status(), 204);
    assert_eq!(
        ids(&list(&mut c, json!({})).await),
        sorted(vec![b.clone(), kept.clone()])
    );
    assert_eq!(ids(&list(&mut c, json!({"archived": true})).await), vec![a.clone()]);
    c.close().await;
    bob.close().await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_and_restore_sqlite() {
    archive_and_restore(Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_and_restore_postgres() {
    archive_and_restore(Db::Postgres).await;
}

/// A session of `owner` last updated at `at`, with a transcript of `updates` updates.
async fn old_session(s: &dyn Store, id: &str, owner: &str, cwd: &str, at: i64, updates: i64) {
    s.create_session(&NewSession {
        id,
        owner,
        agent: "default",
        agent_session_id: None,
        cwd,
        additional_dirs: "[]",
        meta: "{}",
        now: at,
    })
    .await
    .expect("create");
    let payload: Vec<String> = (1..=updates)
        .map(|n| format!(r#"{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"{n}"}}}}"#))
        .collect();
    s.write_batch(&[SessionWrite {
        session_id: Arc::from(id),
        chunk: Some(EventChunk {
            seq_from: 1,
            seq_to: updates,
            payload: payload.join("\n"),
            stored_at: 0,
        }),
        updated_at: at,
        ..Default::default()
    }])
    .await
    .expect("write");
}

/// Retention on, 30 days, 10 sessions a batch, a pass every second. While Alice's prompt streams
/// 4,000 updates (4 s), 25 sessions of two users last updated 40 days ago appear: the next pass
/// deletes exactly those, in at least three batches, and keeps the ones updated 10 days ago, a
/// stale one that is open on this gateway, and the streaming one. The stream loses nothing.
async fn retention_deletes_the_stale_sessions_in_batches(db: Db) {
    let gw = TestGateway::start(db, |c| {
        c.retention.days = 30;
        c.retention.batch_size = 10;
        c.retention.interval_secs = 1;
        let demo = c
            .agents
            .get_mut(acp_gateway::infra::config::DEFAULT_AGENT)
            .expect("demo");
        demo.args = ["demo-agent", "--delay-us", "1000", "--chunks", "3"]
            .map(String::from)
            .to_vec();
    })
    .await;
    let store = gw.gw.sessions.store().clone();
    let now = now_micros();
    // A stale session someone has open: in this gateway's memory, so left alone.
    let mut c = gw.client("alice").await;
    old_session(&*store, "stale-open", "alice", &c.root, now - 40 * DAY, 3).await;
    let loaded = c
        .request(
            "session/load",
            json!({"sessionId": "stale-open", "cwd": c.root, "mcpServers": []}),
        )
        .await;
    assert!(loaded.get("result").is_some(), "{loaded}");

    let s = c.new_session().await;
    let turn = c
        .start(
            "session/prompt",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": "stream [chunks=4000]"}]}),
        )
        .await;
    let mut updates = c.updates_until(&s, |_| true).await; // it streams

    let batches_before = metric_sum(acp_gateway::infra::metrics::RETENTION_BATCHES);
    let deleted_before = metric_sum(acp_gateway::infra::metrics::RETENTION_SESSIONS);
    let mut stale = Vec::new();
    for i in 0..25 {
        let (id, owner) = (format!("stale-{i:02}"), if i % 2 == 0 { "alice" } else { "bob" });
        old_session(&*store, &id, owner, "/w", now - 40 * DAY - i64::from(i) * 1_000, 50).await;
        stale.push((id, owner));
    }
    for i in 0..5 {
        old_session(&*store, &format!("recent-{i}"), "bob", "/w", now - 10 * DAY, 5).await;
    }
    let deadline = tokio::time::Instant::now() + common::WAIT;
    loop {
        let mut left = 0;
        for (id, owner) in &stale {
            left += usize::from(store.get_session(owner, id).await.expect("get").is_some());
        }
        if left == 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{left} stale sessions left");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let live = gw.gw.sessions.live("alice", &s).expect("in memory");
    assert!(
        live.queue().running(),
        "the prompt was still streaming when they were gone"
    );
    drop(live);

    for i in 0..5 {
        assert!(
            store
                .get_session("bob", &format!("recent-{i}"))
                .await
                .expect("get")
                .is_some()
        );
    }
    assert!(store.get_session("alice", "stale-open").await.expect("get").is_some());
    assert!(store.get_session("alice", &s).await.expect("get").is_some());
    for (id, owner) in &stale {
        assert_eq!(store.read_events(owner, id, 0, 10).await.expect("read"), []);
    }
    assert!(metric_sum(acp_gateway::infra::metrics::RETENTION_SESSIONS) - deleted_before >= 25.0);
    assert!(metric_sum(acp_gateway::infra::metrics::RETENTION_BATCHES) - batches_before >= 3.0);

    // The prompt that ran meanwhile: every update once, in order, then its answer.
    let answer = c.answer(turn).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    updates.extend(c.take_updates(&s));
    let seqs: Vec<u64> = updates.iter().map(common::seq).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "no gap, no duplicate");
    let chunks = updates
        .iter()
        .filter(|u| u["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .count();
    assert!(chunks >= 4_000, "{chunks}");
    c.close().await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_the_stale_sessions_in_batches_sqlite() {
    retention_deletes_the_stale_sessions_in_batches(Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_the_stale_sessions_in_batches_postgres() {
    retention_deletes_the_stale_sessions_in_batches(Db::Postgres).await;
}
