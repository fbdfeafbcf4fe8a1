//! The plain demo agent driven in-process, and its prompt controls.

#![allow(clippy::unwrap_used)]

use super::*;
use agent_client_protocol_schema::v1;
use tokio::io::AsyncBufReadExt;

#[test]
fn parses_controls() {
    let c = parse_controls("hi [chunks=3] [delay_us=0] [permission] [title=My Title] [hang] [crash]");
    assert_eq!(c.chunks, Some(3));
    assert_eq!(c.delay_us, Some(0));
    assert!(c.permission && c.hang && c.crash);
    assert_eq!(c.title.as_deref(), Some("My Title"));
    assert_eq!(parse_controls("plain text"), Controls::default());
}

#[test]
fn ignores_malformed_controls() {
    let c = parse_controls("[chunks=x] [delay_us=-1] [title=] [title=unterminated [chunks=5");
    assert_eq!(c, Controls::default());
    assert_eq!(parse_controls("[chunks= 12 ]").chunks, Some(12));
    assert_eq!(parse_controls("[title=é]").title.as_deref(), Some("é"));
    // An unterminated `[permission` still asks: the word alone does (issue 11).
    assert!(parse_controls("[permission").permission);
    assert!(!parse_controls("[permisson]").permission);
}

#[test]
fn words_ask_for_permission() {
    for asks in [
        "please ASK ME first",
        "Ask me.",
        "you have my Permission",
        "permissions?",
        "(permission)",
        "ask me",
    ] {
        assert!(parse_controls(asks).permission, "{asks}");
    }
    for plain in ["task me", "ask meaning", "askme", "nopermission", "ask  me", "hello"] {
        assert!(!parse_controls(plain).permission, "{plain}");
    }
}

#[test]
fn decides_permission() {
    let sel = |o: &str| json!({"result": {"outcome": {"outcome": "selected", "optionId": o}}});
    assert_eq!(decide(&sel("allow")), Decision::Allow);
    assert_eq!(decide(&sel("reject")), Decision::Reject);
    assert_eq!(
        decide(&json!({"result": {"outcome": {"outcome": "cancelled"}}})),
        Decision::Cancelled
    );
    assert_eq!(
        decide(&json!({"error": {"code": -32603, "message": "x"}})),
        Decision::Reject
    );
}

/// The client side of an in-process agent.
struct Client(
    tokio::io::DuplexStream,
    tokio::io::Lines<BufReader<tokio::io::DuplexStream>>,
);

impl Client {
    async fn send(&mut self, msg: Value) {
        self.0.write_all(format!("{msg}\n").as_bytes()).await.unwrap();
    }
    async fn recv(&mut self) -> Value {
        serde_json::from_str(&self.1.next_line().await.unwrap().unwrap()).unwrap()
    }
}

