//! Gateway overhead benchmark: the same workload against the demo agent's stdio directly,
//! through an in-process gateway (WebSocket, JWT, every update stored before a client sees it),
//! and through websocketd in front of the same agent (it stores nothing), side by side in one run.
//!
//! Run: `cargo bench --bench gateway` (SQLite), with `DATABASE_URL=postgres://…` for Postgres;
//! `scripts/bench.sh` runs both and writes `docs/benchmarks.md`. Knobs (environment):
//! - `BENCH_ROUNDS` (default 5) and `BENCH_PROMPTS` (default 400): latency rounds, the paths
//!   alternating in blocks of `BENCH_BLOCK` (default 20) sequential prompts each;
//! - `BENCH_WARMUP` (default 200): untimed prompts each way first;
//! - `BENCH_UPDATES` (default 200000): updates streamed by the throughput prompt;
//! - `BENCH_THROUGHPUT_RUNS` (default 3): throughput runs each way (alternating);
//! - `BENCH_EIGHT_UPDATES` (default 50000): updates per connection when eight stream at once;
//! - `BENCH_GW_THREADS` (default: one per core, like `#[tokio::main]`): the gateway's workers;
//! - `BENCH_ONLY=latency` or `BENCH_ONLY=throughput`: run one part (for profiling; the
//!   throughput part ends with section 6, a stuck tab's cost to other tabs, `gateway/stuck.rs`);
//!   `BENCH_ONLY=stream`: sections 2 and 3 alone (one connection streaming);
//! - `BENCH_LIFT_QUEUE=1`: client queues large enough never to fall behind (default limits
//!   otherwise); `BENCH_SANDBOX=none|bwrap|auto`: the agent's sandbox in the gateway;
//! - `BENCH_MARKDOWN=path`: also write the results as Markdown table rows there;
//! - with `--features bench-peers`, a fifth section beside the official ACP rust-sdk WebSocket
//!   server (`benches/gateway/rust_sdk.rs`; `BENCH_SDK_PROMPTS`, default 200).
//!
//! The gateway runs on its own multi-threaded runtime (as it would in its own process); the
//! benchmark client runs on a single-threaded runtime on the main thread, the same client code
//! for every path. The client only parses messages that are not notifications, so its cost
//! stays small and equal on every side. websocketd is skipped (and said so) when not installed.

// Tests and benchmarks spawn freely: their runtime ends with them.
#![allow(clippy::disallowed_methods)]

#[path = "gateway/http_peer.rs"]
mod http_peer;
#[path = "gateway/relay.rs"]
mod relay;
#[cfg(feature = "bench-peers")]
#[path = "gateway/rust_sdk.rs"]
mod rust_sdk;
#[path = "gateway/stats.rs"]
mod stats;
#[path = "gateway/stuck.rs"]
mod stuck;
#[path = "gateway/throughput.rs"]
mod throughput;
#[path = "gateway/transport.rs"]
mod transport;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use acp_gateway::app::{Application, Gateway};
use acp_gateway::infra::config::{CliOverrides, Config, DEFAULT_AGENT};
use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};

use stats::{Stats, gateway_cpu, median, rss_kib, stats};
use throughput::{eight, throughput};
use transport::{AgentPipe, Peer, Rpc, Transport, Websocketd, WsClient, agent_args, gateway_bin};

