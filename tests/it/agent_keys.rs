//! Signing an agent in with a user's own key (its `env_var` methods, as codex-acp has): the value
//! reaches only that user's processes of that agent, is sealed in the database, is never returned
//! by a route, goes with sign-out, and a gateway with another secrets key says so instead of
//! handing the agent garbage. Real gateway, real agent processes, real HTTP and WebSocket clients,
//! both databases.

use crate::common;

use std::path::Path;

use acp_gateway::infra::config::{AgentConfig, Config, SandboxMode};
use common::{Client, Db, TestGateway};
use reqwest::StatusCode;
use serde_json::{Value, json};

const KEYS_AGENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/keys_agent.py");
const ALICE_KEY: &str = "sk-alice-very-secret-value-7421";

fn keys_agent(c: &mut Config) {
    c.agents.insert(
        "default".into(),
        AgentConfig {
            command: "/usr/bin/python3".into(),
            args: vec![KEYS_AGENT.into()],
            sandbox: SandboxMode::Auto,
            ..Default::default()
        },
    );
}

async fn put_keys(gw: &TestGateway, user: &str, agent: &str, body: Value) -> (StatusCode, Value) {
    let res = reqwest::Client::new()
        .put(gw.http_url(&format!("/api/agents/{agent}/keys")))
        .bearer_auth(gw.token(user))
        .json(&body)
        .send()
        .await
        .expect("request");
    let status = res.status();
    (status, res.json().await.unwrap_or(Value::Null))
}

async fn sign_out(gw: &TestGateway, user: &str) -> StatusCode {
    reqwest::Client::new()
        .delete(gw.http_url("/api/agents/default/keys"))
        .bearer_auth(gw.token(user))
        .send()
        .await
        .expect("request")
        .status()
}

/// `/api/agents` as `user`, as text (so a value anywhere in it would show).
async fn agents_text(gw: &TestGateway, user: &str) -> String {
    reqwest::Client::new()
        .get(gw.http_url("/api/agents"))
        .bearer_auth(gw.token(user))
        .send()
        .await
        .expect("request")
        .text()
        .await
        .expect("body")
}

/// What `user`'s newest keys-agent process was given (the key's last four characters).
fn agent_saw(dir: &Path, user: &str) -> Value {
    let file = dir.join("homes").join(user).join("keys-agent-env.json");
    serde_json::from_str(&std::fs::read_to_string(file).expect("the agent's report")).expect("json")
}

async fn prompt_text(client: &mut Client, session: &str) -> Result<String, Value> {
    let r = client.prompt(session, "hello").await;
    if r.get("error").is_some() {
        return Err(r["error"].clone());
    }
    let updates = client.take_updates(session);
    Ok(updates
        .iter()
        .filter_map(|u| u["params"]["update"]["content"]["text"].as_str())
        .collect())
}

