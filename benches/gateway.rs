//! Gateway overhead benchmark: the same workload against the demo agent's stdio directly and
//! through an in-process gateway (WebSocket, JWT, SQLite persistence on), side by side in one run.
//!
//! Run: `cargo bench --bench gateway`. Knobs (environment):
//! - `BENCH_ROUNDS` (default 5) and `BENCH_PROMPTS` (default 400): latency rounds, alternating
//!   direct and gateway, `BENCH_PROMPTS` sequential prompts each way per round, interleaved in
//!   blocks of `BENCH_BLOCK` (default 20);
//! - `BENCH_WARMUP` (default 200): untimed prompts each way first;
//! - `BENCH_UPDATES` (default 200000): updates streamed by the throughput prompt;
//! - `BENCH_THROUGHPUT_RUNS` (default 3): throughput runs each way (alternating);
//! - `BENCH_GW_THREADS` (default: one per core, like `#[tokio::main]`): the gateway's workers;
//! - `BENCH_ONLY=latency` or `BENCH_ONLY=throughput`: run one part (for profiling).
//!
//! The gateway runs on its own multi-threaded runtime (as it would in its own process); the
//! benchmark client runs on a single-threaded runtime on the main thread, the same client code
//! for both paths. The client only parses messages that are not notifications, so its cost
//! stays small and equal on both sides.
//!
//! Targets (project guide): the gateway adds at most ~50 µs to a prompt round trip, and forwards
//! 300,000+ updates/s on one connection with persistence on.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use acp_gateway::app::{Application, Gateway};
use acp_gateway::config::{CliOverrides, Config, DEFAULT_AGENT};
use anyhow::{Context, Result, anyhow, bail};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// Updates a prompt produces besides its `agent_message_chunk`s, as the agent writes them:
/// plan, tool_call, two tool_call_updates.
const AGENT_EXTRAS: u64 = 4;
/// What the gateway adds on top: the user's own prompt as `user_message_chunk`.
const GATEWAY_EXTRAS: u64 = AGENT_EXTRAS + 1;
/// Any single step of the benchmark that takes longer than this is a failure.
const STEP_TIMEOUT: Duration = Duration::from_secs(300);

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn agent_args() -> Vec<String> {
    ["demo-agent", "--delay-us", "0", "--chunks", "1"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn gateway_bin() -> &'static str {
    env!("CARGO_BIN_EXE_acp-gateway")
}

// ---------------------------------------------------------------------------------------------
// Transports: newline-delimited JSON over a child's stdio, or text frames over a WebSocket.

/// One JSON-RPC message stream, client side.
trait Transport {
    /// Sends one message.
    async fn send(&mut self, msg: &str) -> Result<()>;
    /// Receives the next message, borrowed until the next call.
    async fn recv(&mut self) -> Result<&[u8]>;
}

/// The demo agent spoken to directly.
struct AgentPipe {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    line: Vec<u8>,
    out: Vec<u8>,
}

impl AgentPipe {
    fn spawn() -> Result<Self> {
        let mut child = Command::new(gateway_bin())
            .args(agent_args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("spawning the demo agent")?;
        let stdin = child.stdin.take().context("stdin")?;
        let stdout = BufReader::with_capacity(64 << 10, child.stdout.take().context("stdout")?);
        Ok(Self {
            child,
            stdin,
            stdout,
            line: Vec::with_capacity(4096),
            out: Vec::with_capacity(4096),
        })
    }
}

impl Transport for AgentPipe {
    async fn send(&mut self, msg: &str) -> Result<()> {
        self.out.clear();
        self.out.extend_from_slice(msg.as_bytes());
        self.out.push(b'\n');
        self.stdin.write_all(&self.out).await?;
        self.stdin.flush().await?;
        Ok(())
    }

    async fn recv(&mut self) -> Result<&[u8]> {
        self.line.clear();
        let n = self.stdout.read_until(b'\n', &mut self.line).await?;
        if n == 0 {
            bail!("agent closed its stdout");
        }
        if self.line.last() == Some(&b'\n') {
            self.line.pop();
        }
        Ok(&self.line)
    }
}

type Ws = WebSocketStream<TcpStream>;

/// A WebSocket client of the gateway.
struct WsClient {
    ws: Ws,
    last: Option<tokio_tungstenite::tungstenite::Utf8Bytes>,
}

impl WsClient {
    async fn connect(addr: SocketAddr, token: &str) -> Result<Self> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let mut req = format!("ws://{addr}/acp").into_client_request()?;
        req.headers_mut()
            .insert("authorization", format!("Bearer {token}").parse()?);
        let (ws, resp) = tokio_tungstenite::client_async(req, tcp)
            .await
            .context("WebSocket handshake")?;
        if resp.status().as_u16() != 101 {
            bail!("upgrade answered {}", resp.status());
        }
        Ok(Self { ws, last: None })
    }
}

impl Transport for WsClient {
    async fn send(&mut self, msg: &str) -> Result<()> {
        self.ws.send(Message::text(msg)).await?;
        Ok(())
    }

    async fn recv(&mut self) -> Result<&[u8]> {
        loop {
            match self.ws.next().await {
                Some(Ok(Message::Text(t))) => {
                    self.last = Some(t);
                    break;
                }
                Some(Ok(Message::Close(c))) => bail!("gateway closed the connection: {c:?}"),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => bail!("connection ended"),
            }
        }
        Ok(self.last.as_ref().map(|t| t.as_str().as_bytes()).unwrap_or_default())
    }
}

// ---------------------------------------------------------------------------------------------
// The client logic, shared by both transports.

/// What kind of message a line is, decided cheaply: notifications (every update) are recognised
/// by their prefix without parsing; anything else is parsed.
enum Msg {
    Notification,
    Response(Value),
    Other(Value),
}

const NOTIFICATION_PREFIX: &[u8] = br#"{"jsonrpc":"2.0","method":"#;

fn classify(bytes: &[u8]) -> Result<Msg> {
    if bytes.starts_with(NOTIFICATION_PREFIX) {
        return Ok(Msg::Notification);
    }
    let v: Value =
        serde_json::from_slice(bytes).with_context(|| format!("not JSON: {}", String::from_utf8_lossy(bytes)))?;
    Ok(match (v.get("method"), v.get("id")) {
        (None, Some(_)) => Msg::Response(v),
        (Some(_), None) => Msg::Notification,
        _ => Msg::Other(v),
    })
}

struct Rpc<T> {
    t: T,
    next_id: u64,
    /// A copy of the last notification seen (for the final `seq` check).
    last_note: Vec<u8>,
    keep_last: bool,
}

impl<T: Transport> Rpc<T> {
    fn new(t: T) -> Self {
        Self {
            t,
            next_id: 1,
            last_note: Vec::new(),
            keep_last: false,
        }
    }

    /// Sends a request; returns (its answer, notifications received meanwhile, round-trip time).
    async fn call(&mut self, method: &str, params: Value) -> Result<(Value, u64, Duration)> {
        let id = self.next_id;
        self.next_id += 1;
        let text = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
        let started = Instant::now();
        self.t.send(&text).await?;
        let mut notes = 0u64;
        loop {
            let bytes = self.t.recv().await?;
            match classify(bytes)? {
                Msg::Notification => {
                    notes += 1;
                    if self.keep_last {
                        self.last_note.clear();
                        self.last_note.extend_from_slice(bytes);
                    }
                }
                Msg::Response(v) if v["id"] == json!(id) => {
                    let elapsed = started.elapsed();
                    if let Some(e) = v.get("error") {
                        bail!("{method} failed: {e}");
                    }
                    return Ok((v, notes, elapsed));
                }
                Msg::Response(v) => bail!("unexpected response while waiting for {id}: {v}"),
                Msg::Other(v) => bail!("unexpected message (an agent request?): {v}"),
            }
        }
    }

    async fn call_timed(&mut self, method: &str, params: Value) -> Result<(Value, u64, Duration)> {
        tokio::time::timeout(STEP_TIMEOUT, self.call(method, params))
            .await
            .map_err(|_| anyhow!("{method} timed out"))?
    }

    async fn setup(&mut self) -> Result<String> {
        let (init, _, _) = self
            .call_timed("initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}))
            .await?;
        // The gateway names the user's workspace root; the bare agent takes any directory.
        let cwd = init["result"]["_meta"]["gateway"]["workspaceRoots"][0]
            .as_str()
            .unwrap_or("/tmp")
            .to_string();
        let (v, _, _) = self
            .call_timed("session/new", json!({"cwd": cwd, "mcpServers": []}))
            .await?;
        v["result"]["sessionId"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("session/new: {v}"))
    }

    fn prompt_params(session: &str, text: &str) -> Value {
        json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]})
    }

    /// One `[chunks=1]` prompt; returns its round trip.
    async fn small_prompt(&mut self, session: &str, extras: u64) -> Result<Duration> {
        let (v, notes, rt) = self
            .call_timed("session/prompt", Self::prompt_params(session, "ping [chunks=1]"))
            .await?;
        if v["result"]["stopReason"] != "end_turn" {
            bail!("prompt answered {v}");
        }
        if notes != 1 + extras {
            bail!(
                "MISMATCH: a [chunks=1] prompt brought {notes} updates, expected {}",
                1 + extras
            );
        }
        Ok(rt)
    }
}

