//! What an agent process writes on stdout: each line read (to the end, even after the process is
//! gone), parsed once (a `session/update`, the hot path of a streaming agent, in one pass), and
//! routed: an answer to whoever waits, an update to its session (or held while it has none), a
//! request to the session's clients.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use super::super::child::{AgentLines, Line, lock};
use super::super::route::SessionRoute;
use super::{AgentProcess, Destination};
use crate::protocol::{self, Incoming, Kind, RpcError, codes};

/// Most of one process's requests (permissions, questions, `fs/*`) that may wait for a client at
/// once; past it the agent is answered `-32603` at once.
pub(super) const MAX_OPEN_ASKS: usize = 256;

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
    starts_like_update(line.as_bytes())
}

/// [`looks_like_update`] for the start of a line (the head of what is read and not yet handled).
fn starts_like_update(line: &[u8]) -> bool {
    const NEEDLE: &[u8] = b"\"session/update\"";
    let head = &line[..line.len().min(96)];
    head.windows(NEEDLE.len()).any(|w| w == NEEDLE)
}

/// The line as a `session/update` notification, if it is one in the form agents write it
/// (`method` near the start); `None` leaves it to the general parse.
fn parse_update(line: &str) -> Option<UpdateLine<'_>> {
    if !looks_like_update(line) {
        return None;
    }
    let u = serde_json::from_str::<UpdateLine<'_>>(line).ok()?;
    (u.method == crate::protocol::method::agent::SESSION_UPDATE && u.id.is_none()).then_some(u)
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
    /// Routes lines the agent wrote at once (each parsed once, as [`Self::on_line`] would), the
    /// updates of one session in a row together; `more`: another update, read already, follows.
    async fn on_burst(self: &Arc<Self>, lines: &[String], more: bool) {
        self.heard();
        let mut run: Vec<(&RawValue, Option<&RawValue>)> = Vec::with_capacity(lines.len());
        let mut run_session: Option<std::borrow::Cow<'_, str>> = None;
        for (line, follows) in with_follows(lines, more) {
            let parsed = parse_update(line);
            // The run ends where another session's update follows it, or a line that is not an
            // update (which the stage does not wait for).
            if let Some(session) = run_session.take_if(|s| parsed.as_ref().is_none_or(|u| *s != u.params.session_id)) {
                self.route_run(&session, &run, parsed.is_some()).await;
                run.clear();
            }
            match parsed {
                Some(u) => {
                    run_session.get_or_insert(u.params.session_id);
                    run.push((u.params.update, u.params.meta));
                }
                None => MORE_LINES.scope(follows, self.on_line(line)).await,
            }
        }
        if let Some(session) = run_session {
            self.route_run(&session, &run, more).await;
        }
    }

    /// Hands a run of one session's updates on together when the session is bound (a
    /// streaming session's every burst); otherwise routes each as [`Self::route_update`] does.
    async fn route_run(&self, agent_session_id: &str, run: &[(&RawValue, Option<&RawValue>)], more: bool) {
        crate::infra::metrics::messages_in(
            crate::infra::metrics::Peer::Agent,
            crate::protocol::method::agent::SESSION_UPDATE,
            run.len() as u64,
        );
        match self.bound_session(agent_session_id) {
            Some(session) => {
                self.handing_on.store(true, Ordering::Release);
                session.publish_burst(run, more).await;
                self.heard();
                self.handing_on.store(false, Ordering::Release);
            }
            None => {
                for ((update, meta), follows) in with_follows(run, more) {
                    MORE_LINES
                        .scope(follows, self.route_update(agent_session_id, update, *meta))
                        .await;
                }
            }
        }
    }

    /// Routes one stdout line.
    async fn on_line(self: &Arc<Self>, line: &str) {
        self.heard();
        if let Some(u) = parse_update(line) {
            crate::infra::metrics::message_in(
                crate::infra::metrics::Peer::Agent,
                crate::protocol::method::agent::SESSION_UPDATE,
            );
            self.route_update(&u.params.session_id, u.params.update, u.params.meta)
                .await;
            return;
        }
        let (msg, kind) = match Incoming::parse(line) {
            Ok(parsed) => parsed,
            Err(e) => {
                tracing::warn!(agent = %self.agent, process = self.id, error = ?e, "agent wrote a line that is not JSON-RPC; ignored");
                return;
            }
        };
        if kind != Kind::Response {
            crate::infra::metrics::message_in(crate::infra::metrics::Peer::Agent, msg.method());
        }
        match kind {
            Kind::Response => self.rpc.on_response(&msg),
            Kind::Notification if msg.method() == crate::protocol::method::agent::SESSION_UPDATE => {
                let Some(params) = msg
                    .params
                    .and_then(|p| serde_json::from_str::<UpdateParams<'_>>(p.get()).ok())
                else {
                    tracing::warn!(agent = %self.agent, "malformed session/update from agent; ignored");
                    return;
                };
                self.route_update(&params.session_id, params.update, params.meta).await;
            }
            Kind::Notification if msg.method() == "$/cancel_request" => {
                // The agent no longer waits for that answer.
                #[derive(Deserialize)]
                struct Cancel<'a> {
                    #[serde(rename = "requestId", borrow)]
                    request_id: &'a RawValue,
                }
                if let Some(c) = msg
                    .params
                    .and_then(|p| serde_json::from_str::<Cancel<'_>>(p.get()).ok())
                {
                    lock(&self.asks).remove(c.request_id.get());
                }
            }
            Kind::Notification => {
                // Nothing else uses it; a sign-in running on the process may (a device code).
                self.stderr_tail.watch.notification(msg.method(), msg.params);
                tracing::debug!(agent = %self.agent, method = msg.method(), "agent notification not routed")
            }
            Kind::Request => self.on_agent_request(&msg).await,
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
        // Each waits (up to `permission_wait_secs`) with its parameters in memory: an agent that
        // asks without end is answered at once past the cap, instead of holding the gateway's.
        let full = {
            let mut asks = lock(&self.asks);
            let full = asks.len() >= MAX_OPEN_ASKS;
            if !full {
                asks.insert(Box::from(id.get()));
            }
            full
        };
        if full {
            tracing::warn!(agent = %self.agent, process = self.id, method = msg.method(), "agent request refused: too many wait for a client");
            let err = RpcError::new(
                codes::INTERNAL_ERROR,
                format!("{MAX_OPEN_ASKS} of your requests already wait for a client: answer or cancel some first"),
            );
            let _ = self.send_line(protocol::error(Some(id.get()), &err)).await;
            return;
        }
        session.agent_request(self, id.to_owned(), msg.method(), params);
    }

    /// Hands an update to its session, or holds it while it has none (see [`early`](super::super::early)).
    async fn route_update(&self, agent_session_id: &str, update: &RawValue, meta: Option<&RawValue>) {
        loop {
            match self.destination(agent_session_id, update, meta) {
                Destination::Session(session) => return self.hand_on(&session, update, meta).await,
                Destination::Held => return,
                Destination::Wait => {
                    // A new session hands on what was held for it, under this lock: this
                    // update follows those. The wait is the store's pace, not the agent's.
                    self.handing_on.store(true, Ordering::Release);
                    drop(self.handing_early.lock().await);
                    self.handing_on.store(false, Ordering::Release);
                }
                Destination::Room => {
                    // Until a session being created takes what is held for it, or is given
                    // up: the store's pace too (a claim ends once its session is stored,
                    // bound, answered and handed on, none of which needs this reader).
                    self.handing_on.store(true, Ordering::Release);
                    self.claim_room.notified().await;
                    self.handing_on.store(false, Ordering::Release);
                }
            }
        }
    }

    /// Hands an update to its session; the agent is not silent while that waits.
    async fn hand_on(&self, session: &Arc<dyn SessionRoute>, update: &RawValue, meta: Option<&RawValue>) {
        self.handing_on.store(true, Ordering::Release);
        session.publish(update, meta).await;
        self.heard();
        self.handing_on.store(false, Ordering::Release);
    }
}

tokio::task_local! {
    /// While an agent's line is handled: whether the next line, already read, is an update too.
    static MORE_LINES: bool;
}

/// Whether the agent line being handled on this task has another update right behind it,
/// already read (a burst the agent wrote at once); `false` off the agent's reader.
pub fn more_lines_follow() -> bool {
    MORE_LINES.try_with(|more| *more).unwrap_or(false)
}

/// Each of `items` (lines or updates of a burst, in order) with whether another update, already
/// read, follows it: every one but the last does, and the last when `more`.
pub fn with_follows<T>(items: &[T], more: bool) -> impl Iterator<Item = (&T, bool)> {
    let last = items.len().saturating_sub(1);
    items.iter().enumerate().map(move |(i, item)| (item, more || i < last))
}

/// Runs `handle` (of one agent line) as one whose next update, already read, follows when `more`.
pub async fn with_more_lines<F: std::future::Future>(more: bool, handle: F) -> F::Output {
    MORE_LINES.scope(more, handle).await
}

/// Most lines of a burst handed on together.
const BURST_LINES: usize = 64;

/// Whether what is read and not yet handled starts with a whole update line (taken from the
/// buffer without reading: the next line of a burst).
fn whole_update_buffered(buffered: &[u8]) -> bool {
    starts_like_update(buffered) && buffered.contains(&b'\n')
}

/// What reading the agent's stdout gives next (`None`: its end).
type Next = Option<Result<Line, std::io::Error>>;

pub(super) async fn read_stdout(
    process: Weak<AgentProcess>,
    mut lines: FramedRead<tokio::process::ChildStdout, AgentLines>,
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
    // An item read with a burst that is not one of its lines: handled next.
    let mut after_burst: Option<Next> = None;
    let mut burst: Vec<String> = Vec::new();
    loop {
        let next = match after_burst.take() {
            Some(next) => next,
            None => tokio::select! {
                next = lines.next() => next,
                () = &mut give_up => None,
            },
        };
        let Some(process) = process.upgrade() else {
            return;
        };
        match next {
            Some(Ok(Line::Text(line))) if whole_update_buffered(lines.read_buffer()) && looks_like_update(&line) => {
                // A burst the agent wrote at once: its lines already read are handed on
                // together (one numbering, one hand-off per session, not one per line).
                burst.push(line);
                while burst.len() < BURST_LINES && whole_update_buffered(lines.read_buffer()) {
                    match lines.next().now_or_never() {
                        Some(Some(Ok(Line::Text(line)))) => burst.push(line),
                        Some(other) => {
                            after_burst = Some(other);
                            break;
                        }
                        None => break,
                    }
                }
                let more = after_burst.is_none() && starts_like_update(lines.read_buffer());
                process.on_burst(&burst, more).await;
                burst.clear();
            }
            Some(Ok(Line::Text(line))) => {
                let more = starts_like_update(lines.read_buffer());
                MORE_LINES.scope(more, process.on_line(&line)).await;
            }
            Some(Ok(Line::TooLong)) => {
                tracing::warn!(agent = %process.agent, process = process.id, "agent wrote a line over the cap; skipped");
            }
            Some(Ok(Line::NotUtf8)) => {
                tracing::warn!(agent = %process.agent, process = process.id, "agent wrote a line that is not UTF-8; skipped");
            }
            Some(Err(e)) => {
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