/// Updates a prompt produces besides its `agent_message_chunk`s, as the agent writes them:
/// plan, tool_call, two tool_call_updates.
const AGENT_EXTRAS: u64 = 4;
/// What the gateway adds on top: the user's own prompt as `user_message_chunk`.
const GATEWAY_EXTRAS: u64 = AGENT_EXTRAS + 1;
/// Connections streaming at once in the second throughput figure.
const EIGHT: usize = 8;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn bench_config(dir: &std::path::Path) -> Result<Config> {
    let mut config = Config::load_with_env(&CliOverrides::default(), |_| None)?;
    config.listen = "127.0.0.1:0".parse()?;
    // DATABASE_URL=postgres://… runs the same benchmark on Postgres.
    config.database_url = std::env::var("DATABASE_URL")
        .ok()
        .filter(|u| u.starts_with("postgres"))
        .unwrap_or_else(|| format!("sqlite://{}/bench.db", dir.display()));
    config.data_dir = dir.to_path_buf();
    config.jwt.secret = Some("bench-secret-0123456789-0123456789".to_string().into());
    // Default limits: a client that falls behind a 200,000-update burst is fed from the store
    // and then live again. `BENCH_LIFT_QUEUE=1` gives it room to fall behind in memory instead
    // (how gateways that cut a slow client off had to be measured).
    if std::env::var("BENCH_LIFT_QUEUE").is_ok_and(|v| v == "1") {
        config.limits.client_queue = 1 << 20;
        config.limits.client_queue_bytes = 1 << 30;
    }
    // Each user's agent in the gateway's default sandbox, as deployed; `BENCH_SANDBOX=none`
    // runs it bare like the other paths.
    if let Ok(sandbox) = std::env::var("BENCH_SANDBOX") {
        let agent = config.agents.get_mut(DEFAULT_AGENT).context("default agent")?;
        agent.sandbox = serde_json::from_value(json!(sandbox)).context("BENCH_SANDBOX: auto, bwrap or none")?;
    }
    let agent = config.agents.get_mut(DEFAULT_AGENT).context("default agent")?;
    agent.command = gateway_bin().to_string();
    agent.args = agent_args();
    Ok(config)
}

fn main() -> Result<()> {
    let knobs = Knobs {
        rounds: env_u64("BENCH_ROUNDS", 5),
        per_round: env_u64("BENCH_PROMPTS", 400),
        warmup: env_u64("BENCH_WARMUP", 200),
        block: env_u64("BENCH_BLOCK", 20).max(1),
        n_updates: env_u64("BENCH_UPDATES", 200_000),
        tp_runs: env_u64("BENCH_THROUGHPUT_RUNS", 3).max(1),
        eight_updates: env_u64("BENCH_EIGHT_UPDATES", 50_000),
    };

    // As `acp-gateway serve` does: the Prometheus recorder is installed (metrics cost what they
    // cost in production); logs at warn so the table stays readable.
    acp_gateway::infra::telemetry::init_logs("warn");
    acp_gateway::infra::telemetry::init_metrics();

    // The gateway: its own multi-threaded runtime, as if it were its own process.
    let gw_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(env_u64(
            "BENCH_GW_THREADS",
            std::thread::available_parallelism().map_or(2, |n| n.get() as u64),
        ) as usize)
        .enable_all()
        .thread_name("gw-worker")
        .build()?;
    let dir = tempfile::tempdir()?;
    let config = bench_config(dir.path())?;
    let app = gw_rt
        .block_on(Application::build(config))
        .context("building the gateway")?;
    let addr = app.local_addr();
    let gw: Gateway = app.gateway().clone();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serve = gw_rt.spawn(app.run_until_stopped(async move {
        let _ = stop_rx.await;
    }));

    // The client: one thread.
    let client_rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let result = client_rt.block_on(run(&gw_rt, &gw, addr, &knobs));

    let _ = stop_tx.send(());
    let _ = gw_rt.block_on(async { tokio::time::timeout(Duration::from_secs(20), serve).await });
    drop(gw);
    gw_rt.shutdown_timeout(Duration::from_secs(5));
    result
}

struct Knobs {
    rounds: u64,
    per_round: u64,
    warmup: u64,
    block: u64,
    n_updates: u64,
    tp_runs: u64,
    eight_updates: u64,
}

/// One path under test: its client and session, and how many updates a small prompt brings.
struct Path<T> {
    name: &'static str,
    rpc: Rpc<T>,
    session: String,
    extras: u64,
    samples: Vec<Duration>,
}

impl<T: Transport> Path<T> {
    async fn new(name: &'static str, t: T, extras: u64) -> Result<Self> {
        let mut rpc = Rpc::new(t);
        let session = rpc.setup().await.with_context(|| format!("{name} setup"))?;
        Ok(Self {
            name,
            rpc,
            session,
            extras,
            samples: Vec::new(),
        })
    }

    async fn prompts(&mut self, n: u64, keep: bool) -> Result<()> {
        for _ in 0..n {
            let rt = self.rpc.small_prompt(&self.session, self.extras).await?;
            if keep {
                self.samples.push(rt);
            }
        }
        Ok(())
    }
}

