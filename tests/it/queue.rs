//! Issue 20, item 3: messages typed mid-turn are queued in the gateway, per session. Every tab
//! of the owner sees the queue (`_gateway/queue` notices, and at `session/load`), may edit or
//! remove what is still queued, and the gateway sends each one, in order, when the turn before
//! it ends. A cancelled turn holds the queue until the user goes on. Another user's requests
//! answer as for an unknown session. Over real WebSockets to the demo agent, whose turn is held
//! open by a permission request so nothing here depends on timing.

use crate::common;

use common::{Client, Db, TestGateway};
use serde_json::{Value, json};

fn text(t: &str) -> Value {
    json!([{"type": "text", "text": t}])
}

fn is_queue(m: &Value, pred: impl Fn(&Value) -> bool) -> bool {
    m["method"] == "_gateway/queue" && pred(&m["params"])
}

fn queued_texts(params: &Value) -> Vec<String> {
    params["queue"]
        .as_array()
        .map(|q| {
            q.iter()
                .filter_map(|m| m["prompt"][0]["text"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn user_texts(updates: &[Value]) -> Vec<String> {
    updates
        .iter()
        .filter(|u| u["params"]["update"]["sessionUpdate"] == "user_message_chunk")
        .filter_map(|u| u["params"]["update"]["content"]["text"].as_str().map(str::to_string))
        .collect()
}

/// Starts a turn the demo agent holds open with a permission request; the request.
async fn held_turn(c: &mut Client, s: &str) -> (u64, Value) {
    let id = c
        .start(
            "session/prompt",
            json!({"sessionId": s, "prompt": text("first [permission]")}),
        )
        .await;
    let ask = c.wait_for(|m| m["method"] == "session/request_permission").await;
    (id, ask)
}

/// Answers the permission request `ask` that holds a turn open: allowed, so the turn ends.
async fn allow(c: &mut Client, ask: &Value) {
    c.send(
        json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_typed_mid_turn_are_sent_in_order_after_it_and_every_tab_sees_the_queue() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut a = gw.client("alice").await;
    let s = a.new_session().await;
    let (turn, ask) = held_turn(&mut a, &s).await;

    // A second tab opens the session mid-turn: it is told a turn runs.
    let mut b = gw.client("alice").await;
    let loaded = b
        .request("session/load", json!({"sessionId": s, "cwd": b.root, "mcpServers": []}))
        .await;
    assert!(loaded.get("result").is_some(), "{loaded}");
    b.wait_for(|m| is_queue(m, |p| p["running"] == true && p["sessionId"] == s.as_str()))
        .await;

    // The second tab queues a message; both tabs see it.
    let r = b
        .request("_gateway/queue/add", json!({"sessionId": s, "prompt": text("second")}))
        .await;
    let second = r["result"]["id"].as_u64().unwrap_or_else(|| panic!("queued: {r}"));
    for c in [&mut a, &mut b] {
        c.wait_for(|m| is_queue(m, |p| queued_texts(p) == ["second"])).await;
    }
    // The first queues two more, edits one, removes the other.
    let third = a
        .request("_gateway/queue/add", json!({"sessionId": s, "prompt": text("third")}))
        .await["result"]["id"]
        .as_u64()
        .expect("third queued");
    let fourth = a
        .request("_gateway/queue/add", json!({"sessionId": s, "prompt": text("fourth")}))
        .await["result"]["id"]
        .as_u64()
        .expect("fourth queued");
    let r = a
        .request(
            "_gateway/queue/edit",
            json!({"sessionId": s, "id": third, "prompt": text("third, edited")}),
        )
        .await;
    assert_eq!(r["result"], json!({}), "{r}");
    let r = a
        .request("_gateway/queue/remove", json!({"sessionId": s, "id": fourth}))
        .await;
    assert_eq!(r["result"], json!({}), "{r}");
    b.wait_for(|m| is_queue(m, |p| queued_texts(p) == ["second", "third, edited"]))
        .await;

    // Another user can neither see nor touch it: as for a session that does not exist.
    let mut bob = gw.client("bob").await;
    for (method, params) in [
        ("_gateway/queue/add", json!({"sessionId": s, "prompt": text("bob's")})),
        (
            "_gateway/queue/edit",
            json!({"sessionId": s, "id": second, "prompt": text("bob's")}),
        ),
        ("_gateway/queue/remove", json!({"sessionId": s, "id": second})),
        ("_gateway/queue/send", json!({"sessionId": s})),
    ] {
        let r = bob.request(method, params).await;
        assert_eq!(r["error"]["code"], -32002, "{method}: {r}");
    }
    assert!(
        !bob.inbox.iter().any(|m| m["method"] == "_gateway/queue"),
        "bob heard of alice's queue"
    );

    // The turn ends: the queued messages go, one turn each, in order.
    allow(&mut a, &ask).await;
    assert_eq!(a.answer(turn).await["result"]["stopReason"], "end_turn");
    b.wait_for(|m| is_queue(m, |p| p["running"] == false && queued_texts(p).is_empty()))
        .await;
    let updates = b
        .updates_until(&s, |u| {
            u["params"]["update"]["sessionUpdate"] == "user_message_chunk"
                && u["params"]["update"]["content"]["text"] == "third, edited"
        })
        .await;
    assert_eq!(
        user_texts(&updates),
        ["first [permission]", "second", "third, edited"],
        "replayed at load, then sent"
    );
    let r = a
        .request(
            "_gateway/queue/edit",
            json!({"sessionId": s, "id": second, "prompt": text("late")}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("was sent or removed"),
        "{r}"
    );

    // Stored like any prompt: a fresh tab replays them, each followed by the agent's reply.
    let mut c = gw.client("alice").await;
    let r = c
        .request("session/load", json!({"sessionId": s, "cwd": c.root, "mcpServers": []}))
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let replayed = c.take_updates(&s);
    assert_eq!(user_texts(&replayed), ["first [permission]", "second", "third, edited"]);
    let last = replayed.last().expect("replayed");
    assert_eq!(
        last["params"]["update"]["sessionUpdate"], "agent_message_chunk",
        "the last turn ran: {last}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_turn_holds_the_queue_until_the_user_sends_on() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut a = gw.client("alice").await;
    let s = a.new_session().await;
    let (turn, _ask) = held_turn(&mut a, &s).await;
    let r = a
        .request(
            "_gateway/queue/add",
            json!({"sessionId": s, "prompt": text("after the stop")}),
        )
        .await;
    assert!(r["result"]["id"].is_u64(), "{r}");

    a.send(json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": s}}))
        .await;
    assert_eq!(a.answer(turn).await["result"]["stopReason"], "cancelled");
    let held = a
        .wait_for(|m| is_queue(m, |p| p["running"] == false && p["held"] == true))
        .await;
    assert_eq!(queued_texts(&held["params"]), ["after the stop"], "{held}");

    // Going on sends it.
    let r = a.request("_gateway/queue/send", json!({"sessionId": s})).await;
    assert_eq!(r["result"], json!({}), "{r}");
    a.wait_for(|m| {
        is_queue(m, |p| {
            p["running"] == false && p["held"] == false && queued_texts(p).is_empty()
        })
    })
    .await;
    let updates = a.take_updates(&s);
    assert!(
        user_texts(&updates).contains(&"after the stop".to_string()),
        "{updates:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_queued_while_idle_goes_at_once_and_bad_requests_say_what_is_wrong() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut a = gw.client("alice").await;
    let s = a.new_session().await;
    let r = a
        .request("_gateway/queue/add", json!({"sessionId": s, "prompt": text("now")}))
        .await;
    assert!(r["result"]["id"].is_u64(), "{r}");
    let updates = a
        .updates_until(&s, |u| u["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .await;
    assert_eq!(user_texts(&updates), ["now"]);

    let r = a
        .request("_gateway/queue/add", json!({"sessionId": s, "prompt": "not blocks"}))
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let r = a.request("_gateway/queue/remove", json!({"sessionId": s})).await;
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("needs `id`"),
        "{r}"
    );
    let r = a.request("_gateway/queue/shuffle", json!({"sessionId": s})).await;
    assert_eq!(r["error"]["code"], -32601, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_queues_prompts_itself_gets_the_message_at_once() {
    let gw = TestGateway::start(Db::Sqlite, |c| {
        let demo = c
            .agents
            .get_mut(acp_gateway::infra::config::DEFAULT_AGENT)
            .expect("demo");
        demo.args.push("--prompt-queueing".into());
    })
    .await;
    let mut a = gw.client("alice").await;
    let s = a.new_session().await;
    let (turn, ask) = held_turn(&mut a, &s).await;
    let r = a
        .request(
            "_gateway/queue/add",
            json!({"sessionId": s, "prompt": text("right away")}),
        )
        .await;
    assert_eq!(r["result"], json!({"sent": true}), "{r}");
    // Sent (and recorded) while the first turn is still held open by the permission request;
    // the agent runs it after that turn, as claude-agent-acp does.
    let updates = a
        .updates_until(&s, |u| {
            u["params"]["update"]["sessionUpdate"] == "user_message_chunk"
                && u["params"]["update"]["content"]["text"] == "right away"
        })
        .await;
    assert!(
        !updates
            .iter()
            .any(|u| u["params"]["update"]["sessionUpdate"] == "tool_call_update"
                && u["params"]["update"]["status"] == "completed"),
        "the first turn had not ended: {updates:?}"
    );
    assert!(
        !a.inbox.iter().any(|m| is_queue(m, |p| !queued_texts(p).is_empty())),
        "nothing was held in the gateway"
    );
    allow(&mut a, &ask).await;
    assert_eq!(a.answer(turn).await["result"]["stopReason"], "end_turn");
    a.updates_until(&s, |u| {
        u["params"]["update"]["content"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("you said: right away"))
    })
    .await;
}

/// A teammate's message queued under a controller's share is not sent once the share ends: the
/// owner's tabs see it leave the queue when the share is revoked, and the turn's end sends only
/// the owner's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teammates_queued_message_is_not_sent_once_their_share_ends() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut a = gw.client("alice").await;
    let s = a.new_session().await;
    let (turn, ask) = held_turn(&mut a, &s).await;

    let http = reqwest::Client::new();
    let made: Value = http
        .post(gw.http_url(&format!("/api/sessions/{s}/shares")))
        .bearer_auth(gw.token("alice"))
        .json(&json!({"role": "controller", "user": "carol"}))
        .send()
        .await
        .expect("share")
        .json()
        .await
        .expect("share json");
    let share = made["share"]["id"].as_str().expect("share id").to_string();
    let mut carol = gw.client("carol").await;
    let r = carol
        .request("session/attach", json!({"sessionId": s, "historyPolicy": "none"}))
        .await;
    assert_eq!(r["result"]["role"], "controller", "{r}");
    let r = carol
        .request("_gateway/queue/add", json!({"sessionId": s, "prompt": text("carol's")}))
        .await;
    assert!(r["result"]["id"].is_u64(), "{r}");
    let r = a
        .request("_gateway/queue/add", json!({"sessionId": s, "prompt": text("alice's")}))
        .await;
    assert!(r["result"]["id"].is_u64(), "{r}");
    a.wait_for(|m| is_queue(m, |p| queued_texts(p) == ["carol's", "alice's"]))
        .await;

    let revoked = http
        .delete(gw.http_url(&format!("/api/sessions/{s}/shares/{share}")))
        .bearer_auth(gw.token("alice"))
        .send()
        .await
        .expect("revoke");
    assert_eq!(revoked.status().as_u16(), 204);
    a.wait_for(|m| is_queue(m, |p| queued_texts(p) == ["alice's"])).await;

    allow(&mut a, &ask).await;
    assert_eq!(a.answer(turn).await["result"]["stopReason"], "end_turn");
    a.wait_for(|m| is_queue(m, |p| p["running"] == false && queued_texts(p).is_empty()))
        .await;
    let mut fresh = gw.client("alice").await;
    let replayed = fresh.load(&s).await;
    assert_eq!(
        user_texts(&replayed),
        ["first [permission]", "alice's"],
        "only the owner's queued message was sent"
    );
}
