//! `GET /api/agents/{agent}/login/terminal?method=ID`: a `terminal` sign-in, over a WebSocket.
//!
//! Authenticated like every `/api` route. The method must be one of the agent's `authMethods`
//! of type `terminal`; an unknown agent, an unknown method and a method of another type are all
//! the same `404`. Agents shared between users are refused (`403`): their processes carry the
//! operator's credentials. One sign-in per user and agent at a time (`409`).
//!
//! On the socket: binary frames are the terminal's bytes, both ways; text frames from the client
//! are control messages, `{"type":"resize","cols":N,"rows":N}` and `{"type":"cancel"}`. The
//! gateway ends with one text frame, `{"type":"exit","code":N}` (with `"signal"` when one ended
//! the program) or `{"type":"error","message":…}`, and closes. The program's whole process group
//! is killed on every way out: exit, cancel, closed socket, time limit
//! (`signin.terminal_timeout_secs`, or the token's expiry if sooner), output limit, shutdown. When
//! the program exits 0, the user's processes of that agent are recycled so that new ones start
//! with the new credentials.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade, close_code};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::{Buf, Bytes};
use serde::Deserialize;
use serde_json::{Value, json};

use super::auth::Caller;
use super::error::refuse;
use crate::agents::pool::AgentPool;
use crate::gateway::Gateway;
use crate::signin::Held;
use crate::signin::terminal::{self, Exit, Terminal, TerminalMethod};

/// Largest frame a client may send (a paste, a control message).
const MAX_INPUT_FRAME: usize = 64 * 1024;
/// Output a sign-in may send in all; past it the program is stopped.
const MAX_OUTPUT_BYTES: u64 = 4 << 20;
/// Read from the terminal at once.
const READ_CHUNK: usize = 16 * 1024;
/// How long learning the agent's `authMethods` may take (it may start a process).
const INFO_TIMEOUT: Duration = Duration::from_secs(30);
/// After the program exits: how long what it wrote last may take to be read.
const DRAIN_WAIT: Duration = Duration::from_secs(2);
/// How long the last frames may take to reach the client.
const FINAL_SEND: Duration = Duration::from_secs(5);
/// The terminal's size until the client says otherwise.
const INITIAL_SIZE: (u64, u64) = (80, 24);
/// `method_type` of this route's sign-ins, for metrics.
const METHOD_TYPE: &str = "terminal";

pub(super) fn router() -> Router<Gateway> {
    Router::new().route("/api/agents/{agent}/login/terminal", get(upgrade))
}

#[derive(Debug, Deserialize)]
struct LoginQuery {
    method: Option<String>,
}

fn not_found() -> Response {
    refuse(StatusCode::NOT_FOUND, "unknown agent or terminal sign-in method")
}

async fn upgrade(
    State(gw): State<Gateway>,
    Caller(who): Caller,
    Path(agent): Path<String>,
    Query(q): Query<LoginQuery>,
    peer: Option<axum::Extension<super::server::Peer>>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let peer = peer.map(|axum::Extension(p)| p);
    if gw.life.is_draining() {
        return refuse(StatusCode::SERVICE_UNAVAILABLE, "gateway is shutting down");
    }
    let (Some(pool), Some(method_id)) = (gw.agents.pools.get(&agent).cloned(), q.method) else {
        return not_found();
    };
    if pool.is_shared() {
        return refuse(
            StatusCode::FORBIDDEN,
            format!(
                "agent {agent:?} is shared between users: its processes carry the operator's credentials, so users cannot sign it in"
            ),
        );
    }
    if let Err(e) = gw.agents.tenancy.admit(&agent, pool.config().sandbox, &who.user) {
        return refuse(StatusCode::FORBIDDEN, e.to_string());
    }
    let user: Arc<str> = Arc::from(who.user.as_str());
    // The methods a process no user shaped offers (never the user's own process: what it says
    // is the user's to change, through its `HOME`), run inside the user's sandbox only.
    let info = match tokio::time::timeout(INFO_TIMEOUT, pool.info()).await {
        Ok(Ok(info)) => info,
        Ok(Err(e)) => return refuse(StatusCode::BAD_GATEWAY, e.message.to_string()),
        Err(_) => return refuse(StatusCode::GATEWAY_TIMEOUT, "timed out starting the agent"),
    };
    let Some(method) = TerminalMethod::find(info.auth_methods.as_ref(), &method_id) else {
        return not_found();
    };
    let ws = match ws {
        Ok(ws) => ws,
        Err(rejection) => return rejection.into_response(),
    };
    let Some(held) = gw.agents.signins.try_hold(&user, &agent) else {
        return refuse(
            StatusCode::CONFLICT,
            format!("a sign-in to agent {agent:?} is already under way for you"),
        );
    };
    let Ok(slot) = gw.life.connection_slots.clone().try_acquire_owned() else {
        return refuse(StatusCode::SERVICE_UNAVAILABLE, "too many connections");
    };
    let tracked = gw.life.tracker.token();
    let expires_at = who.expires_at;
    ws.max_message_size(MAX_INPUT_FRAME)
        .max_frame_size(MAX_INPUT_FRAME)
        .on_failed_upgrade(|e| tracing::info!(error = %e, "WebSocket upgrade failed"))
        .on_upgrade(move |socket| async move {
            let signer = Signer {
                user: &user,
                peer: peer.as_ref(),
                expires_at,
            };
            run(socket, &gw, &signer, &pool, &method, held).await;
            drop(slot);
            drop(tracked);
        })
}

