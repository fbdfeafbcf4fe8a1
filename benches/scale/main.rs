//! Scale figures (issue 9), against the gateway running as a separate release process
//! (`acp-gateway serve`, SQLite in a temporary directory, the demo agent), so that its memory can
//! be read from `/proc/<pid>/status` and `smaps_rollup`. Two gateways, one after the other:
//!
//! 1. gateway A, idle connections: `BENCH_CONNS` (default 10,000) authenticated WebSockets, each
//!    of which has done `initialize`, spread over `BENCH_IDLE_USERS` (default 100) users and
//!    opened `BENCH_CONNECT_CONCURRENCY` (default 256) at a time. Prints the gateway's memory
//!    before and after, per connection, and the time to open them all; then every connection
//!    makes one request (`session/list`), which it must get answered, and closes.
//! 2. `session/new` for fresh users, one after another: the first one spawns the user's agent
//!    process (cold), the second finds it running (warm). On gateway A after part 1 (10 users),
//!    and on a fresh gateway B (`BENCH_COLD_USERS`, default 20).
//! 3. gateway B, concurrent prompts: `BENCH_PROMPT_USERS` (default 50) users ×
//!    `BENCH_SESSIONS_PER_USER` (default 20) sessions, one connection each, all prompting at once
//!    while the demo agent streams `BENCH_CHUNKS` (default 50) chunks `BENCH_DELAY_US` µs apart
//!    (default 0: as fast as the gateway takes them), for `BENCH_ROUNDS` (default 3) rounds.
//!    Prints round-trip p50/p99, updates/s and where the CPU went, and checks that every client
//!    got exactly its own session's updates, all of them, in `seq` order.
//!
//! Run: `cargo bench --bench scale` (about 30 s). Other knobs: `BENCH_SANDBOX` (`none`, the
//! default, or `bwrap`/`auto`), `BENCH_DATABASE_URL` (default: SQLite in the temporary
//! directory), `BENCH_GATEWAY_BIN` (another build of the gateway, to compare).
//!
//! The gateway runs in a process group of its own and dies with this program (`PR_SET_PDEATHSIG`);
//! it is stopped (SIGTERM, then SIGKILL to its group, then to its agents' groups) on every way out,
//! Ctrl-C included. The open-file limit is raised to the hard limit (by re-running this program
//! under `sh -c 'ulimit -n …'`: the crate's `nix` has no `resource` feature) and inherited by
//! the gateway.

// Tests and benchmarks spawn freely: their runtime ends with them.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use acp_gateway::identity::auth::Authenticator;
use acp_gateway::infra::config::JwtConfig;
use anyhow::{Context, Result, anyhow, bail, ensure};
use futures_util::{SinkExt, StreamExt};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::sync::{Barrier, Semaphore, mpsc, watch};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

mod client;
mod idle;
mod process;
mod prompts;

use client::*;
use idle::*;
use process::*;
use prompts::*;

type Ws = WebSocketStream<TcpStream>;

/// Any single step (a handshake, an answer) that takes longer than this is a failure.
const STEP: Duration = Duration::from_secs(60);
/// Updates the gateway forwards per prompt besides the agent's chunks: the user's own prompt
/// (`user_message_chunk`), and the demo agent's plan, tool_call and two tool_call_updates.
const EXTRAS_PER_PROMPT: u64 = 5;
/// Set when this program has re-run itself with a raised open-file limit.
const REEXEC_MARK: &str = "ACP_SCALE_BENCH_REEXEC";
const SECRET: &str = "scale-bench-secret-0123456789-0123456789";
/// The gateway's process group, for the signal handler.
static GATEWAY_PGID: AtomicI32 = AtomicI32::new(0);
/// Its data directory, for the signal handler to remove.
static GATEWAY_DIR: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// The gateway binary: this package's (`cargo bench` builds it), or `BENCH_GATEWAY_BIN` (to
/// compare builds).
fn gateway_bin() -> String {
    std::env::var("BENCH_GATEWAY_BIN")
        .ok()
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_acp-gateway").to_string())
}

/// Busy and total CPU seconds of the whole machine so far (`/proc/stat`), to tell how much of it
/// other programs took during a measurement.
fn machine_cpu() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<f64> = stat
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("cpu "))
        .map(|l| l.split_whitespace().filter_map(|v| v.parse().ok()).collect())
        .unwrap_or_default();
    // user nice system idle iowait irq softirq steal ...
    let total: f64 = ticks.iter().take(8).sum();
    let idle: f64 = ticks.iter().skip(3).take(2).sum();
    ((total - idle) / 100.0, total / 100.0)
}

struct Knobs {
    conns: usize,
    idle_users: usize,
    connect_concurrency: usize,
    prompt_users: usize,
    sessions_per_user: usize,
    chunks: usize,
    delay_us: usize,
    rounds: usize,
    cold_users: usize,
    sandbox: String,
}

