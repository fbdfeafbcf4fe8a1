//! The showcase's session controls, checked against the ACP v1 schema crate as the rest of
//! [`super`]: the modes, config options and slash commands a session offers, how they change a
//! turn, and that they outlive the agent process.

use super::*;

/// The modes and options a fresh session offers.
#[tokio::test]
async fn new_session_offers_modes_options_and_commands() {
    let cwd = tempfile::tempdir().unwrap();
    let mut a = Agent::start(0);
    let (_, result) = a.new_session(cwd.path()).await;
    let typed: v1::NewSessionResponse = schema(&result);
    let modes = typed.modes.unwrap();
    assert_eq!(&*modes.current_mode_id.0, "code");
    let ids: Vec<&str> = modes.available_modes.iter().map(|m| &*m.id.0).collect();
    assert_eq!(ids, ["ask", "code", "plan"]);
    assert!(modes.available_modes.iter().all(|m| m.description.is_some()));
    let options = typed.config_options.unwrap();
    assert_eq!(options.len(), 2);
    assert_eq!(options[0].category, Some(v1::SessionConfigOptionCategory::Model));
    assert_eq!(options[1].category, Some(v1::SessionConfigOptionCategory::ThoughtLevel));
    let v1::SessionConfigKind::Select(model) = &options[0].kind else {
        panic!("model is a select")
    };
    assert_eq!(&*model.current_value.0, "demo-swift");
    let v1::SessionConfigSelectOptions::Ungrouped(values) = &model.options else {
        panic!("ungrouped")
    };
    assert_eq!(values.len(), 2);
    assert_eq!(values[1].name, "Demo Deep");
    a.stop().await;
}

/// Modes and options round trip, are validated, and change what a turn does.
#[tokio::test]
async fn modes_and_options_change_the_turn() {
    let cwd = tempfile::tempdir().unwrap();
    let mut a = Agent::start(0);
    let (sid, _) = a.new_session(cwd.path()).await;

    for bad in [json!({"sessionId": sid, "modeId": "yolo"}), json!({"sessionId": sid})] {
        let id = a.request("session/set_mode", bad).await;
        assert_eq!(a.answer(id).await["error"]["code"], -32602);
    }
    let id = a
        .request("session/set_mode", json!({"sessionId": "nope", "modeId": "plan"}))
        .await;
    assert_eq!(a.answer(id).await["error"]["code"], -32002);
    let id = a
        .request("session/set_mode", json!({"sessionId": sid, "modeId": "plan"}))
        .await;
    let _: v1::SetSessionModeResponse = schema(&a.answer(id).await["result"]);
    let update = a.update(&sid).await;
    assert_eq!(
        update,
        json!({"sessionUpdate": "current_mode_update", "currentModeId": "plan"})
    );

    // Plan mode: a plan and an answer, no edit, no command, no file.
    let t = a.prompt(&sid, "what would you change?", "allow").await;
    assert!(t.tool("edit").is_empty() && t.tool("execute").is_empty());
    assert!(!t.of_kind("plan").is_empty() && t.markdown().contains("Plan"));
    assert!(!cwd.path().join("acp-demo").exists());
    let t = a.prompt(&sid, "/diff", "allow").await;
    assert_eq!(t.kinds(), ["agent_message_chunk", "usage_update"]);
    assert!(t.markdown().contains("read-only"));

    for bad in [
        json!({"sessionId": sid, "configId": "temperature", "value": "hot"}),
        json!({"sessionId": sid, "configId": "model", "value": "gpt-9"}),
        json!({"sessionId": sid, "configId": "model", "type": "boolean", "value": true}),
    ] {
        let id = a.request("session/set_config_option", bad).await;
        assert_eq!(a.answer(id).await["error"]["code"], -32602);
    }
    let id = a
        .request(
            "session/set_config_option",
            json!({"sessionId": sid, "configId": "model", "value": "demo-deep"}),
        )
        .await;
    let answer: v1::SetSessionConfigOptionResponse = schema(&a.answer(id).await["result"]);
    let v1::SessionConfigKind::Select(model) = &answer.config_options[0].kind else {
        panic!("select")
    };
    assert_eq!(&*model.current_value.0, "demo-deep");
    let update = a.update(&sid).await;
    assert_eq!(update["sessionUpdate"], "config_option_update");
    assert_eq!(
        update["configOptions"],
        serde_json::to_value(&answer.config_options).unwrap()
    );

    let id = a
        .request("session/set_mode", json!({"sessionId": sid, "modeId": "code"}))
        .await;
    a.answer(id).await;
    a.update(&sid).await;
    let t = a.prompt(&sid, "go deep", "allow").await;
    assert_eq!(t.of_kind("agent_thought_chunk").len(), 2, "Demo Deep thinks twice");
    assert!(t.markdown().contains("**Demo Deep**"));
    assert!(
        std::fs::read_to_string(cwd.path().join("acp-demo/hello.rs"))
            .unwrap()
            .contains("Demo Deep")
    );
    a.stop().await;
}