async fn a_users_key_reaches_only_their_agent(db: Db) {
    let gw = TestGateway::start(db, keys_agent).await;
    let dir = gw.dir().path().canonicalize().expect("data dir");
    let mut alice = gw.client("alice").await;
    let session = alice.new_session().await;
    let refused = prompt_text(&mut alice, &session).await.expect_err("not signed in");
    assert_eq!(refused["code"], -32000, "{refused}");

    // Refusals name what is wrong and store nothing.
    let (status, body) = put_keys(
        &gw,
        "alice",
        "default",
        json!({"methodId": "openai-key", "vars": {"PATH": "/x"}}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error"].as_str().unwrap_or_default().contains("OPENAI_API_KEY"),
        "{body}"
    );
    let (status, body) = put_keys(
        &gw,
        "alice",
        "default",
        json!({"methodId": "chatgpt", "vars": {"OPENAI_API_KEY": "x"}}),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "an agent-type method takes no keys: {body}"
    );
    let (status, _) = put_keys(
        &gw,
        "alice",
        "nope",
        json!({"methodId": "openai-key", "vars": {"OPENAI_API_KEY": "x"}}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (status, body) = put_keys(
        &gw,
        "alice",
        "default",
        json!({"methodId": "openai-key", "vars": {"OPENAI_API_KEY": ALICE_KEY}}),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    // The same session, on a new process that has the key.
    let text = prompt_text(&mut alice, &session).await.expect("signed in now");
    assert!(text.contains("7421"), "{text}");
    assert_eq!(agent_saw(&dir, "alice")["OPENAI_API_KEY"], "7421");

    // Bob's agent has no key, and nothing of alice's shows to him.
    let mut bob = gw.client("bob").await;
    let bobs = bob.new_session().await;
    assert_eq!(prompt_text(&mut bob, &bobs).await.expect_err("bob")["code"], -32000);
    assert_eq!(agent_saw(&dir, "bob")["OPENAI_API_KEY"], Value::Null);
    let listed: Value = serde_json::from_str(&agents_text(&gw, "bob").await).expect("json");
    assert_eq!(listed["agents"][0]["keys"], json!([]), "{listed}");

    // Alice sees the name and when, never the value; neither does the database hold it.
    let text = agents_text(&gw, "alice").await;
    assert!(!text.contains(ALICE_KEY) && !text.contains("very-secret"), "{text}");
    let listed: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(listed["agents"][0]["keys"][0]["name"], "OPENAI_API_KEY", "{listed}");
    assert!(
        listed["agents"][0]["keys"][0]["updatedAt"].as_i64().is_some(),
        "{listed}"
    );
    assert_eq!(listed["agents"][0]["userKeys"], true);
    assert_eq!(stored_plaintext(&gw).await, 0, "the database holds only ciphertext");

    // Sign-out: the agent's own logout runs in alice's process, the key is gone, and the agent
    // no longer has it.
    assert_eq!(sign_out(&gw, "alice").await, StatusCode::NO_CONTENT);
    assert!(
        dir.join("homes/alice/keys-agent-logged-out").exists(),
        "the agent's logout ran"
    );
    assert!(!dir.join("homes/bob/keys-agent-logged-out").exists());
    assert_eq!(
        prompt_text(&mut alice, &session).await.expect_err("signed out")["code"],
        -32000
    );
    assert_eq!(agent_saw(&dir, "alice")["OPENAI_API_KEY"], Value::Null);
    gw.stop().await;
}

common::both_backends!(
    a_users_key_reaches_only_their_agent_sqlite,
    a_users_key_reaches_only_their_agent_postgres,
    a_users_key_reaches_only_their_agent
);

/// Rows (SQLite: file bytes) of the database that hold the plaintext key.
async fn stored_plaintext(gw: &TestGateway) -> usize {
    if gw.db_url.starts_with("sqlite") {
        let file = gw.db_url.trim_start_matches("sqlite://");
        ["", "-wal"]
            .iter()
            .filter_map(|suffix| std::fs::read(format!("{file}{suffix}")).ok())
            .filter(|bytes| bytes.windows(ALICE_KEY.len()).any(|w| w == ALICE_KEY.as_bytes()))
            .count()
    } else {
        use sqlx::Connection;
        let mut db = sqlx::PgConnection::connect(&gw.db_url).await.expect("db");
        let rows: Vec<String> = sqlx::query_scalar("SELECT CAST(u.* AS text) FROM user_secrets u")
            .fetch_all(&mut db)
            .await
            .expect("rows");
        assert_eq!(rows.len(), 1, "one key stored");
        rows.iter().filter(|r| r.contains(ALICE_KEY)).count()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_stored_under_another_secrets_key_fail_clearly() {
    let dir = common::DataDir::new();
    let gw = TestGateway::start_in(dir.clone(), Db::Sqlite, keys_agent).await;
    let (status, _) = put_keys(
        &gw,
        "alice",
        "default",
        json!({"methodId": "openai-key", "vars": {"OPENAI_API_KEY": ALICE_KEY}}),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let db = Db::Url(gw.db_url.clone());
    gw.stop().await;
    let other = "b3RoZXItc2VjcmV0cy1rZXktMDEyMzQ1Njc4OWFiY2Q=";
    let gw = TestGateway::start_in(dir, db, |c| {
        keys_agent(c);
        c.secrets_key = Some(other.to_string().into());
    })
    .await;
    // The user's process is started at `initialize`: that is where it says why it cannot be.
    let mut alice = Client::connect(&gw.ws_url(), &gw.token("alice"))
        .await
        .expect("connect");
    let r = alice.request("initialize", json!({"protocolVersion": 1})).await;
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("OPENAI_API_KEY")
            && message.contains("another secrets key")
            && message.contains("ACP_GATEWAY_SECRETS_KEY"),
        "{r}"
    );
    assert!(!message.contains(ALICE_KEY));
    // Signing out still works, and then the agent starts (without a key).
    assert_eq!(sign_out(&gw, "alice").await, StatusCode::NO_CONTENT);
    let mut alice = gw.client("alice").await;
    let session = alice.new_session().await;
    assert_eq!(
        prompt_text(&mut alice, &session).await.expect_err("no key")["code"],
        -32000
    );
    gw.stop().await;
}
