//! Section 5 (`cargo bench --bench gateway --features bench-peers`): the official ACP rust-sdk's
//! WebSocket server (`agent-client-protocol-http`, `AcpHttpServer` in front of `AcpAgent`, the
//! SDK's own stdio agent connection) fronting the same demo agent, one agent process per
//! connection as websocketd runs it. It stores nothing. Its server runs on a runtime of its own
//! (as if it were its own process), like the gateway's.
//!
//! It is served with `TCP_NODELAY` on its sockets, as the gateway serves its own: served as the
//! SDK's documentation shows (`axum::serve` on a plain `TcpListener`), Nagle's algorithm stays on
//! and every round trip takes about 44 ms here (each small frame after the first waits for the
//! client's delayed ACK), which would measure the socket option, not the SDK.
//!
//! Only prompt round trips are measured, fewer of them (`BENCH_SDK_PROMPTS`, default 200), taking
//! turns with the gateway and direct stdio in blocks of 10; the table gives the gateway's figures
//! from the same blocks.

use std::fmt::Write as _;
use std::net::SocketAddr;

use agent_client_protocol::AcpAgent;
use agent_client_protocol_http::AcpHttpServer;
use anyhow::{Context, Result};
use axum::serve::ListenerExt as _;

use super::{AGENT_EXTRAS, Path, env_u64, take_turns};
use crate::stats::{median, stats};
use crate::transport::{AgentPipe, WsClient, agent_args, gateway_bin};

/// Prompts per block.
const BLOCK: u64 = 10;

/// The SDK's server on loopback, on its own runtime.
struct RustSdk {
    rt: Option<tokio::runtime::Runtime>,
    addr: SocketAddr,
}

impl RustSdk {
    fn start() -> Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(std::thread::available_parallelism().map_or(2, |n| n.get()))
            .enable_all()
            .thread_name("sdk-worker")
            .build()?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let mut command = vec![gateway_bin().to_string()];
        command.extend(agent_args());
        AcpAgent::from_args(command.clone()).context("the demo agent's command for the rust-sdk server")?;
        rt.spawn(async move {
            let app =
                AcpHttpServer::new(move || AcpAgent::from_args(command.clone()).expect("checked above")).into_router();
            match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => {
                    let listener = listener.tap_io(|tcp| {
                        let _ = tcp.set_nodelay(true);
                    });
                    if let Err(e) = axum::serve(listener, app).await {
                        eprintln!("rust-sdk server: {e}");
                    }
                }
                Err(e) => eprintln!("rust-sdk server: {e}"),
            }
        });
        Ok(Self { rt: Some(rt), addr })
    }
}

impl Drop for RustSdk {
    fn drop(&mut self) {
        // Dropped on the benchmark client's runtime, where a runtime may not block.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// Section 5: prompt round trips through the rust-sdk server, taking turns in blocks with
/// direct stdio and the gateway.
pub(super) async fn section(
    direct: &mut Path<AgentPipe>,
    via: &mut Path<WsClient>,
    backend: &str,
    md: &mut String,
) -> Result<()> {
    let sdk = RustSdk::start()?;
    let mut path = Path::new(
        "rust-sdk",
        crate::Peer::Ws(
            WsClient::connect(sdk.addr, "/acp", None)
                .await
                .context("connecting to the rust-sdk server")?,
        ),
        AGENT_EXTRAS,
    )
    .await
    .context("initialize and session/new through the rust-sdk server")?;
    let total = env_u64("BENCH_SDK_PROMPTS", 200).max(BLOCK);
    path.prompts(BLOCK, false).await?;
    let marks = (direct.samples.len(), via.samples.len());
    let (mut gw_diffs, mut sdk_diffs) = (Vec::new(), vec![Vec::new()]);
    take_turns(
        direct,
        via,
        &mut [&mut path],
        (total, BLOCK),
        &mut 0,
        (&mut gw_diffs, &mut sdk_diffs),
    )
    .await?;
    let sdk_added = sdk_diffs.pop().map(median).unwrap_or_default();
    let gw_added = median(gw_diffs);
    let d = stats(&direct.samples[marks.0..]);
    let g = stats(&via.samples[marks.1..]);
    let s = stats(&path.samples);
    println!();
    println!(
        "== 5. prompt round trip beside the official ACP rust-sdk WebSocket server (agent-client-protocol-http), µs =="
    );
    println!(
        "{:<10} {:>7} {:>9} {:>9} {:>9} {:>9} {:>12}",
        "path", "n", "min", "p50", "p99", "mean", "added p50"
    );
    for (name, st, added) in [
        ("direct", &d, 0.0),
        ("gateway", &g, gw_added),
        ("rust-sdk", &s, sdk_added),
    ] {
        println!(
            "{:<10} {:>7} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>12.1}",
            name, st.n, st.min, st.p50, st.p99, st.mean, added
        );
    }
    println!(
        "(blocks of {BLOCK}; the gateway's figures here are from these blocks; rust-sdk's round trip / gateway's: {:.1}x at p50)",
        s.p50 / g.p50
    );
    let _ = writeln!(
        md,
        "| {backend} | beside the rust-sdk WebSocket server (section 5): round trip p50 / p99, µs | {:.0} / {:.0} | – | {:.0} / {:.0} | rust-sdk: {:.0} / {:.0} |",
        d.p50, d.p99, g.p50, g.p99, s.p50, s.p99
    );
    drop(path);
    drop(sdk);
    Ok(())
}
