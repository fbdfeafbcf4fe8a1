//! One agent process: spawned in its own process group, spoken to over stdin/stdout as an ACP
//! client, killed (the whole group) on every exit path.
//!
//! Three tracked tasks serve it: a writer that drains a bounded queue into stdin, a reader that
//! routes each stdout line (parsed once), and a waiter that reaps the child and kills its group.
//! When the process ends, every request waiting on it fails at once with a JSON-RPC error and its
//! sessions are unbound, to be restored on another process when next used.

use std::collections::{HashMap, VecDeque};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use axum::extract::ws::Utf8Bytes;
use futures_util::StreamExt;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::reaper::GroupRecord;
use super::route::SessionRoute;
use crate::outbox::Outbox;
use crate::protocol::{self, Incoming, Kind, RpcError, codes};
use crate::tenancy::Launch;

/// Lines queued for one agent's stdin.
const STDIN_QUEUE: usize = 1024;
/// stderr lines kept for error reports.
const STDERR_TAIL: usize = 20;
/// Longest stderr line logged.
const STDERR_LINE_MAX: usize = 8 * 1024;

/// Where the answer to a request the gateway sent an agent goes.
pub enum Pending {
    /// Back to a client, under the client's own id, in order with its session's updates.
    Forward {
        /// The session the request concerns (it orders the answer after its updates).
        route: Arc<dyn SessionRoute>,
        /// The client that asked.
        to: Outbox,
        /// The client's id for the request, raw.
        client_id: Box<RawValue>,
        /// The client's in-flight slot, held until the agent answers.
        _slot: Option<tokio::sync::OwnedSemaphorePermit>,
    },
    /// To the gateway itself.
    Internal(oneshot::Sender<Result<Box<RawValue>, RpcError>>),
}

/// One running agent process.
pub struct AgentProcess {
    /// Unique within this gateway, for logs.
    pub id: u64,
    /// The configured agent name.
    pub agent: Arc<str>,
    /// OS process id (also its process group id).
    pub pid: u32,
    /// The user whose sessions it carries (`None` while warm and unassigned).
    owner: Mutex<Option<Arc<str>>>,
    /// Lines for stdin (bounded).
    stdin: mpsc::Sender<Utf8Bytes>,
    /// Next id for requests to the agent; the agent's id space is ours alone.
    next_id: AtomicU64,
    /// Requests sent to the agent and not yet answered.
    pending: Mutex<HashMap<u64, Pending>>,
    /// Live sessions on this process, by the agent's session id.
    sessions: Mutex<HashMap<Arc<str>, Arc<dyn SessionRoute>>>,
    /// Session slots taken (including sessions being created).
    reserved: AtomicUsize,
    /// Fired when the process has ended (or is being stopped).
    dead: CancellationToken,
    /// Asks the waiter to stop the process.
    stop: CancellationToken,
    /// Milliseconds after `started` of the last line in or out.
    last_active_ms: AtomicU64,
    /// Reference for `last_active_ms`.
    started: Instant,
    /// The last stderr lines, logged when the process ends (never sent to clients: they can
    /// hold other users' data or the host's secrets).
    stderr_tail: Mutex<VecDeque<String>>,
    /// What every request gets once the process has ended: how it ended, and an error id that
    /// matches the log line holding its stderr tail.
    gone: Mutex<Option<RpcError>>,
}

impl std::fmt::Debug for AgentProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentProcess")
            .field("id", &self.id)
            .field("agent", &self.agent)
            .field("pid", &self.pid)
            .finish()
    }
}

/// Kills a whole process group when dropped, whatever path dropped it.
struct GroupGuard(i32);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        let _ = killpg(Pid::from_raw(self.0), Signal::SIGKILL);
    }
}

/// A whole `session/update` line, read in one pass (the hot path of a streaming agent).
#[derive(Deserialize)]
struct UpdateLine<'a> {
    #[serde(borrow)]
    method: std::borrow::Cow<'a, str>,
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    params: UpdateParams<'a>,
}

/// Whether the line's first bytes name `session/update` (where agents put `method`).
fn looks_like_update(line: &str) -> bool {
    const NEEDLE: &[u8] = b"\"session/update\"";
    let head = &line.as_bytes()[..line.len().min(96)];
    head.windows(NEEDLE.len()).any(|w| w == NEEDLE)
}

