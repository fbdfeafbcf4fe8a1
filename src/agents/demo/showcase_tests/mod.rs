//! The showcase driven in-process, every message checked against the ACP v1 schema crate: each
//! one must deserialize into its schema type and serialize back to the same JSON (so a field
//! the schema would silently drop, or a kind it would read as `other`, fails).

#![allow(clippy::unwrap_used)]

use std::path::Path;

use agent_client_protocol_schema::v1;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

use super::{DemoAgentOptions, serve};

mod controls;

/// Whether `typed` (a schema type serialized) says the same as `sent`: every member equal,
/// except members the schema leaves out when they hold the default (`null`, a tool call's
/// `"status": "pending"`).
fn same(typed: &Value, sent: &Value) -> bool {
    match (typed, sent) {
        (Value::Object(t), Value::Object(s)) => {
            t.keys().all(|k| s.contains_key(k))
                && s.iter().all(|(k, v)| match t.get(k) {
                    Some(tv) => same(tv, v),
                    None => v.is_null() || (k == "status" && v == "pending"),
                })
        }
        (Value::Array(t), Value::Array(s)) => t.len() == s.len() && t.iter().zip(s).all(|(t, s)| same(t, s)),
        (t, s) => t == s,
    }
}

/// `v` read as the schema type `T`, which must say exactly what `v` says.
fn schema<T: DeserializeOwned + Serialize>(v: &Value) -> T {
    let typed: T = serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}: {v}"));
    let back = serde_json::to_value(&typed).unwrap();
    assert!(same(&back, v), "schema round trip:\n{back}\n{v}");
    typed
}

/// What one prompt turn sent, in order.
#[derive(Debug, Default)]
struct TurnLog {
    /// Every `update`, in order.
    updates: Vec<Value>,
    /// The `toolCall` of each permission request.
    asked: Vec<Value>,
    /// The prompt's `result`.
    result: Value,
}

impl TurnLog {
    fn kinds(&self) -> Vec<&str> {
        self.updates
            .iter()
            .map(|u| u["sessionUpdate"].as_str().unwrap())
            .collect()
    }

    fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.updates.iter().filter(|u| u["sessionUpdate"] == kind).collect()
    }

    /// The tool call (first update) of kind `kind` and every later update of it.
    fn tool(&self, kind: &str) -> Vec<&Value> {
        let Some(call) = self
            .updates
            .iter()
            .find(|u| u["sessionUpdate"] == "tool_call" && u["kind"] == kind)
        else {
            return vec![];
        };
        self.updates
            .iter()
            .filter(|u| u["toolCallId"] == call["toolCallId"])
            .collect()
    }

    fn markdown(&self) -> String {
        self.of_kind("agent_message_chunk")
            .iter()
            .map(|u| u["content"]["text"].as_str().unwrap())
            .collect()
    }
}

/// An in-process showcase agent and its client side.
struct Agent {
    tx: tokio::io::DuplexStream,
    rx: tokio::io::Lines<BufReader<tokio::io::DuplexStream>>,
    next_id: u64,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    /// The agent's HOME (where it keeps session choices), removed with it unless shared.
    home: std::sync::Arc<tempfile::TempDir>,
}

impl Agent {
    fn start(delay_us: u64) -> Self {
        Self::start_in(delay_us, std::sync::Arc::new(tempfile::tempdir().unwrap()))
    }

    /// A showcase agent process with this HOME.
    fn start_in(delay_us: u64, home: std::sync::Arc<tempfile::TempDir>) -> Self {
        let (tx, agent_in) = tokio::io::duplex(1 << 20);
        let (agent_out, rx) = tokio::io::duplex(1 << 20);
        let opts = DemoAgentOptions {
            delay_us,
            showcase: true,
            home: Some(home.path().to_path_buf()),
            ..Default::default()
        };
        let task = tokio::spawn(serve(opts, agent_in, agent_out));
        Agent {
            tx,
            rx: BufReader::new(rx).lines(),
            next_id: 1,
            task,
            home,
        }
    }

    async fn send(&mut self, msg: &Value) {
        self.tx.write_all(format!("{msg}\n").as_bytes()).await.unwrap();
    }

