//! Test harness: a real gateway on port 0 with a real database and real agent processes, and a
//! real WebSocket client. Every wait is on an event, with a timeout.

#![allow(dead_code, reason = "each test binary uses a different part of the harness")]

pub mod data_dir;
pub mod fixtures;
pub mod http_acp;
pub mod oidc_provider;
pub mod pg;
pub mod procfs;
pub mod serve_process;
pub mod slow_client;
pub mod tcp_proxy;

/// Defines a test per backend, each calling `$body(Db)`: one on a SQLite file, one on Postgres.
#[allow(unused_macros, reason = "only the backend-parametrized test binaries use it")]
macro_rules! both_backends {
    ($sqlite:ident, $postgres:ident, $body:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $sqlite() {
            $body(Db::Sqlite).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $postgres() {
            $body(Db::Postgres).await;
        }
    };
}
#[allow(unused_imports, reason = "only the backend-parametrized test binaries use it")]
pub(crate) use both_backends;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use acp_gateway::app::{Application, Gateway};
use acp_gateway::infra::config::{AgentConfig, CliOverrides, Config, DEFAULT_AGENT};
pub use data_dir::DataDir;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// How long any single expected event may take.
pub const WAIT: Duration = Duration::from_secs(20);

/// The HS256 secret test gateways use.
pub const SECRET: &str = "test-secret-0123456789-0123456789";

/// Path of the gateway binary (its `demo-agent` is the default agent).
pub fn gateway_bin() -> String {
    env!("CARGO_BIN_EXE_acp-gateway").to_string()
}

/// Which database a test gateway uses.
#[derive(Debug, Clone)]
pub enum Db {
    /// A fresh SQLite file in the gateway's temp dir.
    Sqlite,
    /// A fresh Postgres database.
    Postgres,
    /// This exact URL (to restart a gateway on the same database).
    Url(String),
}

/// A configuration for tests: port 0, fresh database, demo agent with no delay.
pub fn test_config(dir: &std::path::Path, db_url: &str) -> Config {
    let mut config = Config::load_with_env(&CliOverrides::default(), |_| None).expect("default config");
    config.listen = "127.0.0.1:0".parse().expect("addr");
    config.database_url = db_url.to_string();
    config.data_dir = dir.to_path_buf();
    config.jwt.secret = Some(SECRET.to_string().into());
    config.limits.ping_interval_secs = 5;
    let demo = config.agents.get_mut(DEFAULT_AGENT).expect("default agent");
    demo.command = gateway_bin();
    demo.args = vec![
        "demo-agent".into(),
        "--delay-us".into(),
        "0".into(),
        "--chunks".into(),
        "3".into(),
    ];
    config
}

/// An agent config running `command args...`.
pub fn agent(command: &str, args: &[&str]) -> AgentConfig {
    AgentConfig {
        command: command.into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    }
}

/// A running gateway.
pub struct TestGateway {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its state.
    pub gw: Gateway,
    /// Its database URL.
    pub db_url: String,
    /// Stops it.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// Its serve task.
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    /// Its data dir (kept alive with it; [`TestGateway::dir`]).
    dir: Arc<DataDir>,
}

impl TestGateway {
    /// Starts a gateway; `tweak` edits the config first.
    pub async fn start(db: Db, tweak: impl FnOnce(&mut Config)) -> Self {
        Self::start_in(DataDir::new(), db, tweak).await
    }

    /// Starts a gateway in an existing directory.
    pub async fn start_in(dir: Arc<DataDir>, db: Db, tweak: impl FnOnce(&mut Config)) -> Self {
        if std::env::var_os("TEST_LOG").is_some() {
            acp_gateway::infra::telemetry::init_logs("info");
        }
        let db_url = match db {
            Db::Sqlite => format!("sqlite://{}/gw.db", dir.path().display()),
            Db::Postgres => pg::fresh_database().await,
            Db::Url(u) => u,
        };
        let mut config = test_config(dir.path(), &db_url);
        config.request_database_url = pg::request_url(&db_url).await;
        tweak(&mut config);
        let app = Application::build(config).await.expect("gateway builds");
        let addr = app.local_addr();
        let gw = app.gateway().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(app.run_until_stopped(async move {
            let _ = stopped.await;
        }));
        Self {
            addr,
            gw,
            db_url,
            stop: Some(stop),
            task: Some(task),
            dir,
        }
    }

    /// Its data directory.
    pub fn dir(&self) -> &Arc<DataDir> {
        &self.dir
    }

    /// A token for `user`.
    pub fn token(&self, user: &str) -> String {
        self.gw.identity.auth.mint(user, 3600).expect("mint")
    }

    /// `ws://.../acp`.
    pub fn ws_url(&self) -> String {
        format!("ws://{}/acp", self.addr)
    }

    /// `http://...`.
    pub fn http_url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// `method path` on the REST API, as `user` (a bearer token) or nobody: the status and the
    /// JSON body (`null` when there is none).
    pub async fn api(&self, user: Option<&str>, method: reqwest::Method, path: &str) -> (reqwest::StatusCode, Value) {
        let mut req = reqwest::Client::new().request(method, self.http_url(path));
        if let Some(user) = user {
            req = req.bearer_auth(self.token(user));
        }
        let res = req.send().await.expect("request");
        let status = res.status();
        (status, res.json().await.unwrap_or(Value::Null))
    }

    /// Connects and initializes a client for `user`.
    pub async fn client(&self, user: &str) -> Client {
        let mut c = Client::connect(&self.ws_url(), &self.token(user))
            .await
            .expect("connects");
        c.initialize().await;
        c
    }

    /// Stops it gracefully and waits.
    pub async fn stop(mut self) {
        self.shutdown().await;
    }

    async fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(30), task)
                .await
                .expect("gateway stops in time")
                .expect("join")
                .expect("clean stop");
        }
    }
}

