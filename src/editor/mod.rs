//! `acp-gateway connect`: an ACP agent on stdio for editors (Zed, JetBrains, Neovim, Emacs start
//! agents as local processes), that is the user's sessions on a gateway. One WebSocket to the
//! gateway's `/acp`, re-established with backoff and jitter when it drops; what the editor must
//! not notice of that is [`bridge`]'s job, this module moves the frames.

pub mod bridge;
pub mod login;
mod stdio;
mod token;

use std::time::Duration;

use anyhow::Context;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};

use bridge::{Bridge, Out};

/// Longest line taken from the editor (a prompt with attachments fits).
const MAX_LINE: usize = 16 << 20;
/// Longest pause between two attempts to reconnect.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// How often the connection is pinged, and how long it may stay silent before it is taken for
/// dead (a laptop that slept, a Wi-Fi change: the socket does not say).
const PING_EVERY: Duration = Duration::from_secs(15);
const SILENT_FOR: Duration = Duration::from_secs(45);
/// How long one attempt to connect may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// `acp-gateway connect`'s options.
#[derive(Debug, Clone, clap::Args)]
pub struct ConnectArgs {
    /// The gateway's base URL (`https://host[:port]`).
    #[arg(env = "ACP_GATEWAY_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// The gateway's agent to use (default: its default agent).
    #[arg(long, value_name = "NAME")]
    pub agent: Option<String>,
    /// A token to use instead of the one `acp-gateway login` kept.
    #[arg(long, env = "ACP_GATEWAY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Where sessions work when the editor's folder is not inside your workspace roots on the
    /// gateway (default: your first root).
    #[arg(long, value_name = "PATH")]
    pub cwd: Option<String>,
    /// Offer the editor's file system and terminals to the remote agent (only where the
    /// gateway's workspaces are the editor's files).
    #[arg(long)]
    pub pass_client_capabilities: bool,
    /// How long to keep trying to reconnect before running prompts end with an error.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    pub reconnect_for: u64,
    /// Sign this machine in (as `acp-gateway login URL`) and exit: what an editor's terminal
    /// authentication runs.
    #[arg(long)]
    pub login: bool,
}

/// The id of the `terminal` auth method `connect` offers while it has no token.
const LOGIN_METHOD: &str = "acp-gateway-login";

