//! `acp-gateway connect`: an ACP agent on stdio for editors (Zed, JetBrains, Neovim, Emacs start
//! agents as local processes), that is the user's sessions on a gateway. One WebSocket to the
//! gateway's `/acp`, re-established with backoff and jitter when it drops; what the editor must
//! not notice of that is [`bridge`]'s job, this module moves the frames.

pub mod bridge;
mod token;

use std::time::Duration;

use anyhow::Context;
use futures_util::{SinkExt, StreamExt};
use tokio::io::AsyncWriteExt;
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
}

/// Runs the bridge until the editor closes its stdin.
pub async fn run(args: ConnectArgs) -> anyhow::Result<()> {
    let base = url::Url::parse(&args.url).with_context(|| format!("the gateway URL {:?}", args.url))?;
    let token = match &args.token {
        Some(t) => t.clone(),
        None => token::stored(&base)?.with_context(|| {
            format!("no token for {base}: run `acp-gateway login {base}`, or pass --token (ACP_GATEWAY_TOKEN)")
        })?,
    };
    let mut acp = base.join("acp")?;
    match acp.scheme() {
        "https" => acp.set_scheme("wss").ok(),
        _ => acp.set_scheme("ws").ok(),
    };
    if let Some(agent) = &args.agent {
        acp.query_pairs_mut().append_pair("agent", agent);
    }
    let roots = workspace_roots(&base, &token).await.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot read your workspace roots; editors' folders are passed as they are");
        Vec::new()
    });
    let mut bridge = Bridge::new(bridge::Options {
        pass_client_capabilities: args.pass_client_capabilities,
        roots,
        cwd: args.cwd.clone(),
    });
    let mut editor_in = FramedRead::new(tokio::io::stdin(), LinesCodec::new_with_max_length(MAX_LINE));
    let mut editor_out = tokio::io::stdout();
    let give_up_after = Duration::from_secs(args.reconnect_for);
    let mut down_since = tokio::time::Instant::now();
    let mut attempt: u32 = 0;
    loop {
        // Connect, reading the editor meanwhile (its frames wait in the bridge).
        let dial = dial(&acp, &token);
        tokio::pin!(dial);
        let socket = loop {
            tokio::select! {
                socket = &mut dial => break socket,
                line = editor_in.next() => {
                    let Some(line) = editor_line(line)? else { return Ok(()) };
                    write_editor(&mut editor_out, bridge.from_editor(&line)).await?;
                }
            }
        };
        let socket = match socket {
            Ok(socket) => socket,
            Err(e) => {
                attempt += 1;
                if down_since.elapsed() >= give_up_after {
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

/// Writes the editor's frames; sends the gateway's. `true` when the gateway's side failed.
async fn send_all<S>(to_gw: &mut S, editor: &mut tokio::io::Stdout, outs: Vec<Out>) -> anyhow::Result<bool>
where
    S: futures_util::Sink<Message> + Unpin,
{
    let mut failed = false;
    for out in outs {
        match out {
            Out::Editor(frame) => write_line(editor, &frame).await?,
            Out::Gateway(frame) if !failed => failed = to_gw.send(Message::Text(frame.into())).await.is_err(),
            Out::Gateway(_) => {}
        }
    }
    Ok(failed)
}

async fn write_editor(editor: &mut tokio::io::Stdout, outs: Vec<Out>) -> anyhow::Result<()> {
    for out in outs {
        if let Out::Editor(frame) = out {
            write_line(editor, &frame).await?;
        }
    }
    Ok(())
}

async fn write_line(editor: &mut tokio::io::Stdout, frame: &str) -> anyhow::Result<()> {
    editor.write_all(frame.as_bytes()).await?;
    editor.write_all(b"\n").await?;
    editor.flush().await.context("writing to the editor")
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