// ---------------------------------------------------------------------------------------------
// Statistics.

struct Stats {
    n: usize,
    p50: f64,
    p90: f64,
    p99: f64,
    mean: f64,
    min: f64,
}

fn stats(samples: &[Duration]) -> Stats {
    let mut us: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    us.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| -> f64 {
        if us.is_empty() {
            return f64::NAN;
        }
        let i = ((us.len() as f64 - 1.0) * p).round() as usize;
        us[i.min(us.len() - 1)]
    };
    Stats {
        n: us.len(),
        p50: pct(0.50),
        p90: pct(0.90),
        p99: pct(0.99),
        mean: us.iter().sum::<f64>() / us.len().max(1) as f64,
        min: us.first().copied().unwrap_or(f64::NAN),
    }
}

fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
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
    // The streaming figure is the gateway's forwarding rate: a client that falls behind a
    // 200,000-update burst is closed with 1013 by default (it would catch up with afterSeq), so
    // the benchmark's client gets room to fall behind instead.
    config.limits.client_queue = 1 << 20;
    config.limits.client_queue_bytes = 1 << 30;
    let agent = config.agents.get_mut(DEFAULT_AGENT).context("default agent")?;
    agent.command = gateway_bin().to_string();
    agent.args = agent_args();
    Ok(config)
}