/// Runs the bridge until the editor closes its stdin.
pub async fn run(args: ConnectArgs) -> anyhow::Result<()> {
    let base = url::Url::parse(&args.url).with_context(|| format!("the gateway URL {:?}", args.url))?;
    if args.login {
        return login::login(&base).await;
    }
    let mut editor_in = FramedRead::new(stdio::input(), LinesCodec::new_with_max_length(MAX_LINE));
    let mut editor_out = stdio::output();
    let mut bridge = Bridge::new(bridge::Options {
        pass_client_capabilities: args.pass_client_capabilities,
        roots: Vec::new(),
        cwd: args.cwd.clone(),
    });
    let mut token = match args.token.clone().or(token::stored(&base)?) {
        Some(token) => token,
        None => match signed_out(&base, &mut editor_in, &mut editor_out, &mut bridge).await? {
            Some(token) => token,
            None => return Ok(()),
        },
    };
    let mut acp = base.join("acp")?;
    match acp.scheme() {
        "https" => acp.set_scheme("wss").ok(),
        _ => acp.set_scheme("ws").ok(),
    };
    if let Some(agent) = &args.agent {
        acp.query_pairs_mut().append_pair("agent", agent);
    }
    match workspace_roots(&base, &token).await {
        Ok(roots) => bridge.set_roots(roots),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read your workspace roots; editors' folders are passed as they are")
        }
    }
    let give_up_after = Duration::from_secs(args.reconnect_for);
    let mut down_since = tokio::time::Instant::now();
    let mut attempt: u32 = 0;
    loop {
        // Connect, reading the editor meanwhile (its frames wait in the bridge).
        let socket = {
            let dial = dial(&acp, &token);
            tokio::pin!(dial);
            loop {
                tokio::select! {
                    socket = &mut dial => break socket,
                    line = editor_in.next() => {
                        let Some(line) = editor_line(line)? else { return Ok(()) };
                        write_editor(&mut editor_out, bridge.from_editor(&line)).await?;
                    }
                }
            }
        };
        let socket = match socket {
            Ok(socket) => socket,
            Err(e) => {
                attempt += 1;
                if refused_token(&e) {
                    // Revoked or expired: nothing waits for a reconnect that cannot come; a new
                    // `acp-gateway login` is picked up on the next attempt.
                    write_editor(&mut editor_out, bridge.give_up_with(-32000, &signed_out_message(&base))).await?;
                    if args.token.is_none()
                        && let Some(kept) = token::stored(&base)?
                    {
                        token = kept;
                    }
                } else if down_since.elapsed() >= give_up_after {
                    write_editor(&mut editor_out, bridge.give_up()).await?;
                }
                let pause = backoff(attempt);
                tracing::warn!(error = %e, retry_in_ms = pause.as_millis() as u64, "cannot reach the gateway");
                let until = tokio::time::Instant::now() + pause;
                loop {
                    tokio::select! {
                        () = tokio::time::sleep_until(until) => break,
                        line = editor_in.next() => {
                            let Some(line) = editor_line(line)? else { return Ok(()) };
                            write_editor(&mut editor_out, bridge.from_editor(&line)).await?;
                        }
                    }
                }
                continue;
            }
        };
        attempt = 0;
        tracing::info!(url = %acp, "connected to the gateway");
        let (mut to_gw, mut from_gw) = socket.split();
        let mut ping = tokio::time::interval(PING_EVERY);
        ping.tick().await;
        let first = bridge.connected();
        let mut ended = send_all(&mut to_gw, &mut editor_out, first).await?;
        while !ended {
            tokio::select! {
                line = editor_in.next() => {
                    let Some(line) = editor_line(line)? else {
                        let _ = to_gw.send(Message::Close(None)).await;
                        return Ok(());
                    };
                    ended = send_all(&mut to_gw, &mut editor_out, bridge.from_editor(&line)).await?;
                }
                frame = tokio::time::timeout(SILENT_FOR, from_gw.next()) => match frame {
                    Ok(Some(Ok(Message::Text(text)))) => {
                        ended = send_all(&mut to_gw, &mut editor_out, bridge.from_gateway(text.as_str())).await?;
                    }
                    Ok(Some(Ok(Message::Close(frame)))) => {
                        tracing::warn!(?frame, "the gateway closed the connection");
                        ended = true;
                    }
                    Ok(Some(Ok(_))) => {}
                    Ok(Some(Err(e))) => {
                        tracing::warn!(error = %e, "the connection to the gateway failed");
                        ended = true;
                    }
                    Ok(None) => ended = true,
                    Err(_) => {
                        tracing::warn!(silent_secs = SILENT_FOR.as_secs(), "the gateway went silent");
                        ended = true;
                    }
                },
                _ = ping.tick() => {
                    ended = to_gw.send(Message::Ping(Vec::new().into())).await.is_err();
                }
            }
        }
        bridge.disconnected();
        down_since = tokio::time::Instant::now();
    }
}

/// Without a token: `initialize` is answered here, offering a `terminal` auth method that runs
/// `acp-gateway connect URL --login` (editors show a Log in button); any other request finds the
/// token `login` kept, or is refused with `-32000` (authentication required). The token, once
/// there; `None` when the editor quit first.
async fn signed_out(
    base: &url::Url,
    editor_in: &mut FramedRead<stdio::Reader, LinesCodec>,
    editor_out: &mut stdio::Writer,
    bridge: &mut Bridge,
) -> anyhow::Result<Option<String>> {
    use serde_json::{Value, json};
    loop {
        let Some(line) = editor_line(editor_in.next().await)? else {
            return Ok(None);
        };
        let msg: Value = serde_json::from_str(&line).unwrap_or_default();
        let id = msg.get("id").cloned();
        let method = msg.get("method").and_then(Value::as_str).unwrap_or_default();
        if method == "initialize"
            && let Some(id) = &id
        {
            bridge.set_init(&msg["params"]);
            let answer = json!({"jsonrpc": "2.0", "id": id, "result": {
                "protocolVersion": 1,
                "agentCapabilities": {"loadSession": true},
                "authMethods": [{
                    "type": "terminal",
                    "id": LOGIN_METHOD,
                    "name": format!("Log in to {base}"),
                    "description": "Opens a sign-in code to approve in your browser (acp-gateway login).",
                    "args": ["--login"],
                }],
                "agentInfo": {"name": "acp-gateway connect", "version": env!("CARGO_PKG_VERSION")},
            }});
            write_line(editor_out, &answer.to_string()).await?;
            continue;
        }
        if let Some(token) = token::stored(base)? {
            if method == "authenticate"
                && let Some(id) = &id
            {
                write_line(
                    editor_out,
                    &json!({"jsonrpc": "2.0", "id": id, "result": {}}).to_string(),
                )
                .await?;
            } else {
                // Goes to the gateway once connected.
                write_editor(editor_out, bridge.from_editor(&line)).await?;
            }
            return Ok(Some(token));
        }
        if let Some(id) = id
            && !method.is_empty()
        {
            let refused = json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32000,
                "message": format!("Authentication required: sign in with `acp-gateway login {base}` (or the editor's Log in)")}});
            // (`-32000` is ACP's "authentication required".)
            write_line(editor_out, &refused.to_string()).await?;
        }
    }
}

