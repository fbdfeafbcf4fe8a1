//! The benchmark's clients: newline-delimited JSON over a child's stdio, or text frames over a
//! WebSocket (the gateway's `/acp`, or websocketd in front of the same agent), and the JSON-RPC
//! logic they share.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// Any single step of the benchmark that takes longer than this is a failure.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(300);

/// The demo agent's arguments on every path: no delay, one reply chunk unless asked.
pub fn agent_args() -> Vec<String> {
    ["demo-agent", "--delay-us", "0", "--chunks", "1"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

pub fn gateway_bin() -> &'static str {
    env!("CARGO_BIN_EXE_acp-gateway")
}

/// The demo agent as a child process of its own, stdin and stdout piped, killed when dropped.
pub fn spawn_agent() -> Result<Child> {
    Command::new(gateway_bin())
        .args(agent_args())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("spawning the demo agent")
}

/// One JSON-RPC message stream, client side.
pub trait Transport {
    /// Sends one message.
    async fn send(&mut self, msg: &str) -> Result<()>;
    /// Receives the next message, borrowed until the next call.
    async fn recv(&mut self) -> Result<&[u8]>;
}

/// The demo agent spoken to directly.
pub struct AgentPipe {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    line: Vec<u8>,
    out: Vec<u8>,
}

impl AgentPipe {
    pub fn spawn() -> Result<Self> {
        Self::of(spawn_agent()?)
    }

    /// Speaks to `child` on its stdio.
    fn of(mut child: Child) -> Result<Self> {
        let stdin = child.stdin.take().context("stdin")?;
        let stdout = BufReader::with_capacity(64 << 10, child.stdout.take().context("stdout")?);
        Ok(Self {
            child,
            stdin,
            stdout,
            line: Vec::with_capacity(4096),
            out: Vec::with_capacity(4096),
        })
    }
}

impl AgentPipe {
    /// `acp-gateway connect` to the gateway at `addr` as an editor runs it, spoken to on its
    /// stdio as the demo agent is.
    pub fn connect(addr: SocketAddr, token: &str) -> Result<Self> {
        let child = Command::new(gateway_bin())
            .args(["connect", &format!("http://{addr}"), "--token", token])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("spawning acp-gateway connect")?;
        Self::of(child)
    }
}

/// A path's client beside the gateway's own: a WebSocket (the relay, websocketd), a child's
/// stdio (`acp-gateway connect`), or Streamable HTTP to the gateway.
pub enum Peer {
    Ws(WsClient),
    Pipe(AgentPipe),
    Http(crate::http_peer::HttpPeer),
}

impl Transport for Peer {
    async fn send(&mut self, msg: &str) -> Result<()> {
        match self {
            Peer::Ws(w) => w.send(msg).await,
            Peer::Pipe(p) => p.send(msg).await,
            Peer::Http(h) => h.send(msg).await,
        }
    }

    async fn recv(&mut self) -> Result<&[u8]> {
        match self {
            Peer::Ws(w) => w.recv().await,
            Peer::Pipe(p) => p.recv().await,
            Peer::Http(h) => h.recv().await,
        }
    }
}

impl Drop for AgentPipe {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

impl Transport for AgentPipe {
    async fn send(&mut self, msg: &str) -> Result<()> {
        self.out.clear();
        self.out.extend_from_slice(msg.as_bytes());
        self.out.push(b'\n');
        self.stdin.write_all(&self.out).await?;
        self.stdin.flush().await?;
        Ok(())
    }

    async fn recv(&mut self) -> Result<&[u8]> {
        self.line.clear();
        let n = self.stdout.read_until(b'\n', &mut self.line).await?;
        if n == 0 {
            bail!("agent closed its stdout");
        }
        if self.line.last() == Some(&b'\n') {
            self.line.pop();
        }
        Ok(&self.line)
    }
}

type Ws = WebSocketStream<TcpStream>;

/// A WebSocket client of the gateway.
pub struct WsClient {
    ws: Ws,
    last: Option<tokio_tungstenite::tungstenite::Utf8Bytes>,
}

impl WsClient {
    /// Connects to `ws://addr{path}`, with `Authorization: Bearer token` if given.
    pub async fn connect(addr: SocketAddr, path: &str, token: Option<&str>) -> Result<Self> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let mut req = format!("ws://{addr}{path}").into_client_request()?;
        if let Some(token) = token {
            req.headers_mut()
                .insert("authorization", format!("Bearer {token}").parse()?);
        }
        let (ws, resp) = tokio_tungstenite::client_async(req, tcp)
            .await
            .context("WebSocket handshake")?;
        if resp.status().as_u16() != 101 {
            bail!("upgrade answered {}", resp.status());
        }
        Ok(Self { ws, last: None })
    }
}

impl Transport for WsClient {
    async fn send(&mut self, msg: &str) -> Result<()> {
        self.ws.send(Message::text(msg)).await?;
        Ok(())
    }

    async fn recv(&mut self) -> Result<&[u8]> {
        loop {
            match self.ws.next().await {
                Some(Ok(Message::Text(t))) => {
                    self.last = Some(t);
                    break;
                }
                Some(Ok(Message::Close(c))) => bail!("gateway closed the connection: {c:?}"),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => bail!("connection ended"),
            }
        }
        Ok(self.last.as_ref().map(|t| t.as_str().as_bytes()).unwrap_or_default())
    }
}

// The client logic, shared by every transport.

/// What kind of message a line is, decided cheaply: notifications (every update) are recognised
/// by their prefix without parsing; anything else is parsed.
enum Msg {
    Notification,
    Response(Value),
    Other(Value),
}

const NOTIFICATION_PREFIX: &[u8] = br#"{"jsonrpc":"2.0","method":"#;

fn classify(bytes: &[u8]) -> Result<Msg> {
    if bytes.starts_with(NOTIFICATION_PREFIX) {
        return Ok(Msg::Notification);
    }
    let v: Value =
        serde_json::from_slice(bytes).with_context(|| format!("not JSON: {}", String::from_utf8_lossy(bytes)))?;
    Ok(match (v.get("method"), v.get("id")) {
        (None, Some(_)) => Msg::Response(v),
        (Some(_), None) => Msg::Notification,
        _ => Msg::Other(v),
    })
}

pub struct Rpc<T> {
    pub t: T,
    next_id: u64,
    /// A copy of the last notification seen (for the final `seq` check).
    pub last_note: Vec<u8>,
    pub keep_last: bool,
}

impl<T: Transport> Rpc<T> {
    pub fn new(t: T) -> Self {
        Self {
            t,
            next_id: 1,
            last_note: Vec::new(),
            keep_last: false,
        }
    }

    /// Sends a request; returns (its answer, notifications received meanwhile, round-trip time).
    pub async fn call(&mut self, method: &str, params: Value) -> Result<(Value, u64, Duration)> {
        let id = self.next_id;
        self.next_id += 1;
        let text = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
        let started = Instant::now();
        self.t.send(&text).await?;
        let mut notes = 0u64;
        loop {
            let bytes = self.t.recv().await?;
            match classify(bytes)? {
                Msg::Notification => {
                    notes += 1;
                    if self.keep_last {
                        self.last_note.clear();
                        self.last_note.extend_from_slice(bytes);
                    }
                }
                Msg::Response(v) if v["id"] == json!(id) => {
                    let elapsed = started.elapsed();
                    if let Some(e) = v.get("error") {
                        bail!("{method} failed: {e}");
                    }
                    return Ok((v, notes, elapsed));
                }
                Msg::Response(v) => bail!("unexpected response while waiting for {id}: {v}"),
                Msg::Other(v) => bail!("unexpected message (an agent request?): {v}"),
            }
        }
    }

    pub async fn call_timed(&mut self, method: &str, params: Value) -> Result<(Value, u64, Duration)> {
        tokio::time::timeout(STEP_TIMEOUT, self.call(method, params))
            .await
            .map_err(|_| anyhow!("{method} timed out"))?
    }

    pub async fn setup(&mut self) -> Result<String> {
        let (init, _, _) = self
            .call_timed("initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}))
            .await?;
        // The gateway names the user's workspace root; the bare agent takes any directory.
        let cwd = init["result"]["_meta"]["gateway"]["workspaceRoots"][0]
            .as_str()
            .unwrap_or("/tmp")
            .to_string();
        let (v, _, _) = self
            .call_timed("session/new", json!({"cwd": cwd, "mcpServers": []}))
            .await?;
        v["result"]["sessionId"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("session/new: {v}"))
    }

    pub fn prompt_params(session: &str, text: &str) -> Value {
        json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]})
    }

    /// One `[chunks=1]` prompt; returns its round trip.
    pub async fn small_prompt(&mut self, session: &str, extras: u64) -> Result<Duration> {
        let (v, notes, rt) = self
            .call_timed("session/prompt", Self::prompt_params(session, "ping [chunks=1]"))
            .await?;
        if v["result"]["stopReason"] != "end_turn" {
            bail!("prompt answered {v}");
        }
        if notes != 1 + extras {
            bail!(
                "MISMATCH: a [chunks=1] prompt brought {notes} updates, expected {}",
                1 + extras
            );
        }
        Ok(rt)
    }
}

/// websocketd (a Go program that runs a command per WebSocket connection and bridges its stdio
/// line by line, storing nothing) in front of the same demo agent: the peer the gateway is
/// measured against. `None` when it is not installed.
pub struct Websocketd {
    child: Child,
    pub addr: SocketAddr,
}

impl Websocketd {
    pub async fn start() -> Result<Option<Self>> {
        let Ok(path) = which("websocketd") else {
            return Ok(None);
        };
        // A free port: websocketd takes a number, not 0.
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(path)
            .arg(format!("--port={port}"))
            .arg("--address=127.0.0.1")
            .arg("--loglevel=error")
            .arg(gateway_bin())
            .args(agent_args())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("starting websocketd")?;
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
        let started = Instant::now();
        while TcpStream::connect(addr).await.is_err() {
            if started.elapsed() > Duration::from_secs(10) {
                bail!("websocketd did not listen on {addr}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Some(Self { child, addr }))
    }
}

impl Drop for Websocketd {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// `name` on `PATH`.
fn which(name: &str) -> Result<std::path::PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow!("{name} not on PATH"))
}
