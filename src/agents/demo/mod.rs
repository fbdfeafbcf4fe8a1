//! The built-in demo agent: an ACP v1 agent over stdio that needs no network.
//!
//! It is the gateway's default agent and the workload of tests and benchmarks. Wire format:
//! JSON-RPC 2.0, one message per line on stdin/stdout; diagnostics go to stderr only.
//!
//! Each `session/prompt` streams (as `session/update` notifications): an optional
//! `session_info_update` (title), a `plan`, a `tool_call` (pending), optionally a
//! `session/request_permission` round trip, `tool_call_update`s (in_progress, completed), then N
//! `agent_message_chunk`s, and answers `{"stopReason":"end_turn"}`. The first text block of the
//! prompt may carry controls, see [`Controls`]: `[chunks=N]`, `[delay_us=N]`, `[recall]` (how many
//! user message blocks the session's history holds), `[permission]`
//! (or the words "ask me" / "permission"), `[crash]`, `[hang]`, `[title=XYZ]`.
//!
//! With `--showcase` it uses every part of an ACP client instead (modes, config options, slash
//! commands, thoughts, read / edit / execute tool calls, Markdown, usage): see `showcase.rs`.
//! Parts: `controls` (what a prompt asks for), `lines` (reading input), `session`, `turn` (one
//! prompt's updates), `showcase` (its turn), `modes` (its session controls), `content` (what it
//! says and writes), `workspace` (the one file it writes, kept inside the session's cwd).
//!
//! With `--require-auth` it behaves like an agent that needs a login (`claude login`, …):
//! `initialize` advertises the `demo-login` auth method, `session/new` answers `-32000` until
//! `authenticate` with that method has written `$HOME/.acp-demo-agent/login`. The login belongs
//! to a `HOME`, so to one user, and outlives the process.
//!
//! Concurrency: every prompt runs in its own task, so sessions never block each other. A second
//! prompt on a session whose prompt is still running is *queued* (FIFO) behind it; a
//! `session/cancel` cancels every prompt of that session received before the cancel (running or
//! queued), each answering `{"stopReason":"cancelled"}`.

use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

mod content;
mod controls;
mod lines;
mod modes;
mod session;
mod showcase;
#[cfg(test)]
mod showcase_tests;
mod turn;
mod workspace;

use controls::{Controls, parse_controls};
use lines::{Line, read_line_capped};
use session::Session;
use turn::{Decision, Stop, Turn, decide};

/// Longest accepted input line; longer lines are skipped and answered with a -32700 error.
const MAX_LINE: usize = 16 << 20;
/// How many characters of the prompt are echoed in each reply chunk.
const ECHO_MAX: usize = 100;

/// Options for the demo agent, settable by flags and environment variables.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoAgentOptions {
    /// Number of agent_message_chunk updates streamed per prompt [default: 8; with --showcase,
    /// the Markdown answer is cut into about 40 pieces]
    #[arg(long, env = "ACP_DEMO_CHUNKS")]
    pub chunks: Option<u64>,
    /// Delay between updates in microseconds (0 = as fast as possible)
    #[arg(long, env = "ACP_DEMO_DELAY_US", default_value_t = 20_000)]
    pub delay_us: u64,
    /// Whether to advertise and support session/load
    #[arg(long, env = "ACP_DEMO_LOAD_SESSION", default_value_t = true, action = clap::ArgAction::Set)]
    pub load_session: bool,
    /// Whether to advertise and support the draft session/fork (a copy of the session's history)
    #[arg(long, env = "ACP_DEMO_FORK", default_value_t = true, action = clap::ArgAction::Set)]
    pub fork: bool,
    /// Refuse session/new with -32000 until `authenticate` (method `demo-login`) has signed this
    /// HOME in
    #[arg(long)]
    pub require_auth: bool,
    /// Advertise that a prompt sent while another runs is taken (claude-agent-acp's
    /// `_meta.claudeCode.promptQueueing`): the gateway then sends queued messages at once
    #[arg(long)]
    pub prompt_queueing: bool,
    /// Show off every part of an ACP client: modes, config options, slash commands, thoughts, a
    /// plan, read / edit (really writes `acp-demo/hello.rs` under the session's cwd) / execute
    /// tool calls, a Markdown answer and usage updates
    #[arg(long, env = "ACP_DEMO_SHOWCASE", value_parser = clap::builder::FalseyValueParser::new())]
    pub showcase: bool,
    /// Where the login marker lives (default: $HOME); for in-process tests
    #[arg(skip)]
    pub home: Option<PathBuf>,
}