async fn run(gw_rt: &tokio::runtime::Runtime, gw: &Gateway, addr: SocketAddr, k: &Knobs) -> Result<()> {
    println!(
        "acp-gateway benchmark: agent = `{} {}`",
        gateway_bin(),
        agent_args().join(" ")
    );
    let backend = if std::env::var("DATABASE_URL").is_ok_and(|u| u.starts_with("postgres")) {
        "Postgres"
    } else {
        "SQLite"
    };
    let lifted = std::env::var("BENCH_LIFT_QUEUE").is_ok_and(|v| v == "1");
    println!(
        "latency: {} rounds x {} sequential [chunks=1] prompts per path (alternating in blocks of {}), after {} warm-up; throughput: {} updates, {} run(s) each way; eight connections x {} updates; persistence: {backend}, every update stored before a client sees it; client queues: {}",
        k.rounds,
        k.per_round,
        k.block,
        k.warmup,
        k.n_updates,
        k.tp_runs,
        k.eight_updates,
        if lifted {
            "lifted (BENCH_LIFT_QUEUE=1)"
        } else {
            "default limits"
        }
    );
    let token = |user: &str| gw.identity.auth.mint(user, 3600).map_err(|e| anyhow!("mint: {e:?}"));
    let websocketd = Websocketd::start().await?;
    if websocketd.is_none() {
        println!("websocketd is not installed (apt install websocketd): its column is left out");
    }
    let mut direct = Path::new("direct", AgentPipe::spawn()?, AGENT_EXTRAS).await?;
    let mut via = Path::new(
        "gateway",
        WsClient::connect(addr, "/acp", Some(&token("bench")?)).await?,
        GATEWAY_EXTRAS,
    )
    .await?;
    let mut peer = match &websocketd {
        Some(w) => Some(
            Path::new(
                "websocketd",
                Peer::Ws(WsClient::connect(w.addr, "/", None).await?),
                AGENT_EXTRAS,
            )
            .await?,
        ),
        None => None,
    };
    let relay = relay::Relay::start()?;
    let mut bare = Path::new(
        "relay",
        Peer::Ws(WsClient::connect(relay.addr, "/", None).await?),
        AGENT_EXTRAS,
    )
    .await?;
    // An editor's way in: `acp-gateway connect` on stdio, a WebSocket to the same gateway.
    let mut editor = Path::new(
        "connect",
        Peer::Pipe(AgentPipe::connect(addr, &token("bench-connect")?)?),
        GATEWAY_EXTRAS,
    )
    .await?;
    // The transport RFD's other way in: Streamable HTTP over h2c to the same gateway.
    let mut streamable = Path::new(
        "http",
        Peer::Http(http_peer::HttpPeer::new(addr, &token("bench-http")?)?),
        GATEWAY_EXTRAS,
    )
    .await?;
    let mut md = String::new();
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    if only.is_empty() || only == "latency" {
        latency(
            &mut direct,
            &mut via,
            [&mut bare],
            peer.as_mut(),
            [&mut editor, &mut streamable],
            k,
            backend,
            &mut md,
        )
        .await?;
    }
    #[cfg(feature = "bench-peers")]
    if only.is_empty() || only == "latency" {
        rust_sdk::section(&mut direct, &mut via, backend, &mut md).await?;
    }
    if only != "latency" {
        throughput(gw_rt, gw, &mut direct, &mut via, peer.as_mut(), k, &mut md).await?;
    }
    if only != "latency" && only != "stream" {
        let tokens: Vec<String> = (0..EIGHT).map(|i| token(&format!("bench{i}"))).collect::<Result<_>>()?;
        eight(addr, &tokens, websocketd.as_ref().map(|w| w.addr), k, &mut md).await?;
        stuck::section(gw_rt, gw, addr, token, &mut via, k.n_updates, &mut md).await?;
    }
    if let Ok(path) = std::env::var("BENCH_MARKDOWN") {
        std::fs::write(&path, &md).with_context(|| format!("writing {path}"))?;
    }
    Ok(())
}

