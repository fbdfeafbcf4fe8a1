//! One agent process: a child in its own process group ([`super::child`]), spoken to as
//! a JSON-RPC peer over its stdin and stdout ([`super::rpc`]), with the table that routes
//! what it says to the sessions it carries, and the accounting the pool picks processes by (owner,
//! session slots, idleness).
//!
//! Four tracked tasks serve it: a writer that drains a bounded queue into stdin, a reader that
//! routes each stdout line (parsed once), a reader that keeps the tail of stderr, and a waiter that
//! reaps the child and kills its group. When the process ends, every request waiting on it fails
//! at once with a JSON-RPC error and its sessions are unbound, to be restored on another process
//! when next used.
//!
//! Updates for an agent session id that has no route yet are held for a few seconds
//! ([`early`](super::early)): a session being created takes them once bound
//! ([`AgentProcess::hold_updates`]), a restore drops them. Those of a session being created are
//! never dropped: with no room left to hold one, the reader waits until a claim ends, as it
//! waits for the transcript writer's queue once the session is bound.

use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::ProcessSlot;
use super::child::{self, AgentLines, StderrTail, lock};
use super::reaper::GroupRecord;
use super::route::SessionRoute;
pub use super::rpc::Pending;
use super::rpc::{self, Rpc};
use crate::protocol::{self, Incoming, Kind, RpcError};
use crate::tenancy::Launch;
pub use early_updates::EarlyUpdates;
use lines::read_stdout;
pub use lines::{more_lines_follow, with_follows, with_more_lines};
use routing::{Destination, Routes};

/// What bounds a process's pipes.
#[derive(Debug, Clone, Copy)]
pub struct PipeLimits {
    /// Longest line read from its stdout.
    pub max_line_bytes: usize,
    /// Bytes queued for its stdin.
    pub input_queue_bytes: usize,
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
    /// The agent as a JSON-RPC peer: requests to it, and their answers.
    rpc: Rpc,
    /// Where the agent's updates go (and what waits for a route): one lock, taken once per
    /// update line as before there was anything to hold.
    routes: Mutex<Routes>,
    /// Held while a session being created hands on the updates held for it: the stdout reader
    /// waits on it (only) for an update of that session meanwhile, so none overtakes them.
    handing_early: tokio::sync::Mutex<()>,
    /// Woken when updates held for a claim leave or a claim ends: the stdout reader, waiting
    /// for room to hold an update of a session being created, looks again. `notify_one`, so a
    /// wake between the reader's look and its wait is kept (there is one reader).
    claim_room: tokio::sync::Notify,
    /// Session slots taken (including sessions being created).
    reserved: AtomicUsize,
    /// Fired when the process has ended (or is being stopped).
    dead: CancellationToken,
    /// Asks the waiter to stop the process.
    stop: CancellationToken,
    /// Set when the gateway asked it to stop ([`AgentProcess::stop`]): an exit without it is a
    /// crash (`acp_gateway_agent_crashes_total`).
    stop_requested: AtomicBool,
    /// Milliseconds after `started` of the last line in or out.
    last_active_ms: AtomicU64,
    /// Milliseconds after `started` the agent last had nothing to wait for from us: its last
    /// stdout line, or the gateway's last answer to a request of its.
    last_heard_ms: AtomicU64,
    /// Whether the stdout reader is waiting to hand an update on (the transcript writer's queue
    /// is full): the agent's output then waits in the pipe, and its silence is ours.
    handing_on: AtomicBool,
    /// Ids (raw JSON) of the agent's requests to its clients not answered yet: while it waits
    /// for a person (a permission) it is not idle.
    asks: Mutex<HashSet<Box<str>>>,
    /// Reference for `last_active_ms`.
    started: Instant,
    /// What this process said in `initialize` (a user's own process may say other things than
    /// another user's: its sign-in methods are taken from here, never from someone else's).
    pub(super) info: std::sync::OnceLock<Arc<super::AgentInfo>>,
    /// The last stderr lines, logged when the process ends. The stderr reader holds it weakly,
    /// so it stops once the process is dropped.
    stderr_tail: Arc<StderrTail>,
    /// Fired when its stderr is read to the end (the reaper waits a little for it, so that the
    /// exit report has the last lines).
    stderr_ended: CancellationToken,
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

impl AgentProcess {
    /// Starts the agent (as `launch` says: environment, home, sandbox) for the user whose process
    /// slot `owner` is (`None`: a process that may serve several users) and its four tasks; the
    /// slot is given back once the process has ended. Does not initialize it.
    pub fn spawn(
        id: u64,
        agent: Arc<str>,
        owner: Option<ProcessSlot>,
        launch: Launch,
        pipes: PipeLimits,
        groups: &Arc<GroupRecord>,
        tracker: &TaskTracker,
    ) -> std::io::Result<Arc<Self>> {
        let sandboxed = launch.sandboxed;
        let egress_only = launch.egress_only();
        let mut spawned = child::spawn(launch, groups)?;
        let (rpc, input) = Rpc::new(agent.clone(), Box::new(spawned.stdin), pipes.input_queue_bytes);
        let process = Arc::new(Self {
            id,
            agent,
            pid: spawned.pid,
            owner: Mutex::new(owner.as_ref().map(|slot| slot.user().clone())),
            rpc,
            routes: Mutex::default(),
            handing_early: tokio::sync::Mutex::new(()),
            claim_room: tokio::sync::Notify::new(),
            reserved: AtomicUsize::new(0),
            dead: CancellationToken::new(),
            stop: CancellationToken::new(),
            stop_requested: AtomicBool::new(false),
            last_active_ms: AtomicU64::new(0),
            last_heard_ms: AtomicU64::new(0),
            handing_on: AtomicBool::new(false),
            asks: Mutex::new(HashSet::new()),
            started: Instant::now(),
            info: std::sync::OnceLock::new(),
            stderr_tail: Arc::default(),
            stderr_ended: CancellationToken::new(),
        });
        if let Some(network) = spawned.network.take() {
            // Until it is up, bubblewrap holds the agent back; the network goes when it dies.
            tracker.spawn(network.run(spawned.guard.pgid(), process.dead.clone()));
        }
        tracker.spawn(rpc::write_lines(input, process.stop.clone()));
        // 64 KiB reads: a streaming agent's lines arrive in few syscalls.
        let stdout = FramedRead::with_capacity(spawned.stdout, AgentLines::new(pipes.max_line_bytes), 64 << 10);
        tracker.spawn(read_stdout(Arc::downgrade(&process), stdout, process.stop.clone()));
        let tail = Arc::downgrade(&process.stderr_tail);
        tracker.spawn(child::read_stderr(
            spawned.stderr,
            tail,
            process.agent.clone(),
            id,
            process.stderr_ended.clone(),
        ));
        tracker.spawn(reap(
            process.clone(),
            spawned.child,
            spawned.guard,
            groups.clone(),
            owner,
        ));
        tracing::info!(agent = %process.agent, process = id, pid = process.pid, sandboxed, egress_only, "agent process started");
        Ok(process)
    }