#[derive(Deserialize)]
struct UpdateParams<'a> {
    #[serde(rename = "sessionId", borrow)]
    session_id: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    update: &'a RawValue,
    #[serde(rename = "_meta", borrow, default)]
    meta: Option<&'a RawValue>,
}

impl AgentProcess {
    /// Starts the agent (as `launch` says: environment, home, sandbox) for `owner` (`None`: a
    /// process that may serve several users) and its three tasks. Does not initialize it.
    pub fn spawn(
        id: u64,
        agent: Arc<str>,
        owner: Option<Arc<str>>,
        launch: Launch,
        max_line_bytes: usize,
        groups: &Arc<GroupRecord>,
        tracker: &TaskTracker,
    ) -> std::io::Result<Arc<Self>> {
        let mut cmd: Command = launch.command;
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let pid = child
            .id()
            .ok_or_else(|| std::io::Error::other("agent exited at once"))?;
        let guard = GroupGuard(pid as i32);
        groups.add(guard.0);
        let (stdin_tx, stdin_rx) = mpsc::channel(STDIN_QUEUE);
        let process = Arc::new(Self {
            id,
            agent,
            pid,
            owner: Mutex::new(owner),
            stdin: stdin_tx,
            next_id: AtomicU64::new(0),
            pending: Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashMap::new()),
            reserved: AtomicUsize::new(0),
            dead: CancellationToken::new(),
            stop: CancellationToken::new(),
            last_active_ms: AtomicU64::new(0),
            started: Instant::now(),
            stderr_tail: Mutex::new(VecDeque::with_capacity(STDERR_TAIL)),
            gone: Mutex::new(None),
        });
        let (Some(stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(std::io::Error::other("agent pipes missing"));
        };
        tracker.spawn(write_stdin(stdin, stdin_rx, process.stop.clone()));
        // 64 KiB reads: a streaming agent's lines arrive in few syscalls.
        let stdout = FramedRead::with_capacity(stdout, LinesCodec::new_with_max_length(max_line_bytes), 64 << 10);
        tracker.spawn(read_stdout(Arc::downgrade(&process), stdout, process.stop.clone()));
        let stderr = FramedRead::new(stderr, LinesCodec::new_with_max_length(STDERR_LINE_MAX));
        tracker.spawn(read_stderr(Arc::downgrade(&process), stderr));
        tracker.spawn(wait(process.clone(), child, guard, groups.clone()));
        metrics::gauge!("acp_gateway_agent_processes", "agent" => process.agent.to_string()).increment(1.0);
        tracing::info!(agent = %process.agent, process = id, pid, sandboxed = launch.sandboxed, "agent process started");
        Ok(process)
    }

    /// Whether the process has ended or is being stopped.
    pub fn is_dead(&self) -> bool {
        self.dead.is_cancelled()
    }

    /// Resolves when the process has ended.
    pub async fn died(&self) {
        self.dead.cancelled().await;
    }

