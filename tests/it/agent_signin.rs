//! An agent's own sign-in (`agent`-type methods, as codex's `chatgpt`) and the draft
//! `auth/status`, through the gateway: a device login's URL and code reach the user who asked
//! while `authenticate` runs (from the agent's stderr and from a notification of its own), and
//! nobody else; the rest of stderr stays in the logs; a refusal comes back verbatim; the completed
//! login shows in `/api/agents` for that user only and goes with sign-out. Real gateway, real
//! agent processes, both databases.

use crate::common;

use std::path::Path;

use acp_gateway::infra::config::{AgentConfig, Config, SandboxMode};
use common::{Client, Db, TestGateway};
use reqwest::StatusCode;
use serde_json::{Value, json};

const KEYS_AGENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/keys_agent.py");
const TERMINAL_AGENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/terminal_login_agent.py");
const PROGRESS: &str = "_gateway/authenticate/progress";

fn agent(script: &'static str) -> impl FnOnce(&mut Config) {
    move |c: &mut Config| {
        c.agents.insert(
            "default".into(),
            AgentConfig {
                command: "/usr/bin/python3".into(),
                args: vec![script.into()],
                sandbox: SandboxMode::Auto,
                ..Default::default()
            },
        );
    }
}

fn is_progress(m: &Value) -> bool {
    m["method"] == PROGRESS
}

/// The progress notes in `client`'s inbox (taken out of it).
async fn progress_seen(client: &mut Client) -> Vec<Value> {
    // A request answered after everything sent before it: the inbox then holds all of those.
    client.request("session/list", json!({})).await;
    let mut notes = Vec::new();
    while let Some(pos) = client.inbox.iter().position(is_progress) {
        notes.push(client.inbox.remove(pos).expect("present")["params"].clone());
    }
    notes
}

fn approve(dir: &Path, user: &str) {
    std::fs::write(dir.join("homes").join(user).join("device-approved"), "yes").expect("approve");
}

async fn a_device_login_shows_its_code_to_its_user_only(db: Db) {
    let gw = TestGateway::start(db, agent(KEYS_AGENT)).await;
    let dir = gw.dir().path().canonicalize().expect("data dir");
    let mut alice = gw.client("alice").await;
    let mut bob = gw.client("bob").await;

    // A refusal is the agent's, verbatim.
    let r = alice.request("authenticate", json!({"methodId": "sso"})).await;
    assert_eq!(r["error"]["code"], -32000, "{r}");
    assert_eq!(r["error"]["message"], "SSO is not enabled for this workspace", "{r}");

    // The device login: its URL and code arrive while it waits for the person.
    let id = alice.start("authenticate", json!({"methodId": "chatgpt"})).await;
    let from_stderr = alice
        .wait_for(|m| is_progress(m) && m["params"]["source"] == "stderr")
        .await;
    assert_eq!(
        from_stderr["params"],
        json!({"source": "stderr", "methodId": "chatgpt",
               "text": "Open https://auth.example.test/device and enter code WXYZ-1234",
               "url": "https://auth.example.test/device"}),
    );
    let from_agent = alice
        .wait_for(|m| is_progress(m) && m["params"]["source"] == "notification")
        .await;
    assert_eq!(from_agent["params"]["method"], "_keys_agent/device_code");
    assert_eq!(from_agent["params"]["params"]["userCode"], "WXYZ-1234");
    assert_eq!(from_agent["params"]["url"], "https://auth.example.test/device");
    approve(&dir, "alice");
    let r = alice.answer(id).await;
    assert_eq!(r["result"], json!({}), "{r}");
    // Nothing else of stderr (the agent's debug line) reached the client.
    let rest = progress_seen(&mut alice).await;
    assert!(rest.is_empty(), "{rest:?}");
    assert!(progress_seen(&mut bob).await.is_empty(), "bob saw none of it");

    // The login works, is alice's, and shows in /api/agents for her only.
    let session = alice.new_session().await;
    let r = alice.prompt(&session, "hello").await;
    assert!(r.get("result").is_some(), "{r}");
    let said: String = alice
        .take_updates(&session)
        .iter()
        .filter(|u| u["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|u| u["params"]["update"]["content"]["text"].as_str().map(String::from))
        .collect();
    assert_eq!(said, "signed in with ChatGPT");
    let mine = gw.api(Some("alice"), reqwest::Method::GET, "/api/agents").await.1;
    assert_eq!(mine["agents"][0]["login"]["methodId"], "chatgpt", "{mine}");
    assert!(mine["agents"][0]["login"]["signedInAt"].as_str().is_some(), "{mine}");
    let theirs = gw.api(Some("bob"), reqwest::Method::GET, "/api/agents").await.1;
    assert_eq!(theirs["agents"][0]["login"], Value::Null, "{theirs}");
    let bobs = bob.new_session().await;
    assert_eq!(bob.prompt(&bobs, "hello").await["error"]["code"], -32000);

    // Sign-out: the agent's logout runs and the record goes.
    let status = reqwest::Client::new()
        .delete(gw.http_url("/api/agents/default/keys"))
        .bearer_auth(gw.token("alice"))
        .send()
        .await
        .expect("request")
        .status();
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        gw.api(Some("alice"), reqwest::Method::GET, "/api/agents").await.1["agents"][0]["login"],
        Value::Null
    );
    assert!(dir.join("homes/alice/keys-agent-logged-out").exists());
    gw.stop().await;
}

common::both_backends!(
    a_device_login_shows_its_code_to_its_user_only_sqlite,
    a_device_login_shows_its_code_to_its_user_only_postgres,
    a_device_login_shows_its_code_to_its_user_only
);

/// The draft `auth/status` goes to the caller's own process: alice's answer changes with her
/// login, bob's does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_status_is_asked_of_the_callers_own_agent() {
    let gw = TestGateway::start(Db::Sqlite, agent(TERMINAL_AGENT)).await;
    let dir = gw.dir().path().canonicalize().expect("data dir");
    let mut alice = gw.client("alice").await;
    let mut bob = gw.client("bob").await;
    let r = alice.request("auth/status", json!({})).await;
    assert_eq!(r["result"]["authenticated"], false, "{r}");
    std::fs::write(dir.join("homes/alice/.login-ok"), "code").expect("login");
    let r = alice.request("auth/status", json!({})).await;
    assert_eq!(
        r["result"],
        json!({"authenticated": true, "message": "logged in"}),
        "{r}"
    );
    let r = bob.request("auth/status", json!({})).await;
    assert_eq!(r["result"]["authenticated"], false, "{r}");
    let r = alice.request("auth/status", json!([1])).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    gw.stop().await;
}
