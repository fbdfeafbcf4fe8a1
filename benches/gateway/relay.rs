//! The least a WebSocket-to-stdio bridge can do in Rust, as a column of section 1: one agent
//! process per connection, a text frame in is a line out and a line in is a text frame out, no
//! parsing, no storage, no authentication, the agent unsandboxed. tokio and tokio-tungstenite
//! with `TCP_NODELAY`, as the gateway serves; it runs on a runtime of its own with one worker per
//! core, as the gateway's does, so the two pay the same thread hops. What the gateway adds over
//! this row is what its features (identity, sessions, the sandbox, storing every update before
//! it is visible) cost on the round trip.

use std::net::SocketAddr;

use anyhow::{Context, Result};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;

use crate::transport::spawn_agent;

/// The relay, listening on loopback, on its own runtime.
pub struct Relay {
    rt: Option<tokio::runtime::Runtime>,
    pub addr: SocketAddr,
}

impl Relay {
    pub fn start() -> Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(std::thread::available_parallelism().map_or(2, |n| n.get()))
            .enable_all()
            .thread_name("relay-worker")
            .build()?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        rt.spawn(async move {
            let listener = match TcpListener::from_std(listener) {
                Ok(l) => l,
                Err(e) => return eprintln!("relay: {e}"),
            };
            while let Ok((tcp, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Err(e) = bridge(tcp).await {
                        eprintln!("relay: {e:#}");
                    }
                });
            }
        });
        Ok(Self { rt: Some(rt), addr })
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // Dropped on the benchmark client's runtime, where a runtime may not block.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// One connection: its own agent process, frames to lines on one task, lines to frames on another.
async fn bridge(tcp: TcpStream) -> Result<()> {
    tcp.set_nodelay(true)?;
    let ws = tokio_tungstenite::accept_async(tcp).await.context("handshake")?;
    let mut child = spawn_agent()?;
    let mut stdin = child.stdin.take().context("stdin")?;
    let mut stdout = BufReader::new(child.stdout.take().context("stdout")?).lines();
    let (mut tx, mut rx) = ws.split();
    let down = tokio::spawn(async move {
        while let Ok(Some(line)) = stdout.next_line().await {
            if tx.send(Message::text(line)).await.is_err() {
                break;
            }
        }
    });
    while let Some(Ok(msg)) = rx.next().await {
        if let Message::Text(text) = msg {
            let mut line = Vec::with_capacity(text.len() + 1);
            line.extend_from_slice(text.as_bytes());
            line.push(b'\n');
            stdin.write_all(&line).await?;
        }
    }
    down.abort();
    Ok(())
}
