//! The JSON-RPC peer behind an agent's stdin and stdout, as the gateway (its client) sees it: the
//! ids of the requests sent to it, the requests waiting for an answer ([`Pending`]), the bounded
//! queue of lines for its input and the task that writes them ([`write_lines`]), and the answers.
//!
//! It knows nothing of the process behind it: whatever drains the queue [`Rpc::new`] hands back
//! and feeds the agent's answers to [`Rpc::on_response`] will do (the tests use an in-memory pipe).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::ws::Utf8Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::child::lock;
use super::route::SessionRoute;
use crate::budget::ByteBudget;
use crate::metrics::{AgentTimings, Peer};
use crate::outbox::Outbox;
use crate::protocol::{self, Incoming, RpcError};

/// What a request gets when the agent is gone and how it ended is not known yet.
pub(crate) const GONE: &str = "agent process is gone";

/// Lines queued for one agent's stdin.
const STDIN_QUEUE: usize = 1024;

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

/// The message of every request the agent did not answer in time (the contract's wording); the
/// detail (which request, how long) goes to the log.
pub const TIMED_OUT: &str = "agent timed out";

/// `-32603` "agent timed out", naming the agent in `data`.
pub fn timed_out(agent: &str) -> RpcError {
    RpcError::internal(TIMED_OUT).with_data(serde_json::json!({ "agent": agent }))
}

/// A request sent to the agent and not answered yet.
struct Waiting {
    /// Where its answer goes.
    answer: Pending,
    /// When it was sent, if it is a forwarded `session/prompt` (what `prompt_idle_timeout_secs`
    /// watches).
    prompt_sent: Option<Instant>,
    /// A forwarded request's span (traces on): it ends when the answer comes, or never does.
    _span: tracing::Span,
}

/// One agent as a JSON-RPC peer.
pub(super) struct Rpc {
    /// The configured agent name, for logs and for the error of a peer that is gone.
    agent: Arc<str>,
    /// Lines for the agent's input (bounded in lines).
    stdin: mpsc::Sender<Utf8Bytes>,
    /// ... and in bytes.
    room: ByteBudget,
    /// Next id for requests to the agent; the agent's id space is ours alone.
    next_id: AtomicU64,
    /// Requests sent to the agent and not yet answered.
    pending: Mutex<HashMap<u64, Waiting>>,
    /// What every request gets once the agent has ended: how it ended, and an error id that
    /// matches the log line holding its stderr tail. `None` until then.
    gone: Mutex<Option<RpcError>>,
    /// The agent's prompt and request latency histograms.
    timings: AgentTimings,
}

impl Rpc {
    /// A peer for `agent` whose input queue holds at most `queue_bytes`, and that queue (lines
    /// ending in `\n`) for [`write_lines`] to drain.
    pub fn new(agent: Arc<str>, queue_bytes: usize) -> (Self, Input) {
        let (stdin, rx) = mpsc::channel(STDIN_QUEUE);
        let room = ByteBudget::new(queue_bytes);
        let rpc = Self {
            timings: AgentTimings::new(&agent),
            agent,
            stdin,
            room: room.clone(),
            next_id: AtomicU64::new(0),
            pending: Mutex::new(HashMap::new()),
            gone: Mutex::new(None),
        };
        (rpc, Input { rx, room })
    }

    /// Queues one line (a complete JSON-RPC message) for the agent, waiting for room.
    pub async fn send_line(&self, mut line: String) -> Result<(), RpcError> {
        end_line(&mut line);
        // Room in the queue first, then in the budget: both waits may be cancelled (a timeout)
        // without losing any of either.
        let slot = self.stdin.reserve().await.map_err(|_| self.gone_error())?;
        self.room.take(line.len()).await;
        slot.send(Utf8Bytes::from(line));
        Ok(())
    }