/// Why a sign-in ended.
#[derive(Debug)]
enum Ending {
    /// The program ended by itself.
    Exited(Exit),
    /// The user asked (`{"type":"cancel"}`).
    Cancelled,
    /// The socket closed or failed.
    Closed,
    /// The time limit (or the token's expiry).
    Timeout,
    /// More output than [`MAX_OUTPUT_BYTES`].
    OutputLimit,
    /// The gateway is shutting down.
    Shutdown,
    /// The program could not start, or its terminal failed.
    Failed(String),
}

impl Ending {
    fn outcome(&self) -> &'static str {
        match self {
            Self::Exited(exit) if exit.code == 0 && exit.signal.is_none() => "ok",
            Self::Exited(_) => "failed",
            Self::Cancelled | Self::Closed => "cancelled",
            Self::Timeout => "timeout",
            Self::OutputLimit => "output_limit",
            Self::Shutdown => "shutdown",
            Self::Failed(_) => "error",
        }
    }

    /// The last frame the client gets (none when it is gone).
    fn last_word(&self, limit: Duration) -> Option<Value> {
        let error = |m: String| Some(json!({ "type": "error", "message": m }));
        match self {
            Self::Exited(exit) => Some(match &exit.signal {
                Some(signal) => json!({ "type": "exit", "code": exit.code, "signal": signal }),
                None => json!({ "type": "exit", "code": exit.code }),
            }),
            Self::Cancelled => error("sign-in cancelled".into()),
            Self::Closed => None,
            Self::Timeout => error(format!(
                "the sign-in took longer than {} s and was stopped",
                limit.as_secs()
            )),
            Self::OutputLimit => error(format!(
                "the login program wrote more than {} MiB and was stopped",
                MAX_OUTPUT_BYTES >> 20
            )),
            Self::Shutdown => error("the gateway is shutting down".into()),
            Self::Failed(why) => error(why.clone()),
        }
    }
}

/// Who signs in: the user, where they connect from (for the audit log), and when their token
/// expires (a sign-in never outlives it).
#[derive(Clone, Copy)]
struct Signer<'a> {
    user: &'a Arc<str>,
    peer: Option<&'a super::server::Peer>,
    expires_at: u64,
}

/// One sign-in, from start to the last frame. `held` is given back once the program is gone,
/// before the last frame: a client told it ended may start another at once.
async fn run(
    mut socket: WebSocket,
    gw: &Gateway,
    signer: &Signer<'_>,
    pool: &AgentPool,
    method: &TerminalMethod,
    held: Held,
) {
    let Signer { user, peer, expires_at } = *signer;
    let started = Instant::now();
    let limit = Duration::from_secs(gw.config.signin.terminal_timeout_secs.max(1));
    let until_expiry = Duration::from_secs(expires_at.saturating_sub(crate::infra::clock::now_secs()));
    let deadline = tokio::time::Instant::now() + limit.min(until_expiry);
    let size = terminal::size(INITIAL_SIZE.0, INITIAL_SIZE.1);
    let spawned = Terminal::spawn(&gw.agents.tenancy, pool.config(), method, user, size, &gw.life.tracker);
    let mut pgid = None;
    let ending = match spawned {
        Err(e) => Ending::Failed(format!("cannot start the login program: {e}")),
        Ok(mut terminal) => {
            pgid = Some(terminal.pgid());
            let ending = tokio::select! {
                ending = bridge(&mut socket, &mut terminal) => ending,
                () = tokio::time::sleep_until(deadline) => Ending::Timeout,
                () = gw.life.drain.cancelled() => Ending::Shutdown,
                () = gw.life.shutdown.cancelled() => Ending::Shutdown,
            };
            terminal.kill();
            ending
        }
    };
    drop(held);
    let outcome = ending.outcome();
    let recycled = if outcome == "ok" { pool.recycle_user(user) } else { 0 };
    if outcome == "ok" {
        crate::signin::remember(gw.settings.keys.rows(), user, &pool.name, &method.id).await;
    }
    crate::infra::metrics::signin(&pool.name, METHOD_TYPE, outcome);
    let code = match &ending {
        Ending::Exited(exit) => Some(exit.code),
        _ => None,
    };
    tracing::info!(
        user = %user, agent = %pool.name, method = %method.id, outcome, code, pgid, recycled,
        seconds = started.elapsed().as_secs_f64(), "terminal sign-in ended"
    );
    if let Ending::Failed(why) = &ending {
        tracing::warn!(user = %user, agent = %pool.name, method = %method.id, error = %why, "terminal sign-in failed");
    }
    super::auth::audit(
        &gw.audit,
        peer,
        user,
        "agent_sign_in",
        Some(&pool.name),
        if outcome == "ok" { "ok" } else { "failed" },
        Some(serde_json::json!({ "method": method.id, "methodType": "terminal", "outcome": outcome, "code": code })),
    );
    if let Some(word) = ending.last_word(limit) {
        let _ = tokio::time::timeout(FINAL_SEND, async {
            let _ = socket.send(Message::Text(word.to_string().into())).await;
            let close = CloseFrame {
                code: close_code::NORMAL,
                reason: "".into(),
            };
            let _ = socket.send(Message::Close(Some(close))).await;
        })
        .await;
    }
}

