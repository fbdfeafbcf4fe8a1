//! Issue 20, item 4: a user's own HTTP/SSE MCP servers (`/api/mcp-servers`) reach that user's
//! agent in every `session/new` (and in the restore of a session after a restart), only where the
//! agent advertises the transport, and nobody else's. Header values are stored sealed, shown by
//! name only, and come back from no route. Operators can forbid them or allow only listed hosts.
//! A real gateway, real WebSockets, and a probe agent (`tests/agents/probe_agent.py`, which
//! advertises `mcpCapabilities.http` only) that records every line it is sent; both backends.

use crate::common;

use std::path::{Path, PathBuf};

use acp_gateway::infra::config::{AgentConfig, Config};
use common::{Db, TestGateway};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const PROBE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/probe_agent.py");
const SECRET: &str = "Bearer alice-s3cret-7f3a";

fn use_probe(c: &mut Config) -> PathBuf {
    c.agents.insert(
        "default".into(),
        AgentConfig {
            command: "/usr/bin/python3".into(),
            args: vec![PROBE.into()],
            ..Default::default()
        },
    );
    c.data_dir.canonicalize().expect("data dir")
}

/// The `mcpServers` of every `session/new`, `session/load` and `session/resume` `user`'s probe
/// was sent, in order.
fn servers_sent(dir: &Path, user: &str) -> Vec<(String, Value)> {
    std::fs::read_to_string(dir.join("homes").join(user).join("probe-stdin.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("json line"))
        .filter(|m| m["params"].get("mcpServers").is_some())
        .map(|m| {
            (
                m["method"].as_str().unwrap_or_default().to_string(),
                m["params"]["mcpServers"].clone(),
            )
        })
        .collect()
}

async fn put(gw: &TestGateway, user: &str, name: &str, body: Value) -> (StatusCode, Value) {
    let res = reqwest::Client::new()
        .put(gw.http_url(&format!("/api/mcp-servers/{name}")))
        .bearer_auth(gw.token(user))
        .json(&body)
        .send()
        .await
        .expect("request");
    let status = res.status();
    (status, res.json().await.unwrap_or(Value::Null))
}

async fn scenario(db: Db) {
    let mut dir = PathBuf::new();
    let gw = TestGateway::start(db, |c| dir = use_probe(c)).await;
    let tools = json!({"type": "http", "url": "http://127.0.0.1:9/mcp", "headers": [{"name": "Authorization", "value": SECRET}]});
    assert_eq!(put(&gw, "alice", "tools", tools).await.0, StatusCode::NO_CONTENT);
    let sse = json!({"type": "sse", "url": "http://127.0.0.1:9/sse", "headers": []});
    assert_eq!(put(&gw, "alice", "events", sse).await.0, StatusCode::NO_CONTENT);

    // Listed by name, never the value; only to her.
    let (status, listed) = gw.api(Some("alice"), Method::GET, "/api/mcp-servers").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        listed["servers"],
        json!([
            {"name": "tools", "type": "http", "url": "http://127.0.0.1:9/mcp", "headers": ["Authorization"]},
            {"name": "events", "type": "sse", "url": "http://127.0.0.1:9/sse", "headers": []},
        ])
    );
    let (_, theirs) = gw.api(Some("bob"), Method::GET, "/api/mcp-servers").await;
    assert_eq!(theirs["servers"], json!([]));

    // Her new session's agent gets it (not the sse one: the agent does not take sse); a
    // client's own server of the same name wins; Bob's agent gets nothing of hers.
    let mut alice = gw.client("alice").await;
    let s1 = alice.new_session().await;
    let own = json!({"type": "http", "name": "mine", "url": "http://127.0.0.1:9/own", "headers": []});
    let r = alice
        .request("session/new", json!({"cwd": alice.root, "mcpServers": [own]}))
        .await;
    assert!(r["result"]["sessionId"].is_string(), "{r}");
    let mut bob = gw.client("bob").await;
    bob.new_session().await;
    let with_header = json!({"type": "http", "name": "tools", "url": "http://127.0.0.1:9/mcp", "headers": [{"name": "Authorization", "value": SECRET}]});
    assert_eq!(
        servers_sent(&dir, "alice"),
        [
            ("session/new".to_string(), json!([with_header])),
            ("session/new".to_string(), json!([own, with_header])),
        ]
    );
    assert_eq!(servers_sent(&dir, "bob"), [("session/new".to_string(), json!([]))]);

    // No route gives the value back; the database holds only ciphertext.
    for (user, path) in [
        ("alice", "/api/mcp-servers"),
        ("alice", "/api/sessions"),
        ("alice", "/api/agents"),
        ("alice", "/api/me"),
    ] {
        let (_, body) = gw.api(Some(user), Method::GET, path).await;
        assert!(
            !body.to_string().contains("s3cret"),
            "{path} returned the header value: {body}"
        );
    }
    let r = alice.request("session/list", json!({})).await;
    assert!(!r.to_string().contains("s3cret"), "{r}");
    let r = alice
        .request(
            "session/load",
            json!({"sessionId": s1, "cwd": alice.root, "mcpServers": []}),
        )
        .await;
    assert!(!r.to_string().contains("s3cret") && !alice.inbox.iter().any(|m| m.to_string().contains("s3cret")));
    if gw.db_url.starts_with("sqlite://") {
        for file in ["gw.db", "gw.db-wal"] {
            let bytes = std::fs::read(dir.join(file)).unwrap_or_default();
            assert!(
                !bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
                "{file} holds the header value in the clear"
            );
        }
    }

    // Edited without retyping the value: the stored one is kept.
    let moved = json!({"type": "http", "url": "http://127.0.0.1:9/v2", "headers": [{"name": "Authorization"}]});
    assert_eq!(put(&gw, "alice", "tools", moved).await.0, StatusCode::NO_CONTENT);
    alice.new_session().await;
    let last = servers_sent(&dir, "alice").pop().expect("sent");
    assert_eq!(last.1[0]["url"], "http://127.0.0.1:9/v2");
    assert_eq!(last.1[0]["headers"][0]["value"], SECRET);

    // After a restart the session is restored on a new process with her servers as they are now.
    alice.close().await;
    bob.close().await;
    let (dir_keep, url) = (gw.dir().clone(), gw.db_url.clone());
    gw.stop().await;
    let gw = TestGateway::start_in(dir_keep, Db::Url(url), |c| {
        use_probe(c);
    })
    .await;
    let mut alice = gw.client("alice").await;
    let r = alice
        .request(
            "session/load",
            json!({"sessionId": s1, "cwd": alice.root, "mcpServers": []}),
        )
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let r = alice
        .request(
            "session/prompt",
            json!({"sessionId": s1, "prompt": [{"type": "text", "text": "hi"}]}),
        )
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let restore = servers_sent(&dir, "alice").pop().expect("restored");
    assert!(
        restore.0 == "session/resume" || restore.0 == "session/load",
        "{restore:?}"
    );
    assert_eq!(restore.1[0]["name"], "tools");
    assert_eq!(restore.1[0]["headers"][0]["value"], SECRET);

    // Removed: gone from the list and from the next session.
    let (status, _) = gw.api(Some("alice"), Method::DELETE, "/api/mcp-servers/tools").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) = gw.api(Some("alice"), Method::DELETE, "/api/mcp-servers/tools").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, _) = gw.api(Some("bob"), Method::DELETE, "/api/mcp-servers/events").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "Bob cannot remove hers");
    alice.new_session().await;
    assert_eq!(servers_sent(&dir, "alice").pop().expect("sent").1, json!([]));
    let (_, listed) = gw.api(Some("alice"), Method::GET, "/api/mcp-servers").await;
    assert_eq!(listed["servers"].as_array().map(Vec::len), Some(1), "{listed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_mcp_servers_reach_only_their_sessions_and_their_headers_stay_secret_sqlite() {
    scenario(Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_mcp_servers_reach_only_their_sessions_and_their_headers_stay_secret_postgres() {
    scenario(Db::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_can_forbid_users_servers_or_allow_only_listed_hosts() {
    let gw = TestGateway::start(Db::Sqlite, |c| c.mcp.allowed_hosts = vec!["*.example.com".into()]).await;
    let body = |url: &str| json!({"type": "http", "url": url, "headers": []});
    assert_eq!(
        put(&gw, "alice", "ok", body("https://mcp.example.com/mcp")).await.0,
        StatusCode::NO_CONTENT
    );
    let (status, refused) = put(&gw, "alice", "internal", body("http://169.254.169.254/")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        refused["error"]
            .as_str()
            .unwrap_or_default()
            .contains("[mcp] allowed_hosts"),
        "{refused}"
    );
    let (status, refused) = put(&gw, "alice", "creds", body("https://u:p@mcp.example.com/")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        refused["error"].as_str().unwrap_or_default().contains("header"),
        "{refused}"
    );
    let stdio = json!({"type": "stdio", "url": "https://mcp.example.com/", "headers": []});
    let (status, refused) = put(&gw, "alice", "cmd", stdio).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        refused["error"]
            .as_str()
            .unwrap_or_default()
            .contains("allowed_stdio_mcp"),
        "{refused}"
    );
    let (status, _) = gw.api(None, Method::GET, "/api/mcp-servers").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    gw.stop().await;

    let off = TestGateway::start(Db::Sqlite, |c| c.mcp.user_servers = false).await;
    let (status, refused) = put(&off, "alice", "ok", body("https://mcp.example.com/")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(
        refused["error"]
            .as_str()
            .unwrap_or_default()
            .contains("user_servers = false"),
        "{refused}"
    );
    let (_, listed) = off.api(Some("alice"), Method::GET, "/api/mcp-servers").await;
    assert_eq!(listed["enabled"], false);
}