/// Section 1: prompt round trips on every path, alternating in blocks.
#[allow(clippy::too_many_arguments, reason = "the section's paths, each its own client")]
async fn latency(
    direct: &mut Path<AgentPipe>,
    via: &mut Path<WsClient>,
    [bare]: [&mut Path<Peer>; 1],
    peer: Option<&mut Path<Peer>>,
    [editor, streamable]: [&mut Path<Peer>; 2],
    k: &Knobs,
    backend: &str,
    md: &mut String,
) -> Result<()> {
    let mut peers: Vec<&mut Path<Peer>> = vec![bare];
    let wsd_at = peer.is_some().then_some(1);
    peers.extend(peer);
    let connect_at = peers.len();
    peers.push(editor);
    let http_at = peers.len();
    peers.push(streamable);
    direct.prompts(k.warmup, false).await?;
    via.prompts(k.warmup, false).await?;
    for p in peers.iter_mut() {
        p.prompts(k.warmup, false).await?;
    }
    let mut gw_diffs = Vec::new();
    let mut peer_diffs = vec![Vec::new(); peers.len()];
    let mut turn = 0usize;
    for _ in 0..k.rounds {
        take_turns(
            direct,
            via,
            &mut peers,
            (k.per_round, k.block),
            &mut turn,
            (&mut gw_diffs, &mut peer_diffs),
        )
        .await?;
    }
    let blocks = gw_diffs.len();
    let gw_added = median(gw_diffs);
    let peer_added: Vec<f64> = peer_diffs.into_iter().map(median).collect();
    let d = stats(&direct.samples);
    let g = stats(&via.samples);
    let ps: Vec<Stats> = peers.iter().map(|p| stats(&p.samples)).collect();
    println!();
    println!(
        "== 1. prompt round trip ([chunks=1]: 5 updates direct, via the relay and via websocketd, 6 through the gateway), µs =="
    );
    println!(
        "{:<10} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>12}",
        "path", "n", "min", "p50", "p90", "p99", "mean", "added p50"
    );
    let row = |name: &str, s: &Stats, added: f64| {
        println!(
            "{:<10} {:>7} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>12.1}",
            name, s.n, s.min, s.p50, s.p90, s.p99, s.mean, added
        );
    };
    row(direct.name, &d, 0.0);
    for ((p, s), added) in peers.iter().zip(&ps).zip(&peer_added).take(1) {
        row(p.name, s, *added);
    }
    row(via.name, &g, gw_added);
    for ((p, s), added) in peers.iter().zip(&ps).zip(&peer_added).skip(1) {
        row(p.name, s, *added);
    }
    println!("(added p50: the median over {blocks} blocks of the path's p50 minus direct's in the same block)");
    println!(
        "gateway inside: a transcript commit takes {:.1} µs on average; an update waits {:.1} µs from queued to committed; {:.2} commits per round trip",
        metric_mean("acp_gateway_transcript_commit_seconds") * 1e6,
        metric_mean("acp_gateway_transcript_commit_lag_seconds") * 1e6,
        metric_total("acp_gateway_transcript_commit_seconds_count")
            / (k.warmup as f64 + via.samples.len() as f64).max(1.0)
    );
    let (r, r_added) = (&ps[0], peer_added[0]);
    let wsd = wsd_at.map(|i| (&ps[i], peer_added[i]));
    let (c, c_added) = (&ps[connect_at], peer_added[connect_at]);
    let (h, h_added) = (&ps[http_at], peer_added[http_at]);
    println!(
        "Streamable HTTP (h2c) adds {:.1} µs p50 to the WebSocket's round trip through the gateway",
        h_added - gw_added
    );
    let _ = writeln!(
        md,
        "| {backend} | over Streamable HTTP (h2c, POST + SSE): round trip p50 (p99; added p50 over the WebSocket's), µs | – | – | {:.0} ({:.0}; {:+.0}) | – |",
        h.p50,
        h.p99,
        h_added - gw_added
    );
    println!(
        "acp-gateway connect adds {:.1} µs p50 to the gateway's round trip (target: at most 1,000 µs): {}",
        c_added - gw_added,
        if c_added - gw_added <= 1000.0 {
            "MEETS"
        } else {
            "MISSES"
        }
    );
    let _ = writeln!(
        md,
        "| {backend} | via `acp-gateway connect` (stdio to the gateway): round trip p50 (p99; added p50 over the gateway's), µs | – | – | {:.0} ({:.0}; {:+.0}) | – |",
        c.p50,
        c.p99,
        c_added - gw_added
    );
    let _ = writeln!(
        md,
        "| {backend} | prompt round trip p50, µs | {:.0} | {:.0} | {:.0} | {} |",
        d.p50,
        r.p50,
        g.p50,
        wsd.map_or("–".into(), |(s, _)| format!("{:.0}", s.p50))
    );
    let _ = writeln!(
        md,
        "| {backend} | added p50 over direct stdio, µs | – | {r_added:.0} | {gw_added:.0} | {} |",
        wsd.map_or("–".into(), |(_, a)| format!("{a:.0}"))
    );
    let _ = writeln!(
        md,
        "| {backend} | prompt round trip p99, µs | {:.0} | {:.0} | {:.0} | {} |",
        d.p99,
        r.p99,
        g.p99,
        wsd.map_or("–".into(), |(s, _)| format!("{:.0}", s.p99))
    );
    let verdict = |ok: bool| if ok { "MEETS" } else { "MISSES" };
    if backend == "SQLite" {
        println!(
            "target: added p50 <= 1.5x the bare relay's ({:.1} µs vs {:.1} µs, {:.2}x): {}",
            gw_added,
            r_added,
            gw_added / r_added.max(f64::EPSILON),
            verdict(gw_added <= 1.5 * r_added.max(0.0))
        );
    }
    if let Some((s, wsd_added)) = wsd {
        let limit = if backend == "Postgres" { 4.0 } else { 1.0 };
        println!(
            "target: added p50 <= {limit}x websocketd's ({:.1} µs vs {:.1} µs): {}",
            gw_added,
            wsd_added,
            verdict(gw_added <= limit * wsd_added.max(0.0))
        );
        println!(
            "target: p99 <= 2x websocketd's ({:.1} µs vs {:.1} µs, {:.2}x): {}",
            g.p99,
            s.p99,
            g.p99 / s.p99,
            verdict(g.p99 <= 2.0 * s.p99)
        );
    }
    Ok(())
}

