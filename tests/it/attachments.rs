//! Issue 20, item 2: images and files in a prompt, over a real WebSocket to the demo agent.
//! `initialize` names the cap; blocks the agent does not take, and attachments over
//! `[limits] attachment_bytes`, are refused before anything is recorded or sent, naming the
//! capability or the setting; what is taken reaches the agent as sent (it says what it got, to
//! the byte) and is replayed from the store.

use crate::common;

use base64::Engine as _;
use common::{Client, Db, TestGateway};
use serde_json::{Value, json};

const CAP: usize = 1000;

fn image(bytes: usize) -> Value {
    let data = base64::engine::general_purpose::STANDARD.encode(vec![7u8; bytes]);
    json!({"type": "image", "mimeType": "image/png", "data": data})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attachments_within_the_agents_capabilities_and_the_cap_reach_it_and_are_replayed() {
    let gw = TestGateway::start(Db::Sqlite, |c| c.limits.attachment_bytes = CAP).await;
    let mut c = Client::connect(&gw.ws_url(), &gw.token("alice"))
        .await
        .expect("connect");
    let init = c.initialize().await;
    assert_eq!(init["result"]["_meta"]["gateway"]["attachmentBytes"], CAP);
    assert_eq!(
        init["result"]["agentCapabilities"]["promptCapabilities"]["image"], true,
        "the demo agent takes images"
    );
    let s = c.new_session().await;

    // Over the cap together (an image and a file): refused, naming the setting.
    let file = json!({"type": "resource", "resource": {"uri": "attachment:///notes.txt", "mimeType": "text/plain", "text": "x".repeat(400)}});
    let r = c
        .request(
            "session/prompt",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": "too much"}, image(700), file]}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("1100 bytes") && message.contains("[limits] attachment_bytes"),
        "{message}"
    );
    // Audio, which the demo agent does not take: refused, naming the capability.
    let audio = json!({"type": "audio", "mimeType": "audio/wav", "data": "AAAA"});
    let r = c
        .request("session/prompt", json!({"sessionId": s, "prompt": [audio]}))
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("promptCapabilities.audio"),
        "{r}"
    );

    // Within both: the agent gets them as sent.
    let r = c
        .request(
            "session/prompt",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": "look"}, image(600), {"type": "resource", "resource": {"uri": "attachment:///a.txt", "text": "hello"}}]}),
        )
        .await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let said: String = c
        .take_updates(&s)
        .iter()
        .filter(|u| u["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|u| u["params"]["update"]["content"]["text"].as_str().map(str::to_string))
        .collect();
    assert!(
        said.contains("You attached an image (image/png, 600 bytes) and a file attachment:///a.txt (5 bytes)."),
        "{said}"
    );
    c.close().await;

    // Replayed from the store: the refused prompts left nothing; the taken one is whole.
    let mut again = gw.client("alice").await;
    let r = again
        .request("session/load", json!({"sessionId": s, "mcpServers": []}))
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let user: Vec<Value> = again
        .take_updates(&s)
        .into_iter()
        .map(|u| u["params"]["update"].clone())
        .filter(|u| u["sessionUpdate"] == "user_message_chunk")
        .collect();
    let kinds: Vec<&str> = user.iter().filter_map(|u| u["content"]["type"].as_str()).collect();
    assert_eq!(kinds, ["text", "image", "resource"], "{user:?}");
    assert_eq!(user[1]["content"], image(600));
    assert_eq!(user[0]["content"]["text"], "look");
}