impl Default for DemoAgentOptions {
    fn default() -> Self {
        Self {
            chunks: None,
            delay_us: 20_000,
            load_session: true,
            require_auth: false,
            prompt_queueing: false,
            fork: true,
            showcase: false,
            home: None,
        }
    }
}

/// The one auth method the demo agent offers with `--require-auth`.
const LOGIN_METHOD: &str = "demo-login";

/// Runs the demo agent on the process's stdin/stdout; returns `Ok` when stdin reaches EOF.
pub async fn run(opts: DemoAgentOptions) -> anyhow::Result<()> {
    serve(opts, tokio::io::stdin(), tokio::io::stdout()).await
}

/// Runs the demo agent on any byte streams (used by [`run`], and in-process by tests and
/// benchmarks). Returns `Ok` at EOF of `input`, `Err` if `output` fails.
pub async fn serve<R, W>(opts: DemoAgentOptions, input: R, output: W) -> anyhow::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Send + Unpin + 'static,
{
    let agent = Arc::new(Agent {
        opts,
        out: tokio::sync::Mutex::new(Box::new(output)),
        sessions: Mutex::default(),
        pending: Mutex::default(),
        next_id: AtomicU64::new(1),
    });
    let mut reader = BufReader::with_capacity(64 << 10, input);
    let mut line = Vec::new();
    let mut tasks = JoinSet::new();
    loop {
        while tasks.try_join_next().is_some() {}
        match read_line_capped(&mut reader, &mut line, MAX_LINE).await? {
            Line::Eof => break,
            Line::TooLong => {
                eprintln!("demo-agent: skipped an input line longer than {MAX_LINE} bytes");
                agent.send(&error(Value::Null, -32700, "line too long")).await?;
            }
            Line::Complete if line.iter().all(u8::is_ascii_whitespace) => {}
            Line::Complete => agent.handle(&line, &mut tasks).await?,
        }
    }
    // The client is gone: cancel every prompt and give the tasks a moment to answer.
    for session in lock(&agent.sessions).values() {
        session.cancel();
    }
    let drain = async { while tasks.join_next().await.is_some() {} };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
    Ok(())
}

/// A JSON-RPC error response.
fn error(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// Locks a std mutex, ignoring poisoning (no invariant here can be left half-updated).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock()
}

/// Shared state of one agent process.
struct Agent {
    /// Configured defaults.
    opts: DemoAgentOptions,
    /// The output stream; every write is one or more complete lines, then a flush.
    out: tokio::sync::Mutex<Box<dyn AsyncWrite + Send + Unpin>>,
    /// Known sessions by id.
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// Our outstanding requests to the client, by JSON-RPC id.
    pending: Mutex<HashMap<u64, oneshot::Sender<Value>>>,
    /// Next id for a request to the client.
    next_id: AtomicU64,
}

impl Agent {
    /// Writes complete lines and flushes.
    async fn write(&self, bytes: &[u8]) -> io::Result<()> {
        let mut out = self.out.lock().await;
        out.write_all(bytes).await?;
        out.flush().await
    }

    /// Writes one JSON message as a line.
    async fn send(&self, msg: &Value) -> io::Result<()> {
        let mut bytes = serde_json::to_vec(msg)?;
        bytes.push(b'\n');
        self.write(&bytes).await
    }

    /// The session with this id, if known.
    fn session(&self, id: &str) -> Option<Arc<Session>> {
        lock(&self.sessions).get(id).cloned()
    }

    /// The session with this id, created empty if unknown.
    fn session_or_create(&self, id: &str) -> Arc<Session> {
        let mut s = lock(&self.sessions);
        s.entry(id.to_owned())
            .or_insert_with(|| Arc::new(Session::new(id)))
            .clone()
    }