/// Whether the gateway refused the token (`401` before the upgrade).
fn refused_token(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<tokio_tungstenite::tungstenite::Error>(),
        Some(tokio_tungstenite::tungstenite::Error::Http(r)) if r.status() == 401
    )
}

fn signed_out_message(base: &url::Url) -> String {
    format!(
        "the gateway refused this machine's token (revoked or expired): sign in again with `acp-gateway login {base}` (or the editor's Log in)"
    )
}

/// Writes the editor's frames (in one write); sends the gateway's (one flush). `true` when the
/// gateway's side failed.
async fn send_all<S>(to_gw: &mut S, editor: &mut stdio::Writer, outs: Vec<Out>) -> anyhow::Result<bool>
where
    S: futures_util::Sink<Message> + Unpin,
{
    let (mut failed, mut fed) = (false, false);
    for out in &outs {
        if let Out::Gateway(frame) = out
            && !failed
        {
            failed = to_gw.feed(Message::Text(frame.as_str().into())).await.is_err();
            fed = true;
        }
    }
    if fed && !failed {
        failed = to_gw.flush().await.is_err();
    }
    write_editor(editor, outs).await?;
    Ok(failed)
}

async fn write_editor(editor: &mut stdio::Writer, outs: Vec<Out>) -> anyhow::Result<()> {
    let frames = outs.iter().filter_map(|o| match o {
        Out::Editor(frame) => Some(frame.as_str()),
        Out::Gateway(_) => None,
    });
    stdio::write_lines(editor, frames)
        .await
        .context("writing to the editor")
}

async fn write_line(editor: &mut stdio::Writer, frame: &str) -> anyhow::Result<()> {
    stdio::write_lines(editor, [frame])
        .await
        .context("writing to the editor")
}

/// A line from the editor; `None` when it closed stdin (the editor quit).
fn editor_line(line: Option<Result<String, LinesCodecError>>) -> anyhow::Result<Option<String>> {
    match line {
        None => Ok(None),
        Some(Ok(line)) => Ok(Some(line)),
        Some(Err(LinesCodecError::MaxLineLengthExceeded)) => {
            anyhow::bail!("a line from the editor is over {MAX_LINE} bytes")
        }
        Some(Err(e)) => Err(e).context("reading from the editor"),
    }
}

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn dial(url: &url::Url, token: &str) -> anyhow::Result<Socket> {
    let mut request = url.as_str().into_client_request()?;
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {token}").parse()?);
    let (socket, _) = tokio::time::timeout(DIAL_TIMEOUT, tokio_tungstenite::connect_async(request))
        .await
        .with_context(|| format!("connecting to {url} took over {} s", DIAL_TIMEOUT.as_secs()))??;
    Ok(socket)
}

/// The pause before attempt `n`: doubling from 250 ms to [`MAX_BACKOFF`], with jitter (half to
/// all of it), so a restarted gateway is not met by every client at once.
fn backoff(n: u32) -> Duration {
    let full = Duration::from_millis(250)
        .saturating_mul(1 << n.min(6).saturating_sub(1))
        .min(MAX_BACKOFF);
    full.mul_f64(rand::random_range(0.5..=1.0))
}

/// The user's workspace roots on the gateway.
async fn workspace_roots(base: &url::Url, token: &str) -> anyhow::Result<Vec<String>> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Me {
        workspace_roots: Vec<String>,
    }
    let me: Me = reqwest::Client::new()
        .get(base.join("api/me")?)
        .bearer_auth(token)
        .timeout(DIAL_TIMEOUT)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    Ok(me.workspace_roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_with_jitter() {
        for n in 1..20 {
            let pause = backoff(n);
            let full = Duration::from_millis(250 << (n.min(6) - 1)).min(MAX_BACKOFF);
            assert!(pause >= full / 2 && pause <= full, "attempt {n}: {pause:?} of {full:?}");
        }
    }
}