    /// Asks the process (its whole group) to stop.
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// The user this process belongs to.
    pub fn owner(&self) -> Option<Arc<str>> {
        self.owner.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Gives an unassigned process to `user`; `false` if someone else has it.
    pub fn claim(&self, user: &Arc<str>) -> bool {
        let mut owner = self.owner.lock().unwrap_or_else(|e| e.into_inner());
        match &*owner {
            Some(o) => o == user,
            None => {
                *owner = Some(user.clone());
                true
            }
        }
    }

    /// Takes a session slot if fewer than `max` are taken.
    pub fn try_reserve(&self, max: usize) -> bool {
        self.reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
            .is_ok()
    }

    /// Gives a session slot back.
    pub fn release(&self) {
        let _ = self
            .reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Session slots taken.
    pub fn reserved(&self) -> usize {
        self.reserved.load(Ordering::Acquire)
    }

    /// Whether nothing has happened on it for `timeout` and nothing is in flight.
    pub fn is_idle(&self, timeout: Duration) -> bool {
        let last = Duration::from_millis(self.last_active_ms.load(Ordering::Relaxed));
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
            && self.started.elapsed().saturating_sub(last) >= timeout
    }

    fn touch(&self) {
        self.last_active_ms
            .store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Routes the agent's updates and requests for `agent_session_id` to `session`. Refused
    /// (`false`) when that id already routes to another session: an agent that answers with an
    /// id it already gave out (or one a client chose) must not divert a live session.
    pub fn bind_session(&self, agent_session_id: Arc<str>, session: Arc<dyn SessionRoute>) -> bool {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        match sessions.get(&agent_session_id) {
            Some(bound) if !Arc::ptr_eq(bound, &session) => false,
            _ => {
                sessions.insert(agent_session_id, session);
                true
            }
        }
    }

    /// Stops routing for a session and frees its slot.
    pub fn unbind_session(&self, agent_session_id: &str) {
        if self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(agent_session_id)
            .is_some()
        {
            self.release();
        }
    }

    fn session(&self, agent_session_id: &str) -> Option<Arc<dyn SessionRoute>> {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(agent_session_id)
            .cloned()
    }

    /// Writes one line (a complete JSON-RPC message) to the agent.
    pub async fn send_line(&self, line: String) -> Result<(), RpcError> {
        let mut line = line;
        line.push('\n');
        self.touch();
        self.stdin
            .send(Utf8Bytes::from(line))
            .await
            .map_err(|_| self.gone_error())
    }

    /// Sends a request and waits for its answer (at most `timeout`).
    pub async fn request(&self, method: &str, params: &str, timeout: Duration) -> Result<Box<RawValue>, RpcError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, Pending::Internal(tx));
        if let Err(e) = self.send_line(protocol::request(id, method, params)).await {
            self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
            return Err(e);
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(self.gone_error()),
            Err(_) => {
                self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                Err(RpcError::internal(format!(
                    "agent did not answer {method} within {}s",
                    timeout.as_secs()
                )))
            }
        }
    }

    /// Forwards a client's request without waiting: the answer goes back to the client through
    /// its session (after the session's earlier updates). Returns the id used with the agent
    /// (for `$/cancel_request`). An agent whose input queue is full is not waited on.
    pub fn forward(&self, method: &str, params: &str, answer: Pending) -> Result<u64, RpcError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, answer);
        let mut line = protocol::request(id, method, params);
        line.push('\n');
        self.touch();
        let sent = self.stdin.try_send(Utf8Bytes::from(line));
        if let Err(e) = sent {
            self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
            return Err(match e {
                mpsc::error::TrySendError::Full(_) => {
                    RpcError::internal("the agent is not reading its input; try again later")
                }
                mpsc::error::TrySendError::Closed(_) => self.gone_error(),
            });
        }
        Ok(id)
    }

    /// Whether the request sent under `agent_id` is still waiting for the agent's answer.
    pub fn is_pending(&self, agent_id: u64) -> bool {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&agent_id)
    }

    /// The error every request gets once the process is gone.
    pub fn gone_error(&self) -> RpcError {
        self.gone
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| {
                RpcError::internal("agent process is gone").with_data(serde_json::json!({ "agent": &*self.agent }))
            })
    }

    /// Records how the process ended: logs its stderr tail under a fresh error id, and keeps the
    /// client-facing error (the id, never the tail).
    fn record_exit(&self, how: &str) {
        let error_id = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
        let tail: Vec<String> = self
            .stderr_tail
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect();
        tracing::warn!(agent = %self.agent, process = self.id, pid = self.pid, status = %how, error_id = %error_id, stderr_tail = ?tail, "agent process ended");
        let err = RpcError::internal(format!("agent process exited ({how}); error id {error_id}"))
            .with_data(serde_json::json!({ "agent": &*self.agent, "errorId": error_id }));
        *self.gone.lock().unwrap_or_else(|e| e.into_inner()) = Some(err);
    }

    /// Routes one stdout line.
    async fn on_line(self: &Arc<Self>, line: &str) {
        self.touch();
        if looks_like_update(line)
            && let Ok(u) = serde_json::from_str::<UpdateLine<'_>>(line)
            && u.method == "session/update"
            && u.id.is_none()
        {
            match self.session(&u.params.session_id) {
                Some(session) => session.publish(u.params.update, u.params.meta).await,
                None => tracing::debug!(agent = %self.agent, "update for a session with no route; dropped"),
            }
            return;
        }
        let (msg, kind) = match Incoming::parse(line) {
            Ok(parsed) => parsed,
            Err(e) => {
                tracing::warn!(agent = %self.agent, process = self.id, error = ?e, "agent wrote a line that is not JSON-RPC; ignored");
                return;
            }
        };
        match kind {
            Kind::Response => self.on_response(&msg).await,
            Kind::Notification if msg.method() == "session/update" => {
                let Some(params) = msg
                    .params
                    .and_then(|p| serde_json::from_str::<UpdateParams<'_>>(p.get()).ok())
                else {
                    tracing::warn!(agent = %self.agent, "malformed session/update from agent; ignored");
                    return;
                };
                match self.session(&params.session_id) {
                    Some(session) => session.publish(params.update, params.meta).await,
                    None => {
                        tracing::debug!(agent = %self.agent, "update for a session with no route (restore replay, or closed); dropped")
                    }
                }
            }
            Kind::Notification => {
                tracing::debug!(agent = %self.agent, method = msg.method(), "agent notification ignored")
            }
            Kind::Request => self.on_agent_request(&msg).await,
        }
    }

    async fn on_response(&self, msg: &Incoming<'_>) {
        let Some(id) = msg.id.and_then(protocol::own_id) else {
            tracing::warn!(agent = %self.agent, "agent answered an id the gateway never used; ignored");
            return;
        };
        let Some(pending) = self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&id) else {
            tracing::debug!(agent = %self.agent, id, "answer to a request nobody waits for (timed out or cancelled)");
            return;
        };
        match pending {
            Pending::Forward {
                route, to, client_id, ..
            } => {
                let frame = match (msg.result, msg.error) {
                    (Some(result), _) => protocol::response(client_id.get(), result.get()),
                    (None, Some(error)) => protocol::error_passthrough(client_id.get(), error.get()),
                    (None, None) => protocol::error(
                        Some(client_id.get()),
                        &RpcError::internal("agent sent an empty response"),
                    ),
                };
                route.respond(&to, Utf8Bytes::from(frame));
            }
            Pending::Internal(tx) => {
                let answer = match (msg.result, msg.error) {
                    (Some(result), _) => Ok(result.to_owned()),
                    (None, error) => Err(agent_error(error)),
                };
                let _ = tx.send(answer);
            }
        }
    }

    /// A request from the agent to its client (`session/request_permission`, `fs/*`,
    /// `terminal/*`, ...): goes to the clients attached to the session it names.
    async fn on_agent_request(self: &Arc<Self>, msg: &Incoming<'_>) {
        let Some(id) = msg.id else { return };
        let session = protocol::session_id_of(msg.params).and_then(|sid| self.session(&sid));
        let Some(session) = session else {
            let err = RpcError::new(codes::INVALID_PARAMS, "request names no session of this process");
            let _ = self.send_line(protocol::error(Some(id.get()), &err)).await;
            return;
        };
        let params = msg
            .params
            .and_then(|p| protocol::with_session_id(p, session.session_id()));
        let params = params.unwrap_or_else(|| String::from("{}"));
        session.agent_request(self, id.to_owned(), msg.method(), params);
    }

    /// Called once stdout has closed: fails everything waiting and unbinds every session.
    async fn on_exit(self: &Arc<Self>) {
        self.stop.cancel();
        // Wait (briefly) for the waiter to record how the process ended, for the error text.
        let _ = tokio::time::timeout(Duration::from_millis(500), self.dead.cancelled()).await;
        let err = self.gone_error();
        let pending: Vec<Pending> = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .map(|(_, p)| p)
            .collect();
        for p in pending {
            match p {
                Pending::Forward {
                    route, to, client_id, ..
                } => {
                    route.respond(&to, Utf8Bytes::from(protocol::error(Some(client_id.get()), &err)));
                }
                Pending::Internal(tx) => {
                    let _ = tx.send(Err(err.clone()));
                }
            }
        }
        let sessions: Vec<Arc<dyn SessionRoute>> = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .map(|(_, s)| s)
            .collect();
        for s in sessions {
            s.unbound(self.id);
        }
    }
}

