//! The JSON-RPC peer behind an agent's stdin and stdout, as the gateway (its client) sees it: the
//! ids of the requests sent to it, the requests waiting for an answer ([`Pending`]), the bounded
//! lines for its input ([`input`]: written at once, or queued for [`write_lines`]), and the answers.
//!
//! It knows nothing of the process behind it: whatever pipe [`Rpc::new`] is given, with the
//! queue it hands back drained, and the agent's answers fed to [`Rpc::on_response`], will do (the
//! tests use an in-memory pipe).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::extract::ws::Utf8Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::oneshot;

use super::child::lock;
use super::route::SessionRoute;
use crate::infra::metrics::{AgentTimings, Peer};
use crate::infra::outbox::Outbox;
use crate::protocol::{self, Incoming, RpcError};

/// What a request gets when the agent is gone and how it ended is not known yet.
pub(crate) const GONE: &str = "agent process is gone";

mod input;
#[cfg(test)]
use input::STDIN_QUEUE;
pub(crate) use input::{Input, Stdin, write_lines};

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
    /// When it was sent.
    sent: Instant,
    /// Whether it is a forwarded `session/prompt` (what `prompt_idle_timeout_secs` watches; any
    /// other forwarded request times out after `request_timeout_secs`).
    prompt: bool,
    /// A forwarded request's span (traces on): it ends when the answer comes, or never does.
    _span: tracing::Span,
}

/// One agent as a JSON-RPC peer.
pub(super) struct Rpc {
    /// The configured agent name, for logs and for the error of a peer that is gone.
    agent: Arc<str>,
    /// Lines for the agent's input.
    input: input::Lines,
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
    /// A peer for `agent` writing to `stdin`, whose input queue holds at most `queue_bytes`, and
    /// that queue for [`write_lines`] to drain.
    pub fn new(agent: Arc<str>, stdin: Stdin, queue_bytes: usize) -> (Self, Input) {
        let (lines, queue) = input::input(stdin, queue_bytes);
        let rpc = Self {
            timings: AgentTimings::new(&agent),
            agent,
            input: lines,
            next_id: AtomicU64::new(0),
            pending: Mutex::new(HashMap::new()),
            gone: Mutex::new(None),
        };
        (rpc, queue)
    }

    /// Sends one line (a complete JSON-RPC message) to the agent, waiting for room in its queue.
    pub async fn send_line(&self, mut line: String) -> Result<(), RpcError> {
        end_line(&mut line);
        self.input.send(line).await.map_err(|_| self.gone_error())
    }

    /// Sends a request and waits for its answer (at most `timeout`).
    pub async fn request(&self, method: &str, params: &str, timeout: Duration) -> Result<Box<RawValue>, RpcError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(
            id,
            Waiting {
                answer: Pending::Internal(tx),
                sent: Instant::now(),
                prompt: false,
                _span: tracing::Span::none(),
            },
        );
        crate::infra::metrics::message_out(Peer::Agent, method, 1);
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
        crate::infra::metrics::message_out(Peer::Agent, method, 1);
        let prompt = method == "session/prompt";
        // The caller entered the request's span (`AgentProcess::forward`).
        let _span = if crate::infra::traces::enabled() {
            tracing::Span::current()
        } else {
            tracing::Span::none()
        };
        lock(&self.pending).insert(
            id,
            Waiting {
                answer,
                sent: Instant::now(),
                prompt,
                _span,
            },
        );
        let mut line = protocol::request(id, method, params);
        end_line(&mut line);
        if let Err(refused) = self.input.try_send(line) {
            lock(&self.pending).remove(&id);
            return Err(match refused {
                input::Refused::Full => RpcError::internal("the agent is not reading its input; try again later"),
                input::Refused::Closed => self.gone_error(),
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
        lock(&self.pending).values().filter(|w| w.prompt).map(|w| w.sent).min()
    }

    /// The sessions (the gateway's ids) with a forwarded `session/prompt` waiting for its answer.
    pub fn prompting_sessions(&self) -> Vec<String> {
        lock(&self.pending)
            .values()
            .filter(|w| w.prompt)
            .filter_map(|w| match &w.answer {
                Pending::Forward { route, .. } => Some(route.session_id().to_string()),
                Pending::Internal(_) => None,
            })
            .collect()
    }

    /// Answers every forwarded request but a prompt (`session/set_mode`, `session/set_model`,
    /// `session/set_config_option`, extension methods) that has waited `timeout` for the agent
    /// with `-32603` "agent timed out", through its session like any answer, and forgets it (a
    /// late answer is then dropped). A prompt may run as long as the agent streams
    /// (`prompt_idle_timeout_secs` watches those); the gateway's own requests time out where
    /// they wait ([`Rpc::request`]). Returns the agent's ids of the requests given up on.
    pub fn expire_forwarded(&self, timeout: Duration) -> Vec<u64> {
        let expired: Vec<(u64, Waiting)> = {
            let mut pending = lock(&self.pending);
            let ids: Vec<u64> = pending
                .iter()
                .filter(|(_, w)| {
                    !w.prompt && matches!(w.answer, Pending::Forward { .. }) && w.sent.elapsed() >= timeout
                })
                .map(|(id, _)| *id)
                .collect();
            ids.into_iter()
                .filter_map(|id| pending.remove(&id).map(|w| (id, w)))
                .collect()
        };
        let err = timed_out(&self.agent);
        expired
            .into_iter()
            .map(|(id, waiting)| {
                tracing::warn!(agent = %self.agent, id, waited_secs = waiting.sent.elapsed().as_secs_f64(), "agent did not answer a client's request in request_timeout_secs; answered with a timeout");
                waiting.answer.fail(&err);
                id
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
            sent,
            prompt,
            ..
        }) = lock(&self.pending).remove(&id)
        else {
            tracing::debug!(agent = %self.agent, id, "answer to a request nobody waits for (timed out or cancelled)");
            return;
        };
        if prompt {
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
            p.fail(&err);
        }
    }
}

impl Pending {
    /// Answers with `err`: a client through its session (after the session's updates), the
    /// gateway where it waits.
    fn fail(self, err: &RpcError) {
        match self {
            Pending::Forward {
                route, to, client_id, ..
            } => {
                let frame = protocol::error(Some(client_id.get()), err);
                route.respond(&to, &client_id, Utf8Bytes::from(frame));
            }
            Pending::Internal(tx) => {
                let _ = tx.send(Err(err.clone()));
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
mod tests;