/// Drives a whole agent in-process and checks wire shapes against the schema crate.
#[tokio::test]
async fn streams_and_replays() {
    let (client_out, agent_in) = tokio::io::duplex(1 << 20);
    let (agent_out, client_in) = tokio::io::duplex(1 << 20);
    let opts = DemoAgentOptions {
        delay_us: 0,
        ..Default::default()
    };
    let task = tokio::spawn(serve(opts, agent_in, agent_out));
    let mut c = Client(client_out, BufReader::new(client_in).lines());
    c.send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}))
        .await;
    let init: v1::InitializeResponse = serde_json::from_value(c.recv().await["result"].take()).unwrap();
    let caps = init.agent_capabilities;
    assert!(caps.load_session && caps.session_capabilities.resume.is_some());
    c.0.write_all(b"not json\n").await.unwrap();
    assert_eq!(c.recv().await["error"]["code"], -32700);
    c.send(json!({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": "/", "mcpServers": []}}))
        .await;
    let sid = c.recv().await["result"]["sessionId"].as_str().unwrap().to_owned();
    let text = "hello [chunks=3] [title=T] [permission]";
    let prompt = json!([{"type": "text", "text": text}]);
    c.send(
        json!({"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": {"sessionId": sid, "prompt": prompt}}),
    )
    .await;
    let mut kinds = Vec::new();
    loop {
        let mut m = c.recv().await;
        if m["method"] == "session/request_permission" {
            let _: v1::RequestPermissionRequest = serde_json::from_value(m["params"].take()).unwrap();
            let outcome = json!({"outcome": {"outcome": "selected", "optionId": "allow"}});
            c.send(json!({"jsonrpc": "2.0", "id": m["id"], "result": outcome}))
                .await;
            kinds.push("permission".to_owned());
        } else if m["method"] == "session/update" {
            let kind = m["params"]["update"]["sessionUpdate"].as_str().unwrap().to_owned();
            if kind == "agent_message_chunk" {
                assert!(
                    m["params"]["update"]["content"]["text"]
                        .as_str()
                        .unwrap()
                        .contains("allowed")
                );
            }
            let n: v1::SessionNotification = serde_json::from_value(m["params"].take()).unwrap();
            assert_eq!(n.session_id.0.as_ref(), sid);
            kinds.push(kind);
        } else {
            assert_eq!(
                (m["id"].as_i64(), m["result"]["stopReason"].as_str()),
                (Some(3), Some("end_turn"))
            );
            break;
        }
    }
    let chunk = "agent_message_chunk";
    let expect = [
        "session_info_update",
        "plan",
        "tool_call",
        "permission",
        "tool_call_update",
        "tool_call_update",
        chunk,
        chunk,
        chunk,
    ];
    assert_eq!(kinds, expect);
    c.send(json!({"jsonrpc": "2.0", "id": 4, "method": "session/load", "params": {"sessionId": sid, "cwd": "/", "mcpServers": []}})).await;
    assert_eq!(
        c.recv().await["params"]["update"]["sessionUpdate"],
        "user_message_chunk"
    );
    for _ in 1..expect.len() {
        assert_eq!(c.recv().await["method"], "session/update");
    }
    assert_eq!(c.recv().await["id"], 4);
    drop(c);
    task.await.unwrap().unwrap();
}

/// With `--require-auth`: no session before `authenticate`, and the login is the HOME's.
#[tokio::test]
async fn requires_a_login_kept_in_home() {
    let home = tempfile::tempdir().unwrap();
    let start = || {
        let (client_out, agent_in) = tokio::io::duplex(1 << 16);
        let (agent_out, client_in) = tokio::io::duplex(1 << 16);
        let opts = DemoAgentOptions {
            require_auth: true,
            home: Some(home.path().to_path_buf()),
            ..Default::default()
        };
        let task = tokio::spawn(serve(opts, agent_in, agent_out));
        (Client(client_out, BufReader::new(client_in).lines()), task)
    };
    let rpc =
        |id: u64, method: &str, params: Value| json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let new_session = json!({"cwd": "/", "mcpServers": []});

    let (mut c, task) = start();
    c.send(rpc(1, "initialize", json!({"protocolVersion": 1}))).await;
    let mut init = c.recv().await;
    let methods = init["result"]["authMethods"].take();
    assert_eq!(methods[0]["id"], LOGIN_METHOD);
    assert_eq!(methods[0]["name"], "Demo login");
    let _: Vec<v1::AuthMethod> = serde_json::from_value(methods).unwrap();
    c.send(rpc(2, "session/new", new_session.clone())).await;
    assert_eq!(c.recv().await["error"]["code"], -32000);
    c.send(rpc(3, "authenticate", json!({"methodId": "other"}))).await;
    assert_eq!(c.recv().await["error"]["code"], -32602);
    assert!(!home.path().join(".acp-demo-agent/login").exists());
    c.send(rpc(4, "authenticate", json!({"methodId": LOGIN_METHOD}))).await;
    assert_eq!(c.recv().await["result"], json!({}));
    assert!(home.path().join(".acp-demo-agent/login").exists());
    c.send(rpc(5, "session/new", new_session.clone())).await;
    assert!(c.recv().await["result"]["sessionId"].is_string());
    drop(c);
    task.await.unwrap().unwrap();

    // A new process with the same HOME is still signed in.
    let (mut c, task) = start();
    c.send(rpc(1, "session/new", new_session)).await;
    assert!(c.recv().await["result"]["sessionId"].is_string());
    drop(c);
    task.await.unwrap().unwrap();
}