// ---------------------------------------------------------------------------------------------

/// The session's `last_seq` in the database (queried on the gateway's runtime, which owns the pool).
async fn stored_last_seq(gw_rt: &tokio::runtime::Runtime, gw: &Arc<Gateway>, session: &str) -> Result<i64> {
    let (gw, session) = (gw.clone(), session.to_string());
    let rec = gw_rt
        .spawn(async move { gw.sessions.store().get_session("bench", &session).await })
        .await??;
    Ok(rec.map(|r| r.last_seq).unwrap_or(-1))
}

struct Throughput {
    updates: u64,
    secs: f64,
}

impl Throughput {
    fn rate(&self) -> f64 {
        self.updates as f64 / self.secs
    }
}

async fn stream_once<T: Transport>(rpc: &mut Rpc<T>, session: &str, n: u64, extras: u64) -> Result<Throughput> {
    rpc.keep_last = true;
    let text = format!("stream [chunks={n}] [delay_us=0]");
    let (v, notes, rt) = rpc
        .call_timed("session/prompt", Rpc::<T>::prompt_params(session, &text))
        .await?;
    rpc.keep_last = false;
    if v["result"]["stopReason"] != "end_turn" {
        bail!("throughput prompt answered {v}");
    }
    if notes != n + extras {
        println!(
            "!!!!!! MISMATCH: received {notes} updates, expected {} (N={n} + {extras} extras) !!!!!!",
            n + extras
        );
    }
    Ok(Throughput {
        updates: notes,
        secs: rt.as_secs_f64(),
    })
}

fn main() -> Result<()> {
    let rounds = env_u64("BENCH_ROUNDS", 5);
    let per_round = env_u64("BENCH_PROMPTS", 400);
    let warmup = env_u64("BENCH_WARMUP", 200);
    let block = env_u64("BENCH_BLOCK", 20).max(1);
    let n_updates = env_u64("BENCH_UPDATES", 200_000);
    let tp_runs = env_u64("BENCH_THROUGHPUT_RUNS", 3).max(1);

    // As `acp-gateway serve` does: the Prometheus recorder is installed (metrics cost what they
    // cost in production); logs at warn so the table stays readable.
    acp_gateway::telemetry::init_logs("warn");
    acp_gateway::telemetry::init_metrics();

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
    let gw: Arc<Gateway> = app.gateway().clone();
    let token = gw.auth.mint("bench", 3600).map_err(|e| anyhow!("mint: {e:?}"))?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serve = gw_rt.spawn(app.run_until_stopped(async move {
        let _ = stop_rx.await;
    }));

    // The client: one thread.
    let client_rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let result = client_rt.block_on(run(
        &gw_rt, &gw, addr, &token, rounds, per_round, block, warmup, n_updates, tp_runs,
    ));

    let _ = stop_tx.send(());
    let _ = gw_rt.block_on(async { tokio::time::timeout(Duration::from_secs(20), serve).await });
    drop(gw);
    gw_rt.shutdown_timeout(Duration::from_secs(5));
    result
}

