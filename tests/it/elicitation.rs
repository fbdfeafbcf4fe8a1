//! The agent asks the user something (`elicitation/create`): like a permission request it reaches
//! every attached client, and when nobody answers within `permission_wait_secs` the agent gets
//! what the spec answers for a dismissed question, `{"action": "cancel"}`, and the clients are
//! told to drop it. Real gateway, a real agent process (tests/agents/elicit_agent.py), real
//! WebSocket clients.

use crate::common;

use acp_gateway::infra::config::AgentConfig;
use common::{Db, TestGateway};
use serde_json::{Value, json};

const AGENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/elicit_agent.py");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_reaches_every_client_and_unanswered_it_is_cancelled() {
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.limits.permission_wait_secs = 1;
        c.agents.insert(
            "default".into(),
            AgentConfig {
                command: "/usr/bin/python3".into(),
                args: vec![AGENT.into()],
                ..Default::default()
            },
        );
    })
    .await;
    let mut first = gw.client("alice").await;
    let session = first.new_session().await;
    let mut second = gw.client("alice").await;
    let r = second
        .request(
            "session/load",
            json!({"sessionId": session, "cwd": second.root, "mcpServers": []}),
        )
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let turn = first
        .start(
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": "form"}]}),
        )
        .await;
    // Both clients are asked, under ids of their own.
    let is_question = |m: &Value| m["method"] == "elicitation/create";
    let asked_first = first.wait_for(is_question).await;
    let asked_second = second.wait_for(is_question).await;
    for asked in [&asked_first, &asked_second] {
        assert_eq!(asked["params"]["sessionId"], session.as_str(), "{asked}");
        assert_eq!(asked["params"]["mode"], "form");
    }
    // Nobody answers: the agent is told `cancel`, the clients to drop it.
    let answer = first.answer(turn).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let updates = first.take_updates(&session);
    let said: String = updates
        .iter()
        .filter_map(|u| u["params"]["update"]["content"]["text"].as_str())
        .collect();
    assert!(said.contains(r#"answer: {"action": "cancel"}"#), "{said}");
    let withdrawn = second.wait_for(|m| m["method"] == "$/cancel_request").await;
    assert_eq!(withdrawn["params"]["requestId"], asked_second["id"], "{withdrawn}");
    gw.stop().await;
}