    async fn recv(&mut self) -> Value {
        serde_json::from_str(&self.rx.next_line().await.unwrap().unwrap()).unwrap()
    }

    /// Sends a request; returns its id.
    async fn request(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        id
    }

    /// The next message, which must be the answer to `id`.
    async fn answer(&mut self, id: u64) -> Value {
        let m = self.recv().await;
        assert_eq!(m["id"], id, "{m}");
        m
    }

    /// The next message, which must be a `session/update` of this session; its `update`.
    async fn update(&mut self, sid: &str) -> Value {
        let mut m = self.recv().await;
        assert_eq!(m["method"], "session/update", "{m}");
        let n: v1::SessionNotification = schema(&m["params"]);
        assert_eq!(&*n.session_id.0, sid);
        m["params"]["update"].take()
    }

    /// `session/new` in `cwd`: its result, after the commands update that follows it is checked.
    async fn new_session(&mut self, cwd: &Path) -> (String, Value) {
        let id = self.request("session/new", json!({"cwd": cwd, "mcpServers": []})).await;
        let result = self.answer(id).await["result"].take();
        let typed: v1::NewSessionResponse = schema(&result);
        let sid = typed.session_id.0.to_string();
        let commands = self.update(&sid).await;
        check_commands(&commands);
        (sid, result)
    }

    /// Sends a prompt and collects the turn; permission requests get `answer` (an optionId).
    async fn prompt(&mut self, sid: &str, text: &str, answer: &str) -> TurnLog {
        let id = self
            .request(
                "session/prompt",
                json!({"sessionId": sid, "prompt": [{"type": "text", "text": text}]}),
            )
            .await;
        let mut log = TurnLog::default();
        loop {
            let mut m = self.recv().await;
            if m["method"] == "session/request_permission" {
                let req: v1::RequestPermissionRequest = schema(&m["params"]);
                assert_eq!(&*req.session_id.0, sid);
                log.asked.push(m["params"]["toolCall"].take());
                let outcome = json!({"outcome": {"outcome": "selected", "optionId": answer}});
                self.send(&json!({"jsonrpc": "2.0", "id": m["id"], "result": outcome}))
                    .await;
            } else if m["method"] == "session/update" {
                let n: v1::SessionNotification = schema(&m["params"]);
                assert_eq!(&*n.session_id.0, sid);
                log.updates.push(m["params"]["update"].take());
            } else {
                assert_eq!(m["id"], id, "{m}");
                log.result = m["result"].take();
                let _: v1::PromptResponse = schema(&log.result);
                return log;
            }
        }
    }

    async fn stop(self) {
        drop(self.tx);
        self.task.await.unwrap().unwrap();
    }
}