/// Carries bytes both ways until the program ends, the client cancels or goes, or the output
/// limit. Input is taken one frame at a time: the next frame is read only once the terminal
/// has taken the last, so a program that stops reading holds back the client, not the gateway.
async fn bridge(socket: &mut WebSocket, terminal: &mut Terminal) -> Ending {
    let Some(mut exit) = terminal.take_exit() else {
        return Ending::Failed("the login program's exit cannot be awaited".into());
    };
    let mut out = vec![0u8; READ_CHUNK];
    let mut sent = 0u64;
    let mut input = Bytes::new();
    let mut eof = false;
    loop {
        tokio::select! {
            status = &mut exit => {
                let exit = status.unwrap_or(Exit { code: 1, signal: None });
                // What it wrote last is in the terminal still; its group goes first, so that
                // nothing it left behind keeps writing.
                terminal.kill();
                if !eof && let Some(ending) = drain(socket, terminal, &mut out, &mut sent).await {
                    return ending;
                }
                return Ending::Exited(exit);
            }
            read = terminal.read(&mut out), if !eof => match read {
                Ok(0) => eof = true,
                Ok(n) => {
                    if let Some(ending) = send_output(socket, &out[..n], &mut sent).await {
                        return ending;
                    }
                }
                Err(e) => return Ending::Failed(format!("the terminal failed: {e}")),
            },
            took = terminal.write(&input), if !input.is_empty() => match took {
                Ok(n) => input.advance(n),
                // The program closed its terminal: its exit comes next.
                Err(_) => input.clear(),
            },
            msg = socket.recv(), if input.is_empty() => match msg {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return Ending::Closed,
                Some(Ok(Message::Binary(bytes))) => input = bytes,
                Some(Ok(Message::Text(text))) => match control(&text) {
                    Control::Resize(cols, rows) => {
                        if let Err(e) = terminal.resize(terminal::size(cols, rows)) {
                            tracing::debug!(error = %e, "cannot resize a sign-in terminal");
                        }
                    }
                    Control::Cancel => return Ending::Cancelled,
                    Control::Unknown => {}
                },
                Some(Ok(_)) => {}
            },
        }
    }
}

/// Sends what the program wrote last, until its terminal is closed or [`DRAIN_WAIT`] passes.
async fn drain(socket: &mut WebSocket, terminal: &Terminal, out: &mut [u8], sent: &mut u64) -> Option<Ending> {
    let until = tokio::time::Instant::now() + DRAIN_WAIT;
    while let Ok(Ok(n)) = tokio::time::timeout_at(until, terminal.read(out)).await {
        if n == 0 {
            break;
        }
        if let Some(ending) = send_output(socket, &out[..n], sent).await {
            return Some(ending);
        }
    }
    None
}

/// Sends output, counting it against [`MAX_OUTPUT_BYTES`].
async fn send_output(socket: &mut WebSocket, data: &[u8], sent: &mut u64) -> Option<Ending> {
    *sent += data.len() as u64;
    if *sent > MAX_OUTPUT_BYTES {
        return Some(Ending::OutputLimit);
    }
    match socket.send(Message::Binary(Bytes::copy_from_slice(data))).await {
        Ok(()) => None,
        Err(_) => Some(Ending::Closed),
    }
}

/// A client's control message.
#[derive(Debug, PartialEq, Eq)]
enum Control {
    Resize(u64, u64),
    Cancel,
    /// Anything else: ignored (a newer client's message, say).
    Unknown,
}

fn control(text: &str) -> Control {
    let Ok(v) = serde_json::from_str::<Value>(text) else {
        return Control::Unknown;
    };
    match v.get("type").and_then(Value::as_str) {
        Some("cancel") => Control::Cancel,
        Some("resize") => match (
            v.get("cols").and_then(Value::as_u64),
            v.get("rows").and_then(Value::as_u64),
        ) {
            (Some(cols), Some(rows)) => Control::Resize(cols, rows),
            _ => Control::Unknown,
        },
        _ => Control::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_messages() {
        assert_eq!(control(r#"{"type":"cancel"}"#), Control::Cancel);
        assert_eq!(
            control(r#"{"type":"resize","cols":120,"rows":40}"#),
            Control::Resize(120, 40)
        );
        assert_eq!(control(r#"{"type":"resize","cols":-1,"rows":40}"#), Control::Unknown);
        assert_eq!(control("not json"), Control::Unknown);
        assert_eq!(control(r#"{"type":"later"}"#), Control::Unknown);
    }
}