    /// `$HOME/.acp-demo-agent/login`: present once this HOME has logged in.
    fn login_marker(&self) -> Option<PathBuf> {
        Some(self.state_dir()?.join("login"))
    }

    /// `$HOME/.acp-demo-agent`: what outlives the process (the login, showcase choices).
    fn state_dir(&self) -> Option<PathBuf> {
        let home = self
            .opts
            .home
            .clone()
            .or_else(|| std::env::var_os("HOME").map(PathBuf::from))?;
        Some(home.join(".acp-demo-agent"))
    }

    fn logged_in(&self) -> bool {
        self.login_marker().is_some_and(|m| m.exists())
    }

    /// Writes the login marker (directory 0700, file 0600, like a real agent's credentials).
    fn log_in(&self) -> io::Result<()> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let marker = self
            .login_marker()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "HOME is not set"))?;
        if let Some(dir) = marker.parent() {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        }
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&marker)?;
        std::io::Write::write_all(&mut file, b"signed in with demo-login\n")
    }

    /// Handles one parsed-or-not input line.
    async fn handle(self: &Arc<Self>, line: &[u8], tasks: &mut JoinSet<()>) -> io::Result<()> {
        let msg: Value = match serde_json::from_slice(line) {
            Ok(v) => v,
            Err(e) => {
                return self
                    .send(&error(Value::Null, -32700, &format!("parse error: {e}")))
                    .await;
            }
        };
        let Some(obj) = msg.as_object() else {
            return self.send(&error(Value::Null, -32600, "invalid request")).await;
        };
        let params = obj.get("params").cloned().unwrap_or(Value::Null);
        match (obj.get("method").and_then(Value::as_str), obj.get("id")) {
            (Some(method), Some(id)) => match self.request(method, id, params, tasks).await? {
                Some(Ok(result)) => self.send(&json!({"jsonrpc": "2.0", "id": id, "result": result})).await,
                Some(Err((code, message))) => self.send(&error(id.clone(), code, message)).await,
                None => Ok(()),
            },
            (Some("session/cancel"), None) => {
                if let Some(s) = params
                    .get("sessionId")
                    .and_then(Value::as_str)
                    .and_then(|id| self.session(id))
                {
                    s.cancel();
                }
                Ok(())
            }
            (Some(_), None) => Ok(()), // unknown notifications are ignored
            (None, Some(id)) if obj.contains_key("result") || obj.contains_key("error") => {
                if let Some(tx) = id.as_u64().and_then(|id| lock(&self.pending).remove(&id)) {
                    let _ = tx.send(msg); // the asker may have given up (cancelled)
                }
                Ok(())
            }
            (None, id) => {
                self.send(&error(id.cloned().unwrap_or(Value::Null), -32600, "invalid request"))
                    .await
            }
        }
    }

    /// Handles a request. `None` means a spawned task answers it later.
    async fn request(
        self: &Arc<Self>,
        method: &str,
        id: &Value,
        params: Value,
        tasks: &mut JoinSet<()>,
    ) -> io::Result<Option<Result<Value, (i64, &'static str)>>> {
        let session_id = params.get("sessionId").and_then(Value::as_str);
        let answer = match (method, session_id) {
            ("initialize", _) => Ok(json!({
                "protocolVersion": 1,
                "agentCapabilities": {
                    "loadSession": self.opts.load_session,
                    "promptCapabilities": {"image": true, "audio": false, "embeddedContext": true},
                    "sessionCapabilities": if self.opts.fork {
                        json!({"resume": {}, "close": {}, "fork": {}})
                    } else {
                        json!({"resume": {}, "close": {}})
                    },
                    "_meta": {"claudeCode": {"promptQueueing": self.opts.prompt_queueing}},
                },
                "agentInfo": {"name": "acp-gateway-demo-agent", "version": env!("CARGO_PKG_VERSION")},
                "authMethods": if self.opts.require_auth {
                    json!([{"id": LOGIN_METHOD, "name": "Demo login",
                            "description": "Signs this user's demo agent in (stored in $HOME)"}])
                } else {
                    json!([])
                },
            })),
            ("authenticate", _) if self.opts.require_auth => match params.get("methodId").and_then(Value::as_str) {
                Some(LOGIN_METHOD) => match self.log_in() {
                    Ok(()) => Ok(json!({})),
                    Err(e) => {
                        eprintln!("demo-agent: cannot store the login: {e}");
                        Err((-32603, "cannot store the login"))
                    }
                },
                _ => Err((-32602, "invalid params: unknown methodId")),
            },
            ("authenticate", _) => Ok(json!({})),
            ("session/new", _) if self.opts.require_auth && !self.logged_in() => {
                Err((-32000, "Authentication required"))
            }
            ("session/new", _) => {
                let sid = format!("demo-{}", uuid::Uuid::new_v4());
                let s = self.session_or_create(&sid);
                s.set_cwd(&params);
                if self.opts.showcase {
                    let mut answer = json!({"sessionId": sid});
                    if let (Some(a), Value::Object(state)) = (answer.as_object_mut(), modes::session_state(&s)) {
                        a.extend(state);
                    }
                    self.answer_then_commands(&s, id, &answer, true).await?;
                    return Ok(None);
                }
                Ok(json!({"sessionId": sid}))
            }
            ("session/fork", Some(sid)) if self.opts.fork => match self.session(sid) {
                Some(original) => {
                    let forked = format!("demo-{}", uuid::Uuid::new_v4());
                    let s = self.session_or_create(&forked);
                    *lock(&s.history) = lock(&original.history).clone();
                    s.set_cwd(&params);
                    Ok(json!({"sessionId": forked}))
                }
                None => Err((-32002, "Resource not found: no such session")),
            },
            ("session/load", Some(sid)) if self.opts.load_session => {
                // Unknown ids are created empty: the gateway restores sessions of dead processes.
                let known = self.session(sid).is_some();
                let s = self.session_or_create(sid);
                if self.opts.showcase && !known {
                    modes::restore(&s, self.state_dir().as_deref());
                }
                let mut buf = Vec::new();
                for update in lock(&s.history).iter() {
                    buf.extend_from_slice(&s.prefix);
                    buf.extend_from_slice(update.as_bytes());
                    buf.extend_from_slice(b"}}\n");
                }
                s.set_cwd(&params);
                if self.opts.showcase {
                    self.write(&buf).await?;
                    self.answer_then_commands(&s, id, &modes::session_state(&s), false)
                        .await?;
                    return Ok(None);
                }
                serde_json::to_writer(&mut buf, &json!({"jsonrpc": "2.0", "id": id, "result": {}}))?;
                buf.push(b'\n');
                self.write(&buf).await?;
                return Ok(None);
            }
            ("session/resume", Some(sid)) => {
                let known = self.session(sid).is_some();
                let s = self.session_or_create(sid);
                if self.opts.showcase && !known {
                    modes::restore(&s, self.state_dir().as_deref());
                }
                s.set_cwd(&params);
                if self.opts.showcase {
                    self.answer_then_commands(&s, id, &modes::session_state(&s), false)
                        .await?;
                    return Ok(None);
                }
                Ok(json!({}))
            }
            ("session/set_mode" | "session/set_config_option", Some(sid)) if self.opts.showcase => {
                let Some(s) = self.session(sid) else {
                    return Ok(Some(Err((-32002, "session not found"))));
                };
                let changed = if method == "session/set_mode" {
                    modes::set_mode(&s, &params)
                } else {
                    modes::set_config_option(&s, &params)
                };
                let (answer, update) = match changed {
                    Ok(pair) => pair,
                    Err(e) => return Ok(Some(Err(e))),
                };
                modes::save(&s, self.state_dir().as_deref());
                // The answer first, then the update that tells every client of the session.
                let update = update.to_string();
                s.record(&update);
                let mut buf = serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "result": answer}))?;
                buf.push(b'\n');
                buf.extend_from_slice(&s.update_line(&update));
                self.write(&buf).await?;
                return Ok(None);
            }
            ("session/close", Some(sid)) => {
                if let Some(s) = lock(&self.sessions).remove(sid) {
                    s.cancel();
                }
                Ok(json!({}))
            }
            ("session/prompt", Some(sid)) => match (self.session(sid), params.get("prompt")) {
                (None, _) => Err((-32002, "session not found")),
                (Some(_), None) => Err((-32602, "invalid params: missing prompt")),
                (Some(s), Some(_)) => {
                    let token = lock(&s.cancel).clone();
                    let (done, this_turn) = oneshot::channel();
                    let before = lock(&s.turn).replace(this_turn);
                    tasks.spawn(self.clone().prompt(s, id.clone(), params, token, (before, done)));
                    return Ok(None);
                }
            },
            ("session/load" | "session/resume" | "session/close" | "session/prompt", None)
                if method != "session/load" || self.opts.load_session =>
            {
                Err((-32602, "invalid params: missing sessionId"))
            }
            ("session/set_mode" | "session/set_config_option", None) if self.opts.showcase => {
                Err((-32602, "invalid params: missing sessionId"))
            }
            _ => Err((-32601, "method not found")),
        };
        Ok(Some(answer))
    }

    /// Answers a showcase `session/new|load|resume` with `result`, then announces the slash
    /// commands (recorded in the history only at `session/new`, so that loads do not pile
    /// them up).
    async fn answer_then_commands(&self, s: &Session, id: &Value, result: &Value, record: bool) -> io::Result<()> {
        let update = modes::commands_update().to_string();
        if record {
            s.record(&update);
        }
        let mut buf = serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "result": result}))?;
        buf.push(b'\n');
        buf.extend_from_slice(&s.update_line(&update));
        self.write(&buf).await
    }

    /// Runs one prompt turn (in its own task) and answers the request.
    /// Runs a prompt once the one before it (`turn.0`) has ended; `turn.1` is dropped when this
    /// one ends.
    async fn prompt(
        self: Arc<Self>,
        s: Arc<Session>,
        id: Value,
        params: Value,
        token: CancellationToken,
        turn: (Option<oneshot::Receiver<()>>, oneshot::Sender<()>),
    ) {
        let (before, _done) = turn;
        let blocks = params
            .get("prompt")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice);
        let text = blocks
            .iter()
            .find(|b| b.get("type").and_then(Value::as_str) == Some("text"))
            .and_then(|b| b.get("text").and_then(Value::as_str))
            .unwrap_or_default();
        let c = parse_controls(text);
        let delay = Duration::from_micros(c.delay_us.unwrap_or(self.opts.delay_us));
        let mut t = Turn::new(&self, &s, delay, &token);
        let result = tokio::select! {
            _ = token.cancelled() => Err(Stop::Cancelled),
            r = async {
                if let Some(before) = before {
                    let _ = before.await;
                }
                if self.opts.showcase {
                    t.showcase(blocks, text, &c).await
                } else {
                    t.run(blocks, text, &c).await
                }
            } => r
        };
        let stop_reason = match result {
            Ok(()) => "end_turn",
            Err(Stop::Cancelled) => "cancelled",
            Err(Stop::Io(e)) => {
                eprintln!("demo-agent: output failed: {e}");
                return;
            }
        };
        let answer = json!({"jsonrpc": "2.0", "id": id, "result": {"stopReason": stop_reason}});
        if let Err(e) = t.answer(&answer).await {
            eprintln!("demo-agent: output failed: {e}");
        }
    }

    /// Asks the client for permission to run a tool call; waits for the answer or cancellation.
    async fn ask_permission(&self, s: &Session, tool_call: &Value, token: &CancellationToken) -> io::Result<Decision> {
        let rid = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(rid, tx);
        let req = json!({"jsonrpc": "2.0", "id": rid, "method": "session/request_permission", "params": {
            "sessionId": s.id,
            "toolCall": tool_call,
            "options": [
                {"optionId": "allow", "name": "Allow once", "kind": "allow_once"},
                {"optionId": "reject", "name": "Reject once", "kind": "reject_once"},
            ],
        }});
        let sent = self.send(&req).await;
        let answer = match sent {
            Ok(()) => tokio::select! { r = rx => r.ok(), _ = token.cancelled() => None },
            Err(_) => None,
        };
        lock(&self.pending).remove(&rid);
        sent?;
        Ok(answer.map_or(Decision::Cancelled, |v| decide(&v)))
    }
}

#[cfg(test)]
mod tests;