#[allow(clippy::too_many_arguments)]
async fn run(
    gw_rt: &tokio::runtime::Runtime,
    gw: &Arc<Gateway>,
    addr: SocketAddr,
    token: &str,
    rounds: u64,
    per_round: u64,
    block: u64,
    warmup: u64,
    n_updates: u64,
    tp_runs: u64,
) -> Result<()> {
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
    println!(
        "latency: {rounds} rounds x {per_round} sequential [chunks=1] prompts each way (alternating in blocks of {block}), after {warmup} warm-up; throughput: {n_updates} updates, {tp_runs} run(s) each way; persistence: {backend}, every update stored before a client sees it"
    );

    let mut direct = Rpc::new(AgentPipe::spawn()?);
    let direct_session = direct.setup().await.context("direct setup")?;
    let mut via = Rpc::new(WsClient::connect(addr, token).await?);
    let gw_session = via.setup().await.context("gateway setup")?;

    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    if only != "throughput" {
        // ---- 1. Latency
        for _ in 0..warmup {
            direct.small_prompt(&direct_session, AGENT_EXTRAS).await?;
            via.small_prompt(&gw_session, GATEWAY_EXTRAS).await?;
        }
        let mut d_samples = Vec::with_capacity((rounds * per_round) as usize);
        let mut g_samples = Vec::with_capacity((rounds * per_round) as usize);
        let mut per_round_p50 = Vec::new();
        // Within a round the two paths alternate in blocks of `block` prompts, so machine noise hits
        // both alike; the paired estimate is the median over blocks of (gateway p50 - direct p50).
        let mut block_diffs = Vec::new();
        for round in 0..rounds {
            let (d0, g0) = (d_samples.len(), g_samples.len());
            let mut done = 0;
            let mut k = 0u64;
            while done < per_round {
                let n = block.min(per_round - done);
                let (bd, bg) = (d_samples.len(), g_samples.len());
                // Alternate which side goes first.
                for leg in 0..2 {
                    if (leg == 0) == (round + k).is_multiple_of(2) {
                        for _ in 0..n {
                            d_samples.push(direct.small_prompt(&direct_session, AGENT_EXTRAS).await?);
                        }
                    } else {
                        for _ in 0..n {
                            g_samples.push(via.small_prompt(&gw_session, GATEWAY_EXTRAS).await?);
                        }
                    }
                }
                block_diffs.push(stats(&g_samples[bg..]).p50 - stats(&d_samples[bd..]).p50);
                done += n;
                k += 1;
            }
            per_round_p50.push((stats(&d_samples[d0..]).p50, stats(&g_samples[g0..]).p50));
        }
        block_diffs.sort_by(|a, b| a.total_cmp(b));
        let paired = block_diffs.get(block_diffs.len() / 2).copied().unwrap_or(f64::NAN);
        let d = stats(&d_samples);
        let g = stats(&g_samples);
        println!();
        println!("== 1. prompt round trip ([chunks=1]: 5 updates direct, 6 through the gateway), µs ==");
        println!(
            "{:<10} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "path", "n", "min", "p50", "p90", "p99", "mean"
        );
        for (name, s) in [("direct", &d), ("gateway", &g)] {
            println!(
                "{:<10} {:>7} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
                name, s.n, s.min, s.p50, s.p90, s.p99, s.mean
            );
        }
        println!(
            "{:<10} {:>7} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}   <- added by the gateway (target <= ~50 µs)",
            "added",
            "",
            g.min - d.min,
            g.p50 - d.p50,
            g.p90 - d.p90,
            g.p99 - d.p99,
            g.mean - d.mean
        );
        println!(
            "{:<10} {:>7} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}   (gateway / direct)",
            "ratio",
            "",
            g.min / d.min,
            g.p50 / d.p50,
            g.p90 / d.p90,
            g.p99 / d.p99,
            g.mean / d.mean
        );
        let rounds_text: Vec<String> = per_round_p50.iter().map(|(d, g)| format!("{:.0}", g - d)).collect();
        println!("added p50 per round (µs): {}", rounds_text.join(", "));
        let verdict = if paired <= 50.0 { "MEETS" } else { "MISSES" };
        println!(
            "paired estimate (median over {} blocks of {block} of gateway p50 - direct p50): {paired:.1} µs",
            block_diffs.len()
        );
        println!("latency target (paired added p50 <= 50 µs): {verdict}");
    }

    if only != "latency" {
        // ---- 2. Throughput
        println!();
        println!("== 2. streaming throughput: one prompt, [chunks={n_updates}] [delay_us=0], one connection ==");
        let (rss0, _) = rss_kib();
        let mut d_runs = Vec::new();
        let mut g_runs = Vec::new();
        let mut flush_ms = Vec::new();
        let mut stored_ok = true;
        let mut rss_after_stream = 0;
        let mut hwm = 0;
        for _ in 0..tp_runs {
            d_runs.push(stream_once(&mut direct, &direct_session, n_updates, AGENT_EXTRAS).await?);
            let before = stored_last_seq(gw_rt, gw, &gw_session).await?;
            let t = stream_once(&mut via, &gw_session, n_updates, GATEWAY_EXTRAS).await?;
            rss_after_stream = rss_kib().0;
            // How long after the answer until the transcript is all in the database.
            let gw2 = gw.clone();
            let flushed = gw_rt.spawn(async move {
                let started = Instant::now();
                gw2.sessions.flush().await;
                started.elapsed()
            });
            let flush = flushed.await?;
            flush_ms.push(flush.as_secs_f64() * 1e3);
            hwm = rss_kib().1;
            let after = stored_last_seq(gw_rt, gw, &gw_session).await?;
            // Check the last forwarded update's seq against the store.
            let last_seq = serde_json::from_slice::<Value>(&via.last_note)
                .ok()
                .and_then(|v| v["params"]["_meta"]["gateway"]["seq"].as_i64());
            if after - before != (n_updates + GATEWAY_EXTRAS) as i64 || last_seq != Some(after) {
                stored_ok = false;
                println!(
                    "!!!!!! MISMATCH: stored last_seq went {before} -> {after} (expected +{}), last forwarded seq {last_seq:?} !!!!!!",
                    n_updates + GATEWAY_EXTRAS
                );
            }
            g_runs.push(t);
        }
        let (rss1, _) = rss_kib();
        let rates = |runs: &[Throughput]| {
            let mut r: Vec<f64> = runs.iter().map(Throughput::rate).collect();
            r.sort_by(|a, b| a.total_cmp(b));
            (r[r.len() / 2], r[r.len() - 1])
        };
        let secs = |runs: &[Throughput]| runs.iter().map(|t| t.secs).fold(f64::INFINITY, f64::min);
        let ((dm, dr), (gm, gr)) = (rates(&d_runs), rates(&g_runs));
        println!(
            "{:<10} {:>10} {:>10} {:>16} {:>16}",
            "path", "updates", "best secs", "best updates/s", "median upd/s"
        );
        println!(
            "{:<10} {:>10} {:>10.3} {:>16.0} {:>16.0}",
            "direct",
            d_runs[0].updates,
            secs(&d_runs),
            dr,
            dm
        );
        println!(
            "{:<10} {:>10} {:>10.3} {:>16.0} {:>16.0}",
            "gateway",
            g_runs[0].updates,
            secs(&g_runs),
            gr,
            gm
        );
        println!("ratio gateway/direct: best {:.2}, median {:.2}", gr / dr, gm / dm);
        let flush_text: Vec<String> = flush_ms.iter().map(|m| format!("{m:.1}")).collect();
        println!(
            "transcript fully flushed {} ms after the prompt's answer",
            flush_text.join(" / ")
        );
        println!(
            "stored transcript: {}",
            if stored_ok {
                "complete (last_seq advanced by N+5, matches the last forwarded seq)"
            } else {
                "MISMATCH (see above)"
            }
        );
        let verdict = if gm >= 300_000.0 {
            "MEETS"
        } else if gr >= 300_000.0 {
            "MEETS (best run only)"
        } else {
            "MISSES"
        };
        println!("throughput target (>= 300,000 updates/s through the gateway, persistence on, median run): {verdict}");

        // ---- 3. Memory (this process holds the gateway and the client)
        println!();
        println!("== 3. memory of this process (gateway + bench client), KiB ==");
        println!(
            "VmRSS before throughput {rss0}, right after the gateway stream {rss_after_stream}, after flush {rss1} (delta {:+}); VmHWM {hwm}",
            rss1 as i64 - rss0 as i64
        );
    }

    drop(direct);
    drop(via);
    Ok(())
}

impl Drop for AgentPipe {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}