impl Knobs {
    fn from_env() -> Self {
        Self {
            conns: env_usize("BENCH_CONNS", 10_000),
            idle_users: env_usize("BENCH_IDLE_USERS", 100).max(1),
            connect_concurrency: env_usize("BENCH_CONNECT_CONCURRENCY", 256).max(1),
            prompt_users: env_usize("BENCH_PROMPT_USERS", 50).max(1),
            sessions_per_user: env_usize("BENCH_SESSIONS_PER_USER", 20).max(1),
            chunks: env_usize("BENCH_CHUNKS", 50),
            delay_us: env_usize("BENCH_DELAY_US", 0),
            rounds: env_usize("BENCH_ROUNDS", 3).max(1),
            cold_users: env_usize("BENCH_COLD_USERS", 20).max(1),
            sandbox: std::env::var("BENCH_SANDBOX").unwrap_or_else(|_| "none".into()),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// session/new, cold and warm.

async fn cold_and_warm(gw: &GatewayProcess, auth: &Authenticator, users: usize, label: &str) -> Result<()> {
    let rss = gw.mem()?.rss as f64 / 1024.0;
    let mut cold = Vec::with_capacity(users);
    let mut warm = Vec::with_capacity(users);
    for u in 0..users {
        let (mut ws, cwd) = open(gw.addr, &auth.mint(&format!("new-{label}-{u}"), 3600)?).await?;
        for (id, samples) in [(2, &mut cold), (3, &mut warm)] {
            let t = Instant::now();
            call(&mut ws, id, "session/new", json!({"cwd": cwd, "mcpServers": []})).await?;
            samples.push(t.elapsed().as_secs_f64() * 1e3);
        }
        close(&mut ws).await;
    }
    cold.sort_by(f64::total_cmp);
    warm.sort_by(f64::total_cmp);
    let (c, w) = (quantile(&cold, 0.5), quantile(&warm, 0.5));
    println!(
        "{label} (gateway VmRSS {rss:.0} MiB), {users} users: median cold {c:.2} ms (p90 {:.2}), \
         warm {w:.2} ms (p90 {:.2}); cold/warm {:.1}x",
        quantile(&cold, 0.9),
        quantile(&warm, 0.9),
        c / w,
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------

fn config_toml(dir: &Path, k: &Knobs) -> String {
    let per_user = k.conns.div_ceil(k.idle_users).max(k.sessions_per_user) + 8;
    let database_url = std::env::var("BENCH_DATABASE_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| format!("sqlite://{}/scale.db", dir.display()));
    format!(
        r#"listen = "127.0.0.1:0"
database_url = {database_url:?}
data_dir = {dir:?}

[limits]
max_connections = {max_conns}
max_pending_connections = 4096
max_connections_per_ip = {max_conns}
max_connections_per_user = {per_user}
max_live_sessions_per_user = {live}
shutdown_grace_secs = 2

[agents.default]
command = {bin:?}
args = ["demo-agent", "--chunks", "{chunks}", "--delay-us", "{delay}"]
sandbox = {sandbox:?}

[agents.default.pool]
max_processes = {procs}
max_sessions_per_process = 32
"#,
        dir = dir.display().to_string(),
        max_conns = k.conns + 2000,
        live = k.sessions_per_user.max(64),
        bin = gateway_bin(),
        chunks = k.chunks,
        delay = k.delay_us,
        sandbox = k.sandbox,
        procs = (k.prompt_users * k.sessions_per_user.div_ceil(32) + k.cold_users + 16).max(64),
    )
}

/// Prints the gateway's log on failure, stops it and its agents, and reports what is left.
fn finish(mut gw: GatewayProcess, result: &Result<()>) {
    if result.is_err() {
        eprintln!("gateway log (last lines):\n{}", gw.log_tail());
    }
    let agents = children_of(gw.pid).len();
    let left = gw.stop();
    println!(
        "(stopped gateway {} and its {agents} agent processes; {} left running)",
        gw.pid,
        left.len()
    );
    // Make sure nothing of ours is left behind even if the group kill above missed one.
    for pid in left {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<()> {
    let (soft, hard) = raise_nofile()?;
    let mut k = Knobs::from_env();
    // This process holds one socket per client and the gateway one per connection, plus margin.
    let need = (k.conns + 1000) as u64;
    if soft < need {
        let fit = soft.saturating_sub(1000) as usize;
        println!(
            "open-file limit is {soft} (hard {hard}): {fit} idle connections instead of {}",
            k.conns
        );
        k.conns = fit;
    }
    kill_on_signal();
    println!(
        "scale benchmark: gateway = {} serve (release, own process), open-file limit {soft}, {} cores, load average {}",
        gateway_bin(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let jwt = JwtConfig {
        secret: Some(SECRET.to_string().into()),
        ..Default::default()
    };
    let auth = Authenticator::from_config(&jwt, Path::new("/nonexistent"))?;
    let t = Instant::now();

    // Gateway A: idle connections; then session/new on the same process, which now holds the
    // memory the connections used (forking an agent copies its page tables).
    let gw = GatewayProcess::start(&k, true)?;
    println!("gateway A: pid {}, {}", gw.pid, gw.addr);
    let result = async {
        idle_connections(&gw, &auth, &k).await?;
        println!(
            "\n## 2. session/new: the user's first spawns their agent process (cold), the second finds it running (warm); sandbox: {}",
            k.sandbox
        );
        cold_and_warm(&gw, &auth, k.cold_users.min(10), "gateway A after part 1").await
    }
    .await;
    finish(gw, &result);
    result?;

    // Gateway B, fresh: session/new again, then the concurrent prompts.
    let gw = GatewayProcess::start(&k, false)?;
    println!("gateway B (same config): pid {}, {}", gw.pid, gw.addr);
    let result = async {
        cold_and_warm(&gw, &auth, k.cold_users, "fresh gateway B").await?;
        concurrent_prompts(&gw, &auth, &k).await
    }
    .await;
    finish(gw, &result);
    result?;
    println!("\ntotal {:.1} s", t.elapsed().as_secs_f64());
    Ok(())
}