    /// Sends a request and waits for its answer (at most `timeout`).
    pub async fn request(&self, method: &str, params: &str, timeout: Duration) -> Result<Box<RawValue>, RpcError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(
            id,
            Waiting {
                answer: Pending::Internal(tx),
                prompt_sent: None,
                _span: tracing::Span::none(),
            },
        );
        crate::metrics::message_out(Peer::Agent, method, 1);
        let sent = Instant::now();
        // The whole exchange is bounded, waiting for room in a full input queue included.
        let exchange = async {
            self.send_line(protocol::request(id, method, params)).await?;
            rx.await.unwrap_or_else(|_| Err(self.gone_error()))
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(answer) => {
                lock(&self.pending).remove(&id);
                self.timings.request_answered(method, sent);
                answer
            }
            Err(_) => {
                lock(&self.pending).remove(&id);
                tracing::warn!(agent = %self.agent, method, timeout_secs = timeout.as_secs_f64(), "agent did not answer the gateway's request in time");
                Err(timed_out(&self.agent))
            }
        }
    }

    /// Sends a request without waiting, its answer to go where `answer` says. Returns the id used
    /// with the agent (for `$/cancel_request`). An agent whose input queue is full is not waited on.
    /// A `session/prompt` is remembered as one: [`Rpc::oldest_prompt`].
    pub fn forward(&self, method: &str, params: &str, answer: Pending) -> Result<u64, RpcError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        crate::metrics::message_out(Peer::Agent, method, 1);
        let prompt_sent = (method == "session/prompt").then(Instant::now);
        // The caller entered the request's span (`AgentProcess::forward`).
        let _span = if crate::traces::enabled() {
            tracing::Span::current()
        } else {
            tracing::Span::none()
        };
        lock(&self.pending).insert(
            id,
            Waiting {
                answer,
                prompt_sent,
                _span,
            },
        );
        let mut line = protocol::request(id, method, params);
        end_line(&mut line);
        let len = line.len();
        let full = || RpcError::internal("the agent is not reading its input; try again later");
        if !self.room.try_take(len) {
            lock(&self.pending).remove(&id);
            return Err(full());
        }
        if let Err(e) = self.stdin.try_send(Utf8Bytes::from(line)) {
            self.room.give_back([len]);
            lock(&self.pending).remove(&id);
            return Err(match e {
                mpsc::error::TrySendError::Full(_) => full(),
                mpsc::error::TrySendError::Closed(_) => self.gone_error(),
            });
        }
        Ok(id)
    }

    /// Whether the request sent under `agent_id` is still waiting for the agent's answer.
    pub fn is_pending(&self, agent_id: u64) -> bool {
        lock(&self.pending).contains_key(&agent_id)
    }

    /// Whether any request is waiting for the agent's answer.
    pub fn is_waiting(&self) -> bool {
        !lock(&self.pending).is_empty()
    }

    /// When the longest-waiting forwarded `session/prompt` was sent (`None`: no prompt waits).
    pub fn oldest_prompt(&self) -> Option<Instant> {
        lock(&self.pending).values().filter_map(|w| w.prompt_sent).min()
    }

    /// The sessions (the gateway's ids) with a forwarded `session/prompt` waiting for its answer.
    pub fn prompting_sessions(&self) -> Vec<String> {
        lock(&self.pending)
            .values()
            .filter(|w| w.prompt_sent.is_some())
            .filter_map(|w| match &w.answer {
                Pending::Forward { route, .. } => Some(route.session_id().to_string()),
                Pending::Internal(_) => None,
            })
            .collect()
    }

    /// Hands an answer from the agent to whoever waits for it.
    pub fn on_response(&self, msg: &Incoming<'_>) {
        let Some(id) = msg.id.and_then(protocol::own_id) else {
            tracing::warn!(agent = %self.agent, "agent answered an id the gateway never used; ignored");
            return;
        };
        let Some(Waiting {
            answer: pending,
            prompt_sent,
            ..
        }) = lock(&self.pending).remove(&id)
        else {
            tracing::debug!(agent = %self.agent, id, "answer to a request nobody waits for (timed out or cancelled)");
            return;
        };
        if let Some(sent) = prompt_sent {
            self.timings.prompt_answered(sent);
        }
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
                route.respond(&to, &client_id, Utf8Bytes::from(frame));
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

    /// The error every request gets once the agent is gone.
    pub fn gone_error(&self) -> RpcError {
        lock(&self.gone)
            .clone()
            .unwrap_or_else(|| RpcError::internal(GONE).with_data(serde_json::json!({ "agent": &*self.agent })))
    }

    /// Whether how the agent ended is known (see [`Rpc::set_gone_error`]).
    pub fn gone_known(&self) -> bool {
        lock(&self.gone).is_some()
    }

    /// Says how the agent ended: what [`Rpc::gone_error`] returns from now on. The first reason
    /// given wins: a process stopped for its silence ("agent timed out") is then reaped, and
    /// its exit status must not replace why it was stopped.
    pub fn set_gone_error(&self, err: RpcError) {
        lock(&self.gone).get_or_insert(err);
    }

    /// Fails every request still waiting with [`Rpc::gone_error`].
    pub fn fail_all(&self) {
        let err = self.gone_error();
        let pending: Vec<Pending> = lock(&self.pending).drain().map(|(_, w)| w.answer).collect();
        for p in pending {
            match p {
                Pending::Forward {
                    route, to, client_id, ..
                } => {
                    let frame = protocol::error(Some(client_id.get()), &err);
                    route.respond(&to, &client_id, Utf8Bytes::from(frame));
                }
                Pending::Internal(tx) => {
                    let _ = tx.send(Err(err.clone()));
                }
            }
        }
    }
}