impl Drop for TestGateway {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A raw ACP-over-WebSocket client that keeps every message it receives.
pub struct Client {
    /// The socket.
    ws: Ws,
    /// Next request id.
    next_id: u64,
    /// Messages received that were not the awaited answer, in order.
    pub inbox: std::collections::VecDeque<Value>,
    /// The 101's `Acp-Connection-Id`.
    pub connection_id: Option<String>,
    /// The user's first workspace root, from `initialize` (`_meta.gateway.workspaceRoots`).
    pub root: String,
}

impl Client {
    /// Connects with `Authorization: Bearer`.
    pub async fn connect(url: &str, token: &str) -> Result<Self, tokio_tungstenite::tungstenite::Error> {
        let mut req = url.into_client_request()?;
        req.headers_mut()
            .insert("authorization", format!("Bearer {token}").parse().expect("header"));
        Self::connect_request(req).await
    }

    /// Connects with a prepared request.
    pub async fn connect_request(
        req: tokio_tungstenite::tungstenite::handshake::client::Request,
    ) -> Result<Self, tokio_tungstenite::tungstenite::Error> {
        let (ws, resp) = tokio_tungstenite::connect_async(req).await?;
        let connection_id = resp
            .headers()
            .get("acp-connection-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        Ok(Self {
            ws,
            next_id: 0,
            inbox: Default::default(),
            connection_id,
            root: String::new(),
        })
    }

    /// Sends `initialize`, checks it succeeded, and notes the user's workspace root.
    pub async fn initialize(&mut self) -> Value {
        let init = self
            .request("initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}))
            .await;
        assert!(init.get("result").is_some(), "initialize failed: {init}");
        self.root = init["result"]["_meta"]["gateway"]["workspaceRoots"][0]
            .as_str()
            .unwrap_or_else(|| panic!("initialize names no workspace root: {init}"))
            .to_string();
        init
    }

    /// Sends raw text.
    pub async fn send_text(&mut self, text: &str) {
        self.ws.send(Message::text(text)).await.expect("send");
    }

    /// Sends a binary frame.
    pub async fn send_binary(&mut self, data: Vec<u8>) {
        self.ws.send(Message::binary(data)).await.expect("send");
    }

    /// Sends any WebSocket message as it is (a raw frame, say, to send what a well-behaved
    /// client never would).
    pub async fn send_message(&mut self, msg: Message) {
        self.ws.send(msg).await.expect("send");
    }

    /// Sends a message.
    pub async fn send(&mut self, msg: Value) {
        self.send_text(&msg.to_string()).await;
    }

    /// Receives the next raw frame, or `None` when the socket ended.
    pub async fn recv_frame(&mut self) -> Option<Message> {
        tokio::time::timeout(WAIT, self.ws.next())
            .await
            .expect("a frame in time")
            .and_then(Result::ok)
    }

    /// Receives the next JSON message (skipping pings), or `None` when the socket closed.
    pub async fn recv_raw(&mut self) -> Option<Value> {
        loop {
            let msg = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("a message in time")?;
            match msg {
                Ok(Message::Text(t)) => {
                    return Some(serde_json::from_str(&t).expect("server sends JSON"));
                }
                Ok(Message::Close(_)) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    /// The next message: from the inbox first, then the socket.
    pub async fn next(&mut self) -> Value {
        if let Some(v) = self.inbox.pop_front() {
            return v;
        }
        self.recv_raw().await.expect("socket open")
    }

    /// Sends a request and waits for its answer; everything else received meanwhile goes to the inbox.
    pub async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.start(method, params).await;
        self.answer(id).await
    }

    /// Sends a request and returns its id.
    pub async fn start(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        id
    }

    /// Waits for the answer to request `id`.
    pub async fn answer(&mut self, id: u64) -> Value {
        if let Some(pos) = self.inbox.iter().position(|m| is_answer(m, id)) {
            return self.inbox.remove(pos).expect("present");
        }
        loop {
            let m = self.recv_raw().await.expect("socket open while waiting for an answer");
            if is_answer(&m, id) {
                return m;
            }
            self.inbox.push_back(m);
        }
    }

    /// Waits until a message matching `pred` arrives (checking the inbox first); returns it.
    /// Fails after [`WAIT`] twice over even while other messages keep coming.
    pub async fn wait_for(&mut self, pred: impl Fn(&Value) -> bool) -> Value {
        if let Some(pos) = self.inbox.iter().position(&pred) {
            return self.inbox.remove(pos).expect("present");
        }
        let deadline = tokio::time::Instant::now() + 2 * WAIT;
        loop {
            let m = tokio::time::timeout_at(deadline, self.recv_raw())
                .await
                .expect("the awaited message in time (others came meanwhile)")
                .expect("socket open while waiting");
            if pred(&m) {
                return m;
            }
            self.inbox.push_back(m);
        }
    }

    /// Creates a session and returns its id.
    pub async fn new_session(&mut self) -> String {
        let cwd = self.root.clone();
        let r = self.request("session/new", json!({"cwd": cwd, "mcpServers": []})).await;
        r["result"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("session/new failed: {r}"))
            .to_string()
    }

    /// `session/load`s `session` (its stored cwd is what counts; this names the user's root) and
    /// returns every update it replayed.
    pub async fn load(&mut self, session: &str) -> Vec<Value> {
        let root = self.root.clone();
        let r = self
            .request(
                "session/load",
                json!({"sessionId": session, "cwd": root, "mcpServers": []}),
            )
            .await;
        assert!(r.get("result").is_some(), "session/load: {r}");
        self.take_updates(session)
    }

    /// Sends a text prompt and waits for its answer.
    pub async fn prompt(&mut self, session: &str, text: &str) -> Value {
        self.request(
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]}),
        )
        .await
    }