/// Each slash command does only its part.
#[tokio::test]
async fn slash_commands_do_one_thing() {
    let cwd = tempfile::tempdir().unwrap();
    let mut a = Agent::start(0);
    let (sid, _) = a.new_session(cwd.path()).await;
    let t = a.prompt(&sid, "/diff", "allow").await;
    assert_eq!(
        t.kinds(),
        ["tool_call", "tool_call_update", "tool_call_update", "usage_update"]
    );
    assert_eq!(t.updates[0]["kind"], "edit");
    let t = a.prompt(&sid, "/test", "allow").await;
    assert_eq!(
        t.kinds(),
        ["tool_call", "tool_call_update", "tool_call_update", "usage_update"]
    );
    assert_eq!(t.updates[0]["kind"], "execute");
    let t = a.prompt(&sid, "/plan the next step", "allow").await;
    assert_eq!(t.kinds(), ["plan", "usage_update"]);
    assert!(
        t.updates[0]["entries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["status"] == "pending")
    );
    let t = a.prompt(&sid, "/explain [chunks=7]", "allow").await;
    assert_eq!(t.kinds().iter().filter(|k| **k == "agent_message_chunk").count(), 7);
    assert_eq!(t.kinds().len(), 8);
    a.stop().await;
}

/// A session restored on a new agent process (as the gateway does after a crash or a reap)
/// keeps its mode, options and running cost.
#[tokio::test]
async fn choices_outlive_the_process() {
    let cwd = tempfile::tempdir().unwrap();
    let mut a = Agent::start(0);
    let (sid, _) = a.new_session(cwd.path()).await;
    for (method, params) in [
        ("session/set_mode", json!({"sessionId": sid, "modeId": "plan"})),
        (
            "session/set_config_option",
            json!({"sessionId": sid, "configId": "effort", "value": "high"}),
        ),
    ] {
        let id = a.request(method, params).await;
        a.answer(id).await;
        a.update(&sid).await;
    }
    let t = a.prompt(&sid, "think", "allow").await;
    let cost = t.of_kind("usage_update")[0]["cost"].clone();
    let home = a.home.clone();
    a.stop().await;

    for method in ["session/resume", "session/load"] {
        let mut b = Agent::start_in(0, home.clone());
        let id = b
            .request(method, json!({"sessionId": sid, "cwd": cwd.path(), "mcpServers": []}))
            .await;
        let result = b.answer(id).await["result"].take();
        let typed: v1::ResumeSessionResponse = schema(&result);
        assert_eq!(&*typed.modes.unwrap().current_mode_id.0, "plan", "{method}");
        assert_eq!(result["configOptions"][1]["currentValue"], "high", "{method}");
        check_commands(&b.update(&sid).await);
        let t = b.prompt(&sid, "again", "allow").await;
        assert!(t.tool("edit").is_empty(), "still in Plan mode");
        assert!(t.of_kind("usage_update")[0]["cost"]["amount"].as_f64() > cost["amount"].as_f64());
        b.stop().await;
    }
}
