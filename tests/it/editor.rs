//! `acp-gateway connect` as an editor runs it: a child process on pipes, speaking ACP on stdio,
//! to a real gateway through a TCP proxy the test cuts mid-turn.

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use crate::common::tcp_proxy::TcpProxy;
use crate::common::{Db, TestGateway, gateway_bin, seq};

/// The editor's end of `acp-gateway connect`.
struct Editor {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    /// Everything it was sent, in order.
    seen: Vec<Value>,
}

impl Editor {
    fn spawn(url: &str, token: &str, extra: &[&str]) -> Self {
        let mut child = tokio::process::Command::new(gateway_bin())
            .arg("connect")
            .arg(url)
            .args(["--token", token])
            .args(extra)
            .env("RUST_LOG", "error")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn connect");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Self {
            child,
            stdin,
            stdout,
            seen: Vec::new(),
        }
    }

    async fn send(&mut self, msg: Value) {
        self.stdin
            .write_all(format!("{msg}\n").as_bytes())
            .await
            .expect("write");
    }

    /// The next line it writes, within `limit`.
    async fn next(&mut self, limit: Duration) -> Value {
        let line = tokio::time::timeout(limit, self.stdout.next_line())
            .await
            .expect("connect wrote nothing in time")
            .expect("read")
            .expect("connect ended");
        let msg: Value = serde_json::from_str(&line).expect("a JSON line");
        self.seen.push(msg.clone());
        msg
    }

    /// Reads until the answer to `id`.
    async fn answer(&mut self, id: u64, limit: Duration) -> Value {
        let until = Instant::now() + limit;
        loop {
            let msg = self.next(until.saturating_duration_since(Instant::now())).await;
            if msg["id"] == id && msg.get("method").is_none() {
                return msg;
            }
        }
    }

    async fn request(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        self.answer(id, Duration::from_secs(20)).await
    }

    /// Initializes, opens a session in alice's root and sends it a prompt (id 2) whose answer
    /// takes a while; the session.
    async fn start_long_prompt(&mut self, gw: &TestGateway) -> String {
        self.request(0, "initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}))
            .await;
        let root = gw.dir().path().join("workspaces").join("alice");
        let new = self
            .request(1, "session/new", json!({"cwd": root, "mcpServers": []}))
            .await;
        let sid = new["result"]["sessionId"].as_str().expect("a session").to_string();
        self.send(json!({"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
            "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "a long answer"}]}}))
            .await;
        sid
    }

    /// The `seq`s of `session`'s updates it passed on, in order.
    fn seqs(&self, session: &str) -> Vec<u64> {
        self.seen
            .iter()
            .filter(|m| m["method"] == "session/update" && m["params"]["sessionId"] == session)
            .filter(|m| m["params"]["_meta"]["gateway"]["seq"].is_u64())
            .map(seq)
            .collect()
    }
}

/// A gateway whose demo agent streams a turn over about `chunks` × `delay_ms`.
pub(crate) async fn slow_gateway(chunks: u32, delay_ms: u32) -> TestGateway {
    TestGateway::start(Db::Sqlite, |c| {
        let demo = c
            .agents
            .get_mut(acp_gateway::infra::config::DEFAULT_AGENT)
            .expect("demo");
        demo.args = vec![
            "demo-agent".into(),
            "--delay-us".into(),
            (delay_ms * 1000).to_string(),
            "--chunks".into(),
            chunks.to_string(),
        ];
    })
    .await
}

#[tokio::test]
async fn an_editor_uses_its_sessions_through_connect_and_the_remote_agent_gets_no_fs_or_terminal() {
    let gw = slow_gateway(3, 0).await;
    let mut ed = Editor::spawn(&gw.http_url(""), &gw.token("alice"), &[]);
    let init = ed
        .request(
            0,
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": true, "writeTextFile": true}, "terminal": true}}),
        )
        .await;
    assert_eq!(init["result"]["agentCapabilities"]["loadSession"], true, "{init}");
    // The editor's folder is not on the gateway: the session works in the user's root instead,
    // and the editor is told.
    let new = ed
        .request(
            1,
            "session/new",
            json!({"cwd": "/home/someone/project", "mcpServers": []}),
        )
        .await;
    let sid = new["result"]["sessionId"].as_str().expect("a session").to_string();
    let told = ed.next(Duration::from_secs(5)).await;
    assert!(
        told["params"]["update"]["content"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("workspaces")),
        "{told}"
    );
    let answer = ed
        .request(
            2,
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": "hello"}]}),
        )
        .await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    // Listed from the gateway's database, as on any device.
    let list = ed.request(3, "session/list", json!({})).await;
    assert!(
        list["result"]["sessions"]
            .as_array()
            .expect("sessions")
            .iter()
            .any(|s| s["sessionId"] == sid),
        "{list}"
    );
    // Nobody asked the editor for a file or a terminal (the agent was told it has neither).
    assert!(
        !ed.seen.iter().any(|m| m["method"]
            .as_str()
            .is_some_and(|m| m.starts_with("fs/") || m.starts_with("terminal/"))),
        "the remote agent reached the editor's files"
    );
    drop(ed.stdin);
    let status = tokio::time::timeout(Duration::from_secs(10), ed.child.wait())
        .await
        .expect("exits")
        .expect("status");
    assert!(
        status.success(),
        "connect ends cleanly when the editor closes stdin: {status}"
    );
}

/// Cuts the connection mid-turn for `down`; the editor gets every update once, in order, and
/// the prompt's answer, as the store has them.
async fn cut_mid_turn(down: Duration) {
    let gw = slow_gateway(30, 100).await;
    let proxy = TcpProxy::start(gw.addr).await;
    let mut ed = Editor::spawn(&format!("http://{}", proxy.addr()), &gw.token("alice"), &[]);
    let sid = ed.start_long_prompt(&gw).await;
    // A few of the agent's updates through, then the network goes.
    while ed.seqs(&sid).len() < 4 {
        ed.next(Duration::from_secs(10)).await;
    }
    let cut_at = Instant::now();
    proxy.down_for(down);
    let answer = ed.answer(2, down + Duration::from_secs(30)).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert!(
        cut_at.elapsed() >= down,
        "answered before the gateway was reachable again"
    );

    // What the editor got is the stored transcript: every seq once, in order, none missing.
    let got = ed.seqs(&sid);
    let mut direct = gw.client("alice").await;
    let stored: Vec<u64> = direct.load(&sid).await.iter().map(seq).collect();
    assert_eq!(got, stored, "the editor's updates against the stored transcript");
    assert_eq!(got, (1..=stored.len() as u64).collect::<Vec<_>>());
    // And the session goes on over the new connection.
    let again = ed
        .request(
            3,
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": "more"}]}),
        )
        .await;
    assert_eq!(again["result"]["stopReason"], "end_turn", "{again}");
}

#[tokio::test]
async fn a_connection_cut_for_a_second_mid_turn_loses_nothing_and_the_running_prompt_is_answered() {
    // The turn (3 s) still runs when the connection is back.
    cut_mid_turn(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_connection_cut_for_five_seconds_mid_turn_loses_nothing_and_the_ended_prompt_is_answered() {
    // The turn ends while the gateway is unreachable.
    cut_mid_turn(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn past_reconnect_for_a_running_prompt_ends_with_an_error_that_says_the_connection_was_lost() {
    let gw = slow_gateway(30, 100).await;
    let proxy = TcpProxy::start(gw.addr).await;
    let mut ed = Editor::spawn(
        &format!("http://{}", proxy.addr()),
        &gw.token("alice"),
        &["--reconnect-for", "2"],
    );
    ed.start_long_prompt(&gw).await;
    ed.next(Duration::from_secs(10)).await;
    proxy.down_for(Duration::from_secs(60));
    let answer = ed.answer(2, Duration::from_secs(30)).await;
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("connection to the gateway was lost")),
        "{answer}"
    );
}

/// Runs an official SDK's client script that spawns `connect` as its agent; its `KIND json` lines.
pub(crate) async fn sdk_client(program: &str, args: &[&str]) -> Vec<(String, Value)> {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(program)
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("in time")
    .unwrap_or_else(|e| panic!("{program} runs: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter_map(|(k, v)| Some((k.to_string(), serde_json::from_str(v).ok()?)))
        .collect()
}

/// What both SDKs' clients must have seen: an initialize, a streamed prompt with a permission,
/// the new session listed, and a load replaying what was streamed.
pub(crate) fn assert_used_through_connect(lines: &[(String, Value)]) {
    let first = |kind: &str| {
        lines
            .iter()
            .find(|(k, _)| k == kind)
            .map(|(_, v)| v.clone())
            .expect(kind)
    };
    assert_eq!(first("INIT")["agentCapabilities"]["loadSession"], true);
    assert_eq!(first("RESULT")["stopReason"], "end_turn");
    assert!(
        lines.iter().any(|(k, _)| k == "PERMISSION"),
        "the permission reached the SDK client"
    );
    let lists: Vec<&Value> = lines.iter().filter(|(k, _)| k == "LIST").map(|(_, v)| v).collect();
    assert_eq!(lists.len(), 2);
    assert_eq!(lists[0]["sessions"], json!([]), "nothing before");
    assert_eq!(
        lists[1]["sessions"].as_array().expect("sessions").len(),
        1,
        "{}",
        lists[1]
    );
    let replayed = first("LOADED")["replayed"].as_u64().expect("count");
    assert!(replayed >= 4, "the transcript was replayed: {replayed}");
    // What the prompt streamed (up to its answer) is what the load replays.
    let streamed = match first("RESULT")["streamed"].as_u64() {
        Some(n) => n,
        None => lines
            .iter()
            .take_while(|(k, _)| k != "RESULT")
            .filter(|(k, _)| k == "UPDATE")
            .count() as u64,
    };
    assert_eq!(streamed, replayed, "streamed {streamed}, replayed {replayed}");
}

#[tokio::test]
async fn the_official_python_sdk_spawns_connect_as_its_agent_and_uses_the_gateway_through_it() {
    let gw = slow_gateway(3, 0).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/sdk_connect_client.py");
    let root = gw.gw.agents.tenancy.roots("alice").expect("roots")[0]
        .display()
        .to_string();
    let (bin, url, token) = (gateway_bin(), gw.http_url(""), gw.token("alice"));
    let lines = sdk_client(
        "python3",
        &[
            script,
            "--gateway-bin",
            &bin,
            "--url",
            &url,
            "--token",
            &token,
            "--cwd",
            &root,
        ],
    )
    .await;
    assert_used_through_connect(&lines);
}

#[tokio::test]
async fn the_official_typescript_sdk_spawns_connect_as_its_agent_and_uses_the_gateway_through_it() {
    let gw = slow_gateway(3, 0).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ui/sdk-connect-client.mjs");
    let root = gw.gw.agents.tenancy.roots("alice").expect("roots")[0]
        .display()
        .to_string();
    let (bin, url, token) = (gateway_bin(), gw.http_url(""), gw.token("alice"));
    let lines = sdk_client("node", &[script, &bin, &url, &token, &root]).await;
    assert_used_through_connect(&lines);
}