/// `total` timed prompts on each path, the paths taking turns in blocks of `block` prompts
/// (which goes first rotates with `turn`, kept across calls), so machine noise hits them alike.
/// Pushes, per block, the gateway's and each peer's p50 minus direct's p50 in the same block: the
/// paired estimate of what each adds is the median of those.
async fn take_turns(
    direct: &mut Path<AgentPipe>,
    via: &mut Path<WsClient>,
    peers: &mut [&mut Path<Peer>],
    (total, block): (u64, u64),
    turn: &mut usize,
    (gw_diffs, peer_diffs): (&mut Vec<f64>, &mut [Vec<f64>]),
) -> Result<()> {
    let legs = 2 + peers.len();
    let mut done = 0;
    while done < total {
        let n = block.min(total - done);
        let marks: Vec<usize> = peers.iter().map(|p| p.samples.len()).collect();
        let (d_mark, g_mark) = (direct.samples.len(), via.samples.len());
        for leg in 0..legs {
            match (leg + *turn) % legs {
                0 => direct.prompts(n, true).await?,
                1 => via.prompts(n, true).await?,
                i => peers[i - 2].prompts(n, true).await?,
            }
        }
        let d = stats(&direct.samples[d_mark..]).p50;
        gw_diffs.push(stats(&via.samples[g_mark..]).p50 - d);
        for ((p, mark), diffs) in peers.iter().zip(marks).zip(peer_diffs.iter_mut()) {
            diffs.push(stats(&p.samples[mark..]).p50 - d);
        }
        done += n;
        *turn += 1;
    }
    Ok(())
}

/// The mean of a histogram of this process's gateway (`_sum / _count` over its label sets).
fn metric_mean(name: &str) -> f64 {
    metric_total(&format!("{name}_sum")) / metric_total(&format!("{name}_count")).max(1.0)
}

/// The sum of a metric's series (every label set) in this process.
fn metric_total(name: &str) -> f64 {
    acp_gateway::infra::telemetry::render_metrics()
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum()
}

/// The session's `last_seq` in the database (queried on the gateway's runtime, which owns the pool).
async fn stored_last_seq(gw_rt: &tokio::runtime::Runtime, gw: &Gateway, session: &str) -> Result<i64> {
    let (gw, session) = (gw.clone(), session.to_string());
    let rec = gw_rt
        .spawn(async move { gw.sessions.store().get_session("bench", &session).await })
        .await??;
    Ok(rec.map(|r| r.last_seq).unwrap_or(-1))
}