/// The slash commands announced after `session/new|load|resume`.
fn check_commands(update: &Value) {
    assert_eq!(update["sessionUpdate"], "available_commands_update");
    let names: Vec<&str> = update["availableCommands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["explain", "diff", "test", "plan"]);
    assert!(update["availableCommands"][0]["input"]["hint"].is_string());
}

/// A whole code-mode turn, twice: thoughts, a plan that progresses, read / edit / execute tool
/// calls, a Markdown answer in about 40 chunks, a usage update; the file is really written, and
/// the second diff starts from the first one's text.
#[tokio::test]
async fn a_turn_streams_everything_and_writes_the_file() {
    let cwd = tempfile::tempdir().unwrap();
    let file = cwd.path().join("acp-demo/hello.rs");
    let mut a = Agent::start(0);
    let (sid, _) = a.new_session(cwd.path()).await;
    let t = a.prompt(&sid, "make it friendlier", "allow").await;
    assert_eq!(t.result, json!({"stopReason": "end_turn"}));
    assert!(t.asked.is_empty(), "code mode does not ask");
    let kinds = t.kinds();
    assert_eq!(kinds.first(), Some(&"agent_thought_chunk"));
    assert_eq!(kinds.last(), Some(&"usage_update"));
    let chunks = t.of_kind("agent_message_chunk").len();
    assert_eq!(chunks, 40);

    // The plan starts at its first step and ends with every step done.
    let plans = t.of_kind("plan");
    assert!(plans.len() >= 4);
    let statuses = |p: &Value| -> Vec<String> {
        p["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["status"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(statuses(plans[0]), ["in_progress", "pending", "pending", "pending"]);
    assert_eq!(statuses(plans[plans.len() - 1]), ["completed"; 4]);

    let read = t.tool("read");
    assert_eq!(read[0]["locations"][0]["path"], json!(file));
    assert!(read[0]["locations"][0]["line"].is_u64());
    assert_eq!(read.last().unwrap()["status"], "completed");

    let edit = t.tool("edit");
    let diff = &edit.last().unwrap()["content"][0];
    assert_eq!(edit.last().unwrap()["status"], "completed");
    assert_eq!(diff["type"], "diff");
    assert_eq!(diff["path"], json!(file));
    assert!(diff["oldText"].is_null());
    let written = std::fs::read_to_string(&file).unwrap();
    assert_eq!(diff["newText"], json!(written));
    assert!(written.contains("make it friendlier"));

    let exec = t.tool("execute");
    assert_eq!(exec[0]["title"], "cargo test");
    assert_eq!(exec[0]["rawInput"]["command"], "cargo test");
    let output = exec.last().unwrap()["content"][0]["content"]["text"].as_str().unwrap();
    assert!(output.contains("\x1b[32mok\x1b[0m") && output.contains("\x1b[1m") && output.contains("\x1b[31m"));
    assert_eq!(exec.last().unwrap()["status"], "completed");

    let md = t.markdown();
    for part in [
        "## ",
        "**Demo Swift**",
        "`cargo test`",
        "](https://agentclientprotocol.com)",
        "| --- |",
        "- [x] ",
        "```rust\n",
        "You said: make it friendlier",
    ] {
        assert!(md.contains(part), "{part} in {md}");
    }
    let usage = t.of_kind("usage_update")[0];
    let first_cost = usage["cost"]["amount"].as_f64().unwrap();
    assert!(usage["used"].as_u64().unwrap() > 0 && first_cost > 0.0);

    // The second turn's diff is a real one, from the first turn's text; usage adds up.
    let t2 = a.prompt(&sid, "again [chunks=3]", "allow").await;
    let diff2 = &t2.tool("edit").last().unwrap()["content"][0];
    assert_eq!(diff2["oldText"], json!(written));
    assert_eq!(diff2["newText"], json!(std::fs::read_to_string(&file).unwrap()));
    assert_ne!(diff2["oldText"], diff2["newText"]);
    assert_eq!(t2.of_kind("agent_message_chunk").len(), 3);
    assert!(t2.of_kind("usage_update")[0]["cost"]["amount"].as_f64().unwrap() > first_cost);

    // session/load replays both turns, every kind included, then answers with the state and
    // announces the commands again.
    let id = a
        .request(
            "session/load",
            json!({"sessionId": sid, "cwd": cwd.path(), "mcpServers": []}),
        )
        .await;
    let mut replayed = Vec::new();
    loop {
        let m = a.recv().await;
        if m["id"] == id {
            let _: v1::LoadSessionResponse = schema(&m["result"]);
            assert_eq!(m["result"]["modes"]["currentModeId"], "code");
            break;
        }
        let n: v1::SessionNotification = schema(&m["params"]);
        assert_eq!(&*n.session_id.0, sid);
        replayed.push(m["params"]["update"].clone());
    }
    check_commands(&a.update(&sid).await);
    let live: Vec<&Value> = t.updates.iter().chain(&t2.updates).collect();
    let replayed_live: Vec<&Value> = replayed
        .iter()
        .filter(|u| u["sessionUpdate"] != "user_message_chunk" && u["sessionUpdate"] != "available_commands_update")
        .collect();
    assert_eq!(replayed_live, live);
    a.stop().await;
}

/// Ask mode asks before the edit and the command; a rejection fails the tool call, the turn
/// goes on and the answer says so. The words "ask me" do it in Code mode, before the edit.
#[tokio::test]
async fn ask_mode_and_the_permission_words() {
    let cwd = tempfile::tempdir().unwrap();
    let mut a = Agent::start(0);
    let (sid, _) = a.new_session(cwd.path()).await;
    let id = a
        .request("session/set_mode", json!({"sessionId": sid, "modeId": "ask"}))
        .await;
    a.answer(id).await;
    a.update(&sid).await;
    let t = a.prompt(&sid, "change it", "reject").await;
    let asked: Vec<&Value> = t.asked.iter().map(|c| &c["kind"]).collect();
    assert_eq!(asked, [&json!("edit"), &json!("execute")]);
    assert_eq!(
        t.asked[0]["content"][0]["type"], "diff",
        "the diff is shown when asking"
    );
    assert_eq!(t.tool("edit").last().unwrap()["status"], "failed");
    assert_eq!(t.tool("execute").last().unwrap()["status"], "failed");
    assert!(t.markdown().contains("rejected by you"));
    assert!(!cwd.path().join("acp-demo/hello.rs").exists());
    assert_eq!(t.result["stopReason"], "end_turn");

    let id = a
        .request("session/set_mode", json!({"sessionId": sid, "modeId": "code"}))
        .await;
    a.answer(id).await;
    a.update(&sid).await;
    let t = a.prompt(&sid, "Please ASK ME before you edit", "allow").await;
    assert_eq!(t.asked.len(), 1);
    assert_eq!(t.asked[0]["kind"], "edit");
    assert_eq!(t.tool("edit").last().unwrap()["status"], "completed");
    assert!(cwd.path().join("acp-demo/hello.rs").exists());
    let t = a.prompt(&sid, "/explain permission please", "allow").await;
    assert_eq!(t.asked.len(), 1, "a read is asked for when nothing else acts");
    assert_eq!(t.asked[0]["kind"], "read");
    a.stop().await;
}

/// A file the agent cannot write, or a link out of the cwd: the edit fails, says why, and the
/// turn carries on; nothing outside the cwd is touched.
#[tokio::test]
async fn an_unwritable_file_fails_the_edit_not_the_turn() {
    let cwd = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), cwd.path().join("acp-demo")).unwrap();
    let mut a = Agent::start(0);
    let (sid, _) = a.new_session(cwd.path()).await;
    let t = a.prompt(&sid, "try it", "allow").await;
    let edit = t.tool("edit");
    assert_eq!(edit.last().unwrap()["status"], "failed");
    let why = edit.last().unwrap()["content"][0]["content"]["text"].as_str().unwrap();
    assert!(why.contains("outside the session's cwd"), "{why}");
    assert_eq!(
        t.tool("execute").last().unwrap()["status"],
        "failed",
        "tests fail without the edit"
    );
    assert!(t.markdown().contains("**failed**"));
    assert_eq!(t.result["stopReason"], "end_turn");
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    a.stop().await;
}

/// `session/cancel` stops a paced showcase turn wherever it is.
#[tokio::test]
async fn cancel_stops_a_turn() {
    let cwd = tempfile::tempdir().unwrap();
    let mut a = Agent::start(50_000);
    let (sid, _) = a.new_session(cwd.path()).await;
    let id = a
        .request(
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": "slowly"}]}),
        )
        .await;
    // Wait until the edit tool call is out, then cancel.
    loop {
        let u = a.update(&sid).await;
        if u["kind"] == "edit" {
            break;
        }
    }
    a.send(&json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}}))
        .await;
    let answer = loop {
        let m = a.recv().await;
        if m["id"] == id {
            break m;
        }
    };
    assert_eq!(answer["result"]["stopReason"], "cancelled");
    a.stop().await;
}

/// The round-trip check catches what plain deserialization lets through.
#[test]
fn the_schema_check_bites() {
    let typo = json!({"sessionUpdate": "tool_call", "toolCallId": "c", "title": "t", "kind": "exec"});
    let typed: v1::SessionUpdate = serde_json::from_value(typo.clone()).unwrap();
    assert!(
        !same(&serde_json::to_value(typed).unwrap(), &typo),
        "kind read as `other`"
    );
    let dropped = json!({"sessionUpdate": "usage_update", "used": 1, "size": 2, "cost": {"amount": 1}});
    let typed: v1::SessionUpdate = serde_json::from_value(dropped.clone()).unwrap();
    assert!(
        !same(&serde_json::to_value(typed).unwrap(), &dropped),
        "a bad cost is dropped"
    );
}