/// Turns an agent's raw error object into an [`RpcError`], keeping its code and message.
fn agent_error(error: Option<&RawValue>) -> RpcError {
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

/// The queue of an agent's input lines, as [`write_lines`] drains it.
pub(super) struct Input {
    rx: mpsc::Receiver<Utf8Bytes>,
    room: ByteBudget,
}

/// Drains the queue of [`Rpc::new`] into the agent's input until the queue closes, a write
/// fails, or `stop` fires.
pub(super) async fn write_lines<W: AsyncWrite + Unpin>(input: W, queue: Input, stop: CancellationToken) {
    let Input { mut rx, room } = queue;
    let mut out = BufWriter::with_capacity(64 * 1024, input);
    loop {
        let line = tokio::select! {
            line = rx.recv() => line,
            () = stop.cancelled() => None,
        };
        let Some(line) = line else { break };
        let written = out.write_all(line.as_bytes()).await;
        room.give_back([line.len()]);
        if written.is_err() {
            break;
        }
        // Flush when nothing else is waiting: one syscall per burst, no added latency.
        if rx.is_empty() && out.flush().await.is_err() {
            break;
        }
    }
}

/// Makes `line` exactly one line for the agent: what a client sends is copied into agent lines
/// byte for byte (raw JSON), and JSON allows line breaks between tokens, so a pretty-printed
/// client message would reach the agent as several lines, one of them a message of the client's
/// choosing that no check of the gateway saw. Every part is valid JSON, where a raw CR or LF can
/// only be whitespace (never inside a string), so turning them into spaces keeps the meaning.
fn end_line(line: &mut String) {
    if line.contains(['\n', '\r']) {
        *line = line.replace(['\n', '\r'], " ");
    }
    line.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::AgentProcess;
    use crate::protocol::Kind;
    use tokio::io::{AsyncBufReadExt, BufReader, DuplexStream, Lines};

    /// A peer whose writer feeds an in-memory pipe; the test plays the agent at its other end.
    fn peer() -> (Arc<Rpc>, Lines<BufReader<DuplexStream>>) {
        let (rpc, rx) = Rpc::new(Arc::from("test-agent"), 1 << 20);
        let (ours, theirs) = tokio::io::duplex(4096);
        tokio::spawn(write_lines(ours, rx, CancellationToken::new()));
        (Arc::new(rpc), BufReader::new(theirs).lines())
    }

    /// Reads the next request the agent gets: its id, method and params.
    async fn next_request(agent: &mut Lines<BufReader<DuplexStream>>) -> (u64, String, serde_json::Value) {
        let line = agent.next_line().await.expect("read").expect("a line");
        let v: serde_json::Value = serde_json::from_str(&line).expect("JSON");
        let id = v["id"].as_u64().expect("numeric id");
        (
            id,
            v["method"].as_str().expect("method").to_owned(),
            v["params"].clone(),
        )
    }

    /// The agent's `line`, handed to the peer as the answer it is.
    fn answer(rpc: &Rpc, line: &str) {
        let (msg, kind) = Incoming::parse(line).expect("JSON-RPC");
        assert_eq!(kind, Kind::Response);
        rpc.on_response(&msg);
    }

    /// A session that records the answers routed to it.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<String>>);

    #[async_trait::async_trait]
    impl SessionRoute for Recorder {
        fn session_id(&self) -> &str {
            "s1"
        }
        async fn publish(&self, _: &RawValue, _: Option<&RawValue>) {}
        fn agent_request(self: Arc<Self>, _: &Arc<AgentProcess>, _: Box<RawValue>, _: &str, _: String) {}
        fn respond(&self, _: &Outbox, _: &RawValue, frame: Utf8Bytes) {
            lock(&self.0).push(frame.to_string());
        }
        fn unbound(&self, _: u64) {}
    }

    fn forward_to(route: &Arc<Recorder>, client_id: &str) -> Pending {
        let (to, _) = crate::outbox::outbox(8, 1 << 20);
        Pending::Forward {
            route: route.clone(),
            to,
            client_id: RawValue::from_string(client_id.to_owned()).expect("raw id"),
            _slot: None,
        }
    }

    #[tokio::test]
    async fn a_request_gets_its_answer_or_the_agents_error() {
        let (rpc, mut agent) = peer();
        let asking = tokio::spawn({
            let rpc = rpc.clone();
            async move { rpc.request("initialize", r#"{"v":1}"#, Duration::from_secs(30)).await }
        });
        let (id, method, params) = next_request(&mut agent).await;
        assert_eq!(
            (id, method.as_str(), params),
            (0, "initialize", serde_json::json!({"v": 1}))
        );
        assert!(rpc.is_pending(0) && rpc.is_waiting());
        answer(&rpc, r#"{"jsonrpc":"2.0","id":0,"result":{"ok":true}}"#);
        assert_eq!(asking.await.expect("task").expect("answer").get(), r#"{"ok":true}"#);
        assert!(!rpc.is_waiting());

        let asking = tokio::spawn({
            let rpc = rpc.clone();
            async move { rpc.request("session/new", "{}", Duration::from_secs(30)).await }
        });
        let (id, ..) = next_request(&mut agent).await;
        assert_eq!(id, 1, "ids are never reused");
        answer(
            &rpc,
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"auth required","data":{"m":1}}}"#,
        );
        let err = asking.await.expect("task").expect_err("the agent's error");
        assert_eq!(
            (err.code, &*err.message, err.data.as_deref()),
            (-32000, "auth required", Some(r#"{"m":1}"#))
        );
    }

    #[tokio::test]
    async fn a_request_not_answered_in_time_is_forgotten() {
        let (rpc, mut agent) = peer();
        let err = rpc
            .request("slow", "{}", Duration::from_millis(10))
            .await
            .expect_err("no answer");
        assert_eq!((err.code, &*err.message), (-32603, "agent timed out"));
        assert!(!rpc.is_waiting());
        // A late answer finds nobody waiting and is dropped.
        let (id, ..) = next_request(&mut agent).await;
        answer(&rpc, &format!(r#"{{"jsonrpc":"2.0","id":{id},"result":null}}"#));
    }

    #[tokio::test]
    async fn forwarded_answers_go_to_the_route_under_the_clients_id() {
        let (rpc, mut agent) = peer();
        let route = Arc::new(Recorder::default());
        let first = rpc
            .forward("session/prompt", "{}", forward_to(&route, r#""c-1""#))
            .expect("queued");
        let second = rpc
            .forward("session/set_mode", "{}", forward_to(&route, "7"))
            .expect("queued");
        assert_eq!(next_request(&mut agent).await.0, first);
        assert_eq!(next_request(&mut agent).await.0, second);
        answer(
            &rpc,
            &format!(r#"{{"jsonrpc":"2.0","id":{first},"result":{{"stopReason":"end_turn"}}}}"#),
        );
        answer(
            &rpc,
            &format!(r#"{{"jsonrpc":"2.0","id":{second},"error":{{"code":-32602,"message":"no"}}}}"#),
        );
        let frames: Vec<serde_json::Value> = lock(&route.0)
            .iter()
            .map(|f| serde_json::from_str(f).expect("JSON"))
            .collect();
        assert_eq!(frames[0]["id"], "c-1");
        assert_eq!(frames[0]["result"]["stopReason"], "end_turn");
        assert_eq!(frames[1]["id"], 7);
        assert_eq!(frames[1]["error"]["code"], -32602);
        assert!(!rpc.is_pending(first) && !rpc.is_pending(second));
    }

    #[tokio::test]
    async fn only_forwarded_prompts_are_watched_for_silence() {
        let (rpc, mut agent) = peer();
        let route = Arc::new(Recorder::default());
        rpc.forward("session/set_mode", "{}", forward_to(&route, "1"))
            .expect("queued");
        assert_eq!(rpc.oldest_prompt(), None, "not a prompt");
        let before = Instant::now();
        let prompt = rpc
            .forward("session/prompt", "{}", forward_to(&route, "2"))
            .expect("queued");
        assert!(rpc.oldest_prompt().is_some_and(|t| t >= before));
        let _ = (next_request(&mut agent).await, next_request(&mut agent).await);
        answer(
            &rpc,
            &format!(r#"{{"jsonrpc":"2.0","id":{prompt},"result":{{"stopReason":"end_turn"}}}}"#),
        );
        assert_eq!(rpc.oldest_prompt(), None, "answered");

        // A timed-out peer answers what waits with the contract's words.
        rpc.forward("session/prompt", "{}", forward_to(&route, "3"))
            .expect("queued");
        rpc.set_gone_error(timed_out("test-agent"));
        rpc.fail_all();
        // `fail_all` answers everything still waiting (the set_mode too), in no set order.
        let last: serde_json::Value = lock(&route.0)
            .iter()
            .map(|f| serde_json::from_str::<serde_json::Value>(f).expect("JSON"))
            .find(|f| f["id"] == 3)
            .expect("the prompt was answered");
        assert_eq!(
            (&last["error"]["code"], &last["error"]["message"]),
            (&serde_json::json!(-32603), &serde_json::json!("agent timed out"))
        );
    }

    #[tokio::test]
    async fn a_full_input_queue_refuses_at_once_and_an_ended_peer_fails_everything() {
        // Nobody drains the queue: the agent is not reading.
        let (rpc, rx) = Rpc::new(Arc::from("test-agent"), 1 << 20);
        let route = Arc::new(Recorder::default());
        for _ in 0..STDIN_QUEUE {
            rpc.forward("m", "{}", forward_to(&route, "1")).expect("room");
        }
        let err = rpc.forward("m", "{}", forward_to(&route, "2")).expect_err("queue full");
        assert!(err.message.contains("not reading its input"), "{}", err.message);
        assert!(!rpc.is_pending(STDIN_QUEUE as u64));

        rpc.set_gone_error(RpcError::internal("agent process exited (exit code 3)"));
        rpc.fail_all();
        assert!(!rpc.is_waiting());
        let failed = std::mem::take(&mut *lock(&route.0));
        assert_eq!(failed.len(), STDIN_QUEUE);
        assert!(failed.iter().all(|f| f.contains("exit code 3")));

        drop(rx);
        let err = rpc.request("m", "{}", Duration::from_secs(30)).await.expect_err("gone");
        assert!(err.message.contains("exit code 3"), "{}", err.message);
    }

    #[tokio::test]
    async fn the_input_queue_is_bounded_in_bytes_and_written_lines_give_room_back() {
        let (rpc, input) = Rpc::new(Arc::from("test-agent"), 1000);
        let route = Arc::new(Recorder::default());
        let big = format!(r#"{{"text":"{}"}}"#, "x".repeat(600));
        rpc.forward("m", &big, forward_to(&route, "1")).expect("room");
        let err = rpc
            .forward("m", &big, forward_to(&route, "2"))
            .expect_err("two 660-byte lines are over 1,000 bytes");
        assert!(err.message.contains("not reading its input"), "{}", err.message);
        assert!(!rpc.is_pending(1), "a refused request is not waited for");
        rpc.forward("m", "{}", forward_to(&route, "3"))
            .expect("a small one still fits");
        // Once the agent reads, the bytes come back.
        let (ours, theirs) = tokio::io::duplex(4096);
        tokio::spawn(write_lines(ours, input, CancellationToken::new()));
        let mut agent = BufReader::new(theirs).lines();
        next_request(&mut agent).await;
        next_request(&mut agent).await;
        rpc.forward("m", &big, forward_to(&route, "4")).expect("room again");
    }
}