    /// What this process said in `initialize`, once it has.
    pub fn info(&self) -> Option<Arc<super::AgentInfo>> {
        self.info.get().cloned()
    }

    /// Whether the process has ended or is being stopped (a stopped process takes no new work:
    /// its sessions are restored elsewhere when next used).
    pub fn is_dead(&self) -> bool {
        self.dead.is_cancelled() || self.stop.is_cancelled()
    }

    /// Resolves when the process has ended.
    pub async fn died(&self) {
        self.dead.cancelled().await;
    }

    /// Asks the process (its whole group) to stop.
    pub fn stop(&self) {
        self.stop_requested.store(true, Ordering::Release);
        self.stop.cancel();
    }

    /// The user this process belongs to.
    pub fn owner(&self) -> Option<Arc<str>> {
        lock(&self.owner).clone()
    }

    /// Gives an unassigned process to `user`; `false` if someone else has it.
    pub fn claim(&self, user: &Arc<str>) -> bool {
        let mut owner = lock(&self.owner);
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

    /// Sessions bound to it now.
    pub fn session_count(&self) -> usize {
        lock(&self.routes).sessions.len()
    }

    /// Whether a request to it waits for its answer.
    pub fn is_waiting(&self) -> bool {
        self.rpc.is_waiting()
    }

    /// Whether nothing has happened on it for `timeout` and nothing is in flight.
    pub fn is_idle(&self, timeout: Duration) -> bool {
        let last = Duration::from_millis(self.last_active_ms.load(Ordering::Relaxed));
        !self.rpc.is_waiting() && self.started.elapsed().saturating_sub(last) >= timeout
    }

    fn touch(&self) {
        self.last_active_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// The agent said something (or got the answer it was waiting for).
    fn heard(&self) {
        let now = self.now_ms();
        self.last_active_ms.store(now, Ordering::Relaxed);
        self.last_heard_ms.store(now, Ordering::Relaxed);
    }

    /// How long the agent has been silent while a forwarded `session/prompt` waits for it: since
    /// its last stdout line or the oldest waiting prompt's sending, whichever is later. `None`
    /// when no prompt waits, or the silence is not the agent's (it waits for a client's answer,
    /// or the gateway is not reading its output).
    pub fn prompt_silence(&self) -> Option<Duration> {
        let oldest = self.rpc.oldest_prompt()?;
        if self.handing_on.load(Ordering::Acquire) || !lock(&self.asks).is_empty() {
            return None;
        }
        let heard = self.started + Duration::from_millis(self.last_heard_ms.load(Ordering::Relaxed));
        Some(heard.max(oldest).elapsed())
    }

    /// Gives up on an agent that went silent with a prompt waiting: every request waiting on it
    /// gets `-32603` "agent timed out" (a forwarded one through its session, after the session's
    /// updates), and the process is stopped; its sessions are restored on a fresh process when
    /// next used.
    pub fn time_out(&self, silent_for: Duration) {
        tracing::warn!(agent = %self.agent, process = self.id, pid = self.pid, silent_secs = silent_for.as_secs_f64(), "agent wrote nothing while a prompt waited; answering its requests with a timeout and recycling it");
        self.rpc.set_gone_error(rpc::timed_out(&self.agent));
        // Answered before the stop: a stopped agent may still answer its prompts (`cancelled`, on
        // its stdin's end) while the reader runs, and the client must get the timeout.
        self.rpc.fail_all();
        self.stop();
    }

    /// Answers the clients' requests but prompts that have waited `timeout` for this agent with
    /// `-32603` "agent timed out" ([`Rpc::expire_forwarded`]) and tells the agent they are
    /// cancelled (`$/cancel_request`, not waiting for room in a full input queue). The process
    /// carries on: one unanswered request says nothing of the sessions beside it.
    pub async fn time_out_requests(&self, timeout: Duration) {
        for id in self.rpc.expire_forwarded(timeout) {
            let _ = tokio::time::timeout(Duration::from_millis(100), self.cancel_request(id)).await;
        }
    }

    /// Tells the agent that the request it got under `agent_id` is cancelled
    /// (`$/cancel_request`), waiting for room in its input queue.
    pub async fn cancel_request(&self, agent_id: u64) {
        crate::infra::metrics::message_out(crate::infra::metrics::Peer::Agent, "$/cancel_request", 1);
        let cancel = protocol::notification("$/cancel_request", &format!(r#"{{"requestId":{agent_id}}}"#));
        let _ = self.send_line(cancel).await;
    }

    /// Writes one line (a complete JSON-RPC message) to the agent.
    /// An answer to one of the agent's requests hands the turn back to the agent.
    pub async fn send_line(&self, line: String) -> Result<(), RpcError> {
        self.touch();
        self.answered_ask(&line);
        self.rpc.send_line(line).await
    }

    /// If `line` answers a request the agent is waiting on, it waits no more: its silence from
    /// now on counts again.
    fn answered_ask(&self, line: &str) {
        if lock(&self.asks).is_empty() {
            return;
        }
        if let Ok((msg, Kind::Response)) = Incoming::parse(line)
            && let Some(id) = msg.id
            && lock(&self.asks).remove(id.get())
        {
            self.heard();
        }
    }

    /// What a sign-in running on it is shown (see [`signin_watch`](super::signin_watch)).
    pub fn signin_watch(&self) -> &super::signin_watch::SigninWatch {
        &self.stderr_tail.watch
    }

    /// Sends a request and waits for its answer (at most `timeout`).
    /// With traces on, the request has a span of its own and the agent gets its `traceparent`.
    pub async fn request(&self, method: &str, params: &str, timeout: Duration) -> Result<Box<RawValue>, RpcError> {
        self.touch();
        let answer = if crate::infra::traces::enabled() {
            let span = crate::infra::traces::agent_request(method, &self.agent, self.id, self.pid, None, params);
            let params = crate::infra::traces::with_context(&span, params);
            self.rpc.request(method, &params, timeout).instrument(span).await
        } else {
            self.rpc.request(method, params, timeout).await
        };
        match answer {
            // The process ended before the waiter recorded how (its input closed at once: a
            // sandbox that could not start it): wait briefly for that, so the error says why.
            Err(e) if !self.rpc.gone_known() && e.message == rpc::GONE => {
                let _ = tokio::time::timeout(Duration::from_millis(2000), self.dead.cancelled()).await;
                Err(self.rpc.gone_error())
            }
            answer => answer,
        }
    }

    /// Forwards a client's request without waiting: the answer goes back to the client through
    /// its session (after the session's earlier updates). Returns the id used with the agent
    /// (for `$/cancel_request`). An agent whose input queue is full is not waited on.
    /// With traces on, the request has a span of its own, open until the agent answers, and the
    /// agent gets its `traceparent`.
    pub fn forward(&self, method: &str, params: &str, answer: Pending) -> Result<u64, RpcError> {
        self.touch();
        if crate::infra::traces::enabled() {
            let session = match &answer {
                Pending::Forward { route, .. } => Some(route.session_id()),
                Pending::Internal(_) => None,
            };
            let span = crate::infra::traces::agent_request(method, &self.agent, self.id, self.pid, session, params);
            let params = crate::infra::traces::with_context(&span, params);
            return span.in_scope(|| self.rpc.forward(method, &params, answer));
        }
        self.rpc.forward(method, params, answer)
    }

    /// Sends `session/cancel` for each session whose forwarded prompt still waits for its answer
    /// (the agent then answers it `cancelled`, as ACP asks); returns how many.
    pub async fn cancel_prompts(&self) -> usize {
        let prompting = self.rpc.prompting_sessions();
        if prompting.is_empty() {
            return 0;
        }
        let agent_ids: Vec<Arc<str>> = lock(&self.routes)
            .sessions
            .iter()
            .filter(|(_, route)| prompting.iter().any(|p| p == route.session_id()))
            .map(|(agent_id, _)| agent_id.clone())
            .collect();
        for agent_id in &agent_ids {
            let mut params = String::from(r#"{"sessionId":"#);
            protocol::push_json_str(&mut params, agent_id);
            params.push('}');
            let _ = self.send_line(protocol::notification("session/cancel", &params)).await;
        }
        agent_ids.len()
    }

    /// The sessions (the gateway's ids) whose prompt the agent is answering now.
    pub fn prompting(&self) -> Vec<String> {
        self.rpc.prompting_sessions()
    }

    /// Whether the request sent under `agent_id` is still waiting for the agent's answer.
    pub fn is_pending(&self, agent_id: u64) -> bool {
        self.rpc.is_pending(agent_id)
    }

    /// The error every request gets once the process is gone.
    pub fn gone_error(&self) -> RpcError {
        self.rpc.gone_error()
    }

    /// Records how the process ended: logs its stderr tail under a fresh error id, and keeps the
    /// client-facing error (the id, never the tail).
    fn record_exit(&self, how: &str) {
        let error_id = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
        let tail = self.stderr_tail.lines();
        // A process the gateway stopped (idle, recycled, the readiness probe's, shutdown) ending
        // is routine; one that ended on its own is worth a warning.
        if self.stop_requested.load(Ordering::Acquire) {
            tracing::info!(agent = %self.agent, process = self.id, pid = self.pid, status = %how, error_id = %error_id, stderr_tail = ?tail, "agent process stopped");
        } else {
            tracing::warn!(agent = %self.agent, process = self.id, pid = self.pid, status = %how, error_id = %error_id, stderr_tail = ?tail, "agent process ended");
        }
        // bubblewrap's own complaint (a mount it could not make, a program it could not run)
        // names what to fix, and comes before the agent runs: a process that never wrote to
        // stdout has seen nobody's data, so that one line may go to the client.
        let sandbox = (self.last_heard_ms.load(Ordering::Relaxed) == 0)
            .then(|| tail.iter().rev().find(|l| l.starts_with("bwrap: ")))
            .flatten()
            .map(|l| format!(": {}", l.chars().take(300).collect::<String>()))
            .unwrap_or_default();
        let err = RpcError::internal(format!("agent process exited ({how}){sandbox}; error id {error_id}"))
            .with_data(serde_json::json!({ "agent": &*self.agent, "errorId": error_id }));
        self.rpc.set_gone_error(err);
    }

    /// Called once stdout has closed: fails everything waiting and unbinds every session.
    async fn on_exit(self: &Arc<Self>) {
        self.stop.cancel();
        // Wait (briefly) for the waiter to record how the process ended, for the error text. The
        // waiter itself waits up to 500 ms for the end of stderr after the exit: longer here, so
        // that on a loaded machine the answer still carries bubblewrap's line, not "gone".
        let _ = tokio::time::timeout(Duration::from_millis(2000), self.dead.cancelled()).await;
        self.rpc.fail_all();
        let sessions: Vec<Arc<dyn SessionRoute>> = {
            let mut routes = lock(&self.routes);
            routes.held.clear();
            routes.sessions.drain().map(|(_, s)| s).collect()
        };
        for s in sessions {
            s.unbound(self.id);
        }
    }
}

/// The waiter: reaps the child (stopping its group when asked), then records how it ended and
/// marks the process dead. Holds the process, and its user's process slot, until then.
async fn reap(
    process: Arc<AgentProcess>,
    child: tokio::process::Child,
    guard: child::GroupGuard,
    groups: Arc<GroupRecord>,
    _slot: Option<ProcessSlot>,
) {
    let how = child::wait(child, guard, &groups, &process.stop).await;
    // A grandchild may hold stderr open: wait only briefly for the last lines.
    let _ = tokio::time::timeout(Duration::from_millis(500), process.stderr_ended.cancelled()).await;
    process.record_exit(&how);
    if !process.stop_requested.load(Ordering::Acquire) {
        metrics::counter!(crate::infra::metrics::AGENT_CRASHES, "agent" => process.agent.to_string()).increment(1);
    }
    process.stop.cancel();
    process.dead.cancel();
}

mod early_updates;
mod lines;
mod routing;
#[cfg(test)]
mod tests;