/// Turns an agent's raw error object into an [`RpcError`], keeping its code and message.
pub fn agent_error(error: Option<&RawValue>) -> RpcError {
    #[derive(Deserialize)]
    struct E {
        code: i64,
        message: String,
        #[serde(default)]
        data: Option<serde_json::Value>,
    }
    match error.and_then(|e| serde_json::from_str::<E>(e.get()).ok()) {
        Some(e) => {
            let mut err = RpcError::new(e.code, e.message);
            err.data = e.data.map(|d| d.to_string());
            err
        }
        None => RpcError::internal("agent sent a malformed error"),
    }
}

async fn write_stdin(stdin: tokio::process::ChildStdin, mut rx: mpsc::Receiver<Utf8Bytes>, stop: CancellationToken) {
    let mut out = BufWriter::with_capacity(64 * 1024, stdin);
    loop {
        let line = tokio::select! {
            line = rx.recv() => line,
            () = stop.cancelled() => None,
        };
        let Some(line) = line else { break };
        if out.write_all(line.as_bytes()).await.is_err() {
            break;
        }
        // Flush when nothing else is waiting: one syscall per burst, no added latency.
        if rx.is_empty() && out.flush().await.is_err() {
            break;
        }
    }
}

async fn read_stdout(
    process: Weak<AgentProcess>,
    mut lines: FramedRead<tokio::process::ChildStdout, LinesCodec>,
    stop: CancellationToken,
) {
    // Read to EOF even after the process is gone: its last lines (a final update, the error it
    // died with) are still in the pipe. If something outside the group holds the pipe open, give
    // up a second after the stop.
    let give_up = async {
        stop.cancelled().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    tokio::pin!(give_up);
    loop {
        let next = tokio::select! {
            next = lines.next() => next,
            () = &mut give_up => None,
        };
        let Some(process) = process.upgrade() else {
            return;
        };
        match next {
            Some(Ok(line)) => process.on_line(&line).await,
            Some(Err(LinesCodecError::MaxLineLengthExceeded)) => {
                tracing::warn!(agent = %process.agent, process = process.id, "agent wrote a line over the cap; skipped");
            }
            Some(Err(LinesCodecError::Io(e))) => {
                tracing::warn!(agent = %process.agent, error = %e, "reading agent stdout failed");
                process.on_exit().await;
                return;
            }
            None => {
                process.on_exit().await;
                return;
            }
        }
    }
}

async fn read_stderr(process: Weak<AgentProcess>, mut lines: FramedRead<tokio::process::ChildStderr, LinesCodec>) {
    while let Some(line) = lines.next().await {
        let Some(process) = process.upgrade() else {
            return;
        };
        let line = match line {
            Ok(line) => line,
            Err(LinesCodecError::MaxLineLengthExceeded) => String::from("[stderr line over 8 KiB cut]"),
            Err(LinesCodecError::Io(_)) => return,
        };
        tracing::info!(target: "agent_stderr", agent = %process.agent, process = process.id, "{line}");
        let mut tail = process.stderr_tail.lock().unwrap_or_else(|e| e.into_inner());
        if tail.len() == STDERR_TAIL {
            tail.pop_front();
        }
        tail.push_back(line);
    }
}

/// Reaps the child; stops its group when asked (TERM, then KILL after two seconds) and always
/// kills whatever is left of the group once the leader is gone.
async fn wait(process: Arc<AgentProcess>, mut child: Child, guard: GroupGuard, groups: Arc<GroupRecord>) {
    let status = tokio::select! {
        status = child.wait() => status,
        () = process.stop.cancelled() => {
            let _ = killpg(Pid::from_raw(guard.0), Signal::SIGTERM);
            match tokio::time::timeout(Duration::from_secs(2), child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    let _ = killpg(Pid::from_raw(guard.0), Signal::SIGKILL);
                    child.wait().await
                }
            }
        }
    };
    let pgid = guard.0;
    drop(guard);
    groups.remove(pgid);
    let text = match status {
        Ok(s) => match (s.code(), std::os::unix::process::ExitStatusExt::signal(&s)) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(sig)) => format!("killed by signal {sig}"),
            _ => s.to_string(),
        },
        Err(e) => format!("wait failed: {e}"),
    };
    process.record_exit(&text);
    metrics::gauge!("acp_gateway_agent_processes", "agent" => process.agent.to_string()).decrement(1.0);
    process.stop.cancel();
    process.dead.cancel();
}