    /// Takes every `session/update` in the inbox for `session`.
    pub fn take_updates(&mut self, session: &str) -> Vec<Value> {
        let (mine, rest): (Vec<Value>, Vec<Value>) = self
            .inbox
            .drain(..)
            .partition(|m| m["method"] == "session/update" && m["params"]["sessionId"] == session);
        self.inbox = rest.into();
        mine
    }

    /// Takes `session`'s updates from the inbox, then keeps reading until one of them satisfies
    /// `done`; returns them all, in arrival order.
    pub async fn updates_until(&mut self, session: &str, done: impl Fn(&Value) -> bool) -> Vec<Value> {
        let mut updates = self.take_updates(session);
        let mut finished = updates.iter().any(&done);
        while !finished {
            let m = self.recv_raw().await.expect("socket open while waiting for updates");
            if m["method"] == "session/update" && m["params"]["sessionId"] == session {
                finished = done(&m);
                updates.push(m);
            } else {
                self.inbox.push_back(m);
            }
        }
        updates
    }

    /// Closes the socket.
    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }
}

fn is_answer(m: &Value, id: u64) -> bool {
    m.get("method").is_none() && m.get("id") == Some(&json!(id))
}

/// The `_meta.gateway.seq` of an update.
pub fn seq(update: &Value) -> u64 {
    update["params"]["_meta"]["gateway"]["seq"]
        .as_u64()
        .unwrap_or_else(|| panic!("update without seq: {update}"))
}

/// Waits until `cond` holds, polling every 5 ms, for at most `limit`; how long it took, or `None`.
/// (For state with no event to wait on: counters, process tables, socket queues, fd tables.)
pub async fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> Option<Duration> {
    let start = std::time::Instant::now();
    loop {
        if cond() {
            return Some(start.elapsed());
        }
        if start.elapsed() >= limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The sum of a metric's series in this process (the in-process gateway's recorder).
pub fn metric_sum(name: &str) -> f64 {
    acp_gateway::infra::telemetry::render_metrics()
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum()
}

/// Waits, polling every 20 ms, until `cond` holds (for state with no event to wait on, like a
/// process count); panics after [`WAIT`].
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Live processes whose `argv[0]` is exactly `name` (from /proc; zombies excluded).
pub fn processes_named(name: &str) -> Vec<u32> {
    processes_matching(name)
        .into_iter()
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let zombie = stat.rsplit(')').next().is_some_and(|s| s.trim_start().starts_with('Z'));
            !zombie && cmd.split(|b| *b == 0).next() == Some(name.as_bytes())
        })
        .collect()
}

/// Processes whose command line contains `needle` (from /proc).
pub fn processes_matching(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let zombie = stat.rsplit(')').next().is_some_and(|s| s.trim_start().starts_with('Z'));
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(needle) || (zombie && needle.is_empty()) {
            out.push(pid);
        }
    }
    out
}
