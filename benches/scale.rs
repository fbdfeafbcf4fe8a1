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

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use acp_gateway::auth::Authenticator;
use acp_gateway::config::JwtConfig;
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
// Open-file limit.

/// (soft, hard) `Max open files` of this process.
fn nofile_limits() -> Option<(u64, u64)> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let mut words = line["Max open files".len()..].split_whitespace();
    let parse = |w: Option<&str>| {
        w.map(|w| {
            if w == "unlimited" {
                u64::MAX
            } else {
                w.parse().unwrap_or(0)
            }
        })
    };
    Some((parse(words.next())?, parse(words.next())?))
}

/// Makes sure the soft open-file limit is as high as the hard one, re-running this program
/// under `sh -c 'ulimit -n …'` when it is not (returns only if no re-run was needed).
fn raise_nofile() -> Result<(u64, u64)> {
    let (soft, hard) = nofile_limits().context("reading /proc/self/limits")?;
    if soft >= hard || std::env::var_os(REEXEC_MARK).is_some() {
        return Ok((soft, hard));
    }
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("locating this program")?;
    let err = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(r#"ulimit -S -n "$(ulimit -H -n)" && exec "$0" "$@""#)
        .arg(exe)
        .args(std::env::args_os().skip(1))
        .env(REEXEC_MARK, "1")
        .exec();
    Err(anyhow!("re-running with a raised open-file limit: {err}"))
}

// ---------------------------------------------------------------------------------------------
// The gateway process.

/// Memory of a process, in KiB.
#[derive(Debug, Clone, Copy, Default)]
struct Mem {
    rss: u64,
    rss_anon: u64,
    /// `Pss_Anon` from `smaps_rollup` (`Anonymous` on kernels without it), when readable.
    pss_anon: Option<u64>,
    threads: u64,
}

fn field_kib(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    line[name.len()..].split_whitespace().next()?.parse().ok()
}

fn read_mem(pid: u32) -> Result<Mem> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).context("reading the gateway's status")?;
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    Ok(Mem {
        rss: field_kib(&status, "VmRSS:").context("VmRSS")?,
        rss_anon: field_kib(&status, "RssAnon:").unwrap_or(0),
        pss_anon: field_kib(&rollup, "Pss_Anon:").or_else(|| field_kib(&rollup, "Anonymous:")),
        threads: field_kib(&status, "Threads:").unwrap_or(0),
    })
}

impl std::fmt::Display for Mem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pss = self.pss_anon.map(|p| format!("{:.1} MiB", p as f64 / 1024.0));
        write!(
            f,
            "VmRSS {:>7.1} MiB, RssAnon {:>7.1} MiB, Pss_Anon {}, {} threads",
            self.rss as f64 / 1024.0,
            self.rss_anon as f64 / 1024.0,
            pss.as_deref().unwrap_or("n/a"),
            self.threads
        )
    }
}

/// Direct children of `pid` (all its threads'): the agent processes, each its own group leader.
fn children_of(pid: u32) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
                out.extend(list.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Whether `pid` is a running (not zombie) process.
fn running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// CPU seconds (user + system) a process has used so far.
fn cpu_secs(pid: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // utime and stime are the 12th and 13th fields after the parenthesised command name.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: f64 = fields
        .get(11..13)
        .map_or(0.0, |f| f.iter().filter_map(|v| v.parse::<f64>().ok()).sum());
    // USER_HZ is 100 on every Linux platform that matters here.
    ticks / 100.0
}

/// CPU seconds of the gateway, of its agents, and of this program.
fn cpu_split(gateway: u32) -> [f64; 3] {
    let agents = children_of(gateway).iter().map(|p| cpu_secs(&p.to_string())).sum();
    [cpu_secs(&gateway.to_string()), agents, cpu_secs("self")]
}

struct GatewayProcess {
    child: Child,
    pid: u32,
    addr: SocketAddr,
    log: PathBuf,
    stopped: bool,
    /// Its data directory and config; removed after the gateway is stopped (fields drop after
    /// `Drop::drop`).
    _dir: tempfile::TempDir,
}

/// Asks the kernel to SIGKILL the gateway when this program dies, however it dies.
#[allow(
    unsafe_code,
    reason = "pre_exec runs between fork and exec; the closure only makes async-signal-safe system calls (prctl, getppid) and allocates nothing"
)]
fn die_with_parent(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec; prctl(PR_SET_PDEATHSIG) and
    // getppid are async-signal-safe, and nothing here allocates or takes a lock.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::other("the benchmark is gone"));
            }
            Ok(())
        });
    }
}

impl GatewayProcess {
    /// Starts `acp-gateway serve --config <config>` in a fresh data directory and waits for the
    /// address it prints. Must be called on the main thread (the death signal follows the
    /// thread that forks).
    fn start(k: &Knobs, print_config: bool) -> Result<Self> {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir()?;
        let config_path = dir.path().join("scale.toml");
        let config_text = config_toml(dir.path(), k);
        std::fs::write(&config_path, &config_text)?;
        if print_config {
            println!("config (JWT secret from ACP_GATEWAY_JWT_SECRET, RUST_LOG=warn; other limits at their defaults):");
            for line in config_text.lines().filter(|l| !l.is_empty()) {
                println!("  {line}");
            }
        }
        let config = config_path.as_path();
        let log = dir.path().join("gateway.log");
        let mut command = std::process::Command::new(gateway_bin());
        command
            .arg("serve")
            .arg("--config")
            .arg(config)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).context("creating the gateway's log")?)
            .process_group(0);
        // The environment must not override the file (DATABASE_URL and ACP_GATEWAY_* would).
        for (name, _) in std::env::vars_os() {
            let name_str = name.to_string_lossy();
            if name_str.starts_with("ACP_GATEWAY_") || name_str == "DATABASE_URL" || name_str == "RUST_LOG" {
                command.env_remove(&name);
            }
        }
        command.env("ACP_GATEWAY_JWT_SECRET", SECRET).env("RUST_LOG", "warn");
        die_with_parent(&mut command);
        let mut child = command.spawn().context("starting the gateway")?;
        let pid = child.id();
        GATEWAY_PGID.store(pid as i32, Ordering::SeqCst);
        *GATEWAY_DIR.lock().unwrap_or_else(|e| e.into_inner()) = Some(dir.path().to_path_buf());
        let stdout = child.stdout.take().context("the gateway's stdout")?;
        let mut this = Self {
            child,
            pid,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            log,
            stopped: false,
            _dir: dir,
        };
        // `serve` prints the web UI's address once listening; the rest of its stdout is drained.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if !sent && let Some(rest) = line.split("http://").nth(1) {
                    let addr = rest.split('/').next().unwrap_or_default().to_string();
                    sent = tx.send(addr).is_ok();
                }
            }
        });
        let addr = rx
            .recv_timeout(STEP)
            .map_err(|_| anyhow!("the gateway printed no address; its log:\n{}", this.log_tail()))?;
        this.addr = addr
            .parse()
            .with_context(|| format!("the gateway's address {addr:?}"))?;
        Ok(this)
    }

    fn mem(&self) -> Result<Mem> {
        read_mem(self.pid)
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Stops the gateway: SIGTERM (it stops its agents), then SIGKILL to its group after 5 s,
    /// then SIGKILL to every agent's group. Returns the agents still running afterwards.
    fn stop(&mut self) -> Vec<i32> {
        if self.stopped {
            return Vec::new();
        }
        self.stopped = true;
        let agents = children_of(self.pid);
        let group = Pid::from_raw(self.pid as i32);
        let _ = killpg(group, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = killpg(group, Signal::SIGKILL);
        let _ = self.child.wait();
        GATEWAY_PGID.store(0, Ordering::SeqCst);
        for &agent in &agents {
            let _ = killpg(Pid::from_raw(agent), Signal::SIGKILL);
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let left: Vec<i32> = agents.iter().copied().filter(|&p| running(p)).collect();
            if left.is_empty() || Instant::now() > deadline {
                return left;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let left = self.stop();
        if !left.is_empty() {
            eprintln!("agent processes still running after the gateway stopped: {left:?}");
        }
    }
}

/// Kills the gateway's group on Ctrl-C or SIGTERM (its agents die with it) and exits.
fn kill_on_signal() {
    tokio::spawn(async {
        acp_gateway::app::shutdown_signal().await;
        let pgid = GATEWAY_PGID.load(Ordering::SeqCst);
        if pgid > 0 {
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
        if let Some(dir) = GATEWAY_DIR.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = std::fs::remove_dir_all(dir);
        }
        eprintln!("interrupted; gateway killed");
        std::process::exit(130);
    });
}

// ---------------------------------------------------------------------------------------------
// Clients.

async fn connect(addr: SocketAddr, token: &str) -> Result<Ws> {
    let tcp = TcpStream::connect(addr).await.context("TCP connect")?;
    tcp.set_nodelay(true)?;
    let mut req = format!("ws://{addr}/acp").into_client_request()?;
    req.headers_mut()
        .insert("authorization", format!("Bearer {token}").parse()?);
    // Small client buffers: ten thousand sockets live in this process too.
    let config = WebSocketConfig::default().read_buffer_size(4096);
    let (ws, resp) = tokio::time::timeout(
        STEP,
        tokio_tungstenite::client_async_with_config(req, tcp, Some(config)),
    )
    .await
    .context("handshake timed out")?
    .context("WebSocket handshake")?;
    ensure!(resp.status().as_u16() == 101, "upgrade answered {}", resp.status());
    Ok(ws)
}

async fn next_text(ws: &mut Ws) -> Result<Value> {
    loop {
        let frame = tokio::time::timeout(STEP, ws.next())
            .await
            .context("no message in time")?
            .context("connection ended")?
            .context("reading")?;
        match frame {
            Message::Text(t) => return serde_json::from_str(&t).context("not JSON"),
            Message::Close(c) => bail!("closed by the gateway: {c:?}"),
            _ => {}
        }
    }
}

/// Sends a request and returns its result; notifications before the answer are skipped.
async fn call(ws: &mut Ws, id: u64, method: &str, params: Value) -> Result<Value> {
    let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    ws.send(Message::text(msg.to_string())).await?;
    loop {
        let v = next_text(ws).await?;
        if v["id"] == json!(id) {
            if let Some(e) = v.get("error") {
                bail!("{method} failed: {e}");
            }
            return Ok(v["result"].clone());
        }
    }
}

/// Connects and initializes; returns the socket and the user's first workspace root.
async fn open(addr: SocketAddr, token: &str) -> Result<(Ws, Value)> {
    let mut ws = connect(addr, token).await?;
    let init = call(&mut ws, 1, "initialize", json!({"protocolVersion": 1})).await?;
    let cwd = init["_meta"]["gateway"]["workspaceRoots"][0].clone();
    ensure!(cwd.is_string(), "initialize named no workspace root: {init}");
    Ok((ws, cwd))
}

/// How a client-initiated close went.
#[derive(Debug, Clone, Copy, Default)]
struct Closed {
    /// The connection ended (end of stream or reset) after our close frame.
    ended: bool,
    /// The gateway answered with a close frame of its own (RFC 6455 5.5.1).
    acknowledged: bool,
}

/// Sends a close frame and reads until the connection ends.
async fn close(ws: &mut Ws) -> Closed {
    let mut closed = Closed::default();
    if ws.close(None).await.is_err() {
        return closed;
    }
    let drained = tokio::time::timeout(STEP, async {
        while let Some(frame) = ws.next().await {
            match frame {
                Ok(Message::Close(_)) => closed.acknowledged = true,
                Ok(_) => {}
                Err(_) => break,
            }
        }
    })
    .await;
    closed.ended = drained.is_ok();
    closed
}

/// The gateway's `acp_gateway_connections` gauge, from `/metrics`.
async fn connections_gauge(addr: SocketAddr) -> Result<f64> {
    let text = reqwest::get(format!("http://{addr}/metrics")).await?.text().await?;
    text.lines()
        .find_map(|l| l.strip_prefix("acp_gateway_connections "))
        .and_then(|v| v.trim().parse().ok())
        .context("no acp_gateway_connections gauge in /metrics")
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

// ---------------------------------------------------------------------------------------------
// 1. Idle connections.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Hold,
    Check,
    Close,
}

enum Report {
    Opened(Result<(), String>),
    Checked(bool),
    Closed(Closed),
}

/// Resolves with the next frame, or never when there is no socket.
async fn next_frame(ws: &mut Option<Ws>) -> Option<Result<Message, tokio_tungstenite::tungstenite::Error>> {
    match ws {
        Some(ws) => ws.next().await,
        None => std::future::pending().await,
    }
}

/// One idle client: opens and initializes, then keeps reading (pings are answered as they come)
/// until told to make one request, then to close.
async fn idle_client(
    addr: SocketAddr,
    token: Arc<str>,
    permit: tokio::sync::OwnedSemaphorePermit,
    mut phase: watch::Receiver<Phase>,
    report: mpsc::UnboundedSender<Report>,
) {
    let mut ws = match open(addr, &token).await {
        Ok((ws, _)) => {
            let _ = report.send(Report::Opened(Ok(())));
            Some(ws)
        }
        Err(e) => {
            let _ = report.send(Report::Opened(Err(format!("{e:#}"))));
            None
        }
    };
    drop(permit);
    loop {
        tokio::select! {
            changed = phase.changed() => {
                if changed.is_err() {
                    return;
                }
                let now = *phase.borrow_and_update();
                match now {
                    Phase::Hold => {}
                    Phase::Check => {
                        let ok = match ws.as_mut() {
                            Some(ws) => call(ws, 2, "session/list", json!({}))
                                .await
                                .is_ok_and(|r| r["sessions"].is_array()),
                            None => false,
                        };
                        let _ = report.send(Report::Checked(ok));
                    }
                    Phase::Close => {
                        let closed = match ws.as_mut() {
                            Some(ws) => close(ws).await,
                            None => Closed::default(),
                        };
                        let _ = report.send(Report::Closed(closed));
                        return;
                    }
                }
            }
            frame = next_frame(&mut ws) => {
                // Pings are answered by the library while reading; anything ending the stream
                // means the connection died: it will fail its check.
                if !matches!(frame, Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Text(_)))) {
                    ws = None;
                }
            }
        }
    }
}

async fn collect<T>(
    rx: &mut mpsc::UnboundedReceiver<Report>,
    n: usize,
    pick: impl Fn(Report) -> Option<T>,
) -> Result<Vec<T>> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let report = tokio::time::timeout(STEP * 2, rx.recv())
            .await
            .context("clients stopped reporting")?
            .context("every client is gone")?;
        if let Some(v) = pick(report) {
            out.push(v);
        }
    }
    Ok(out)
}

async fn idle_connections(gw: &GatewayProcess, auth: &Authenticator, k: &Knobs) -> Result<()> {
    println!(
        "\n## 1. {} idle connections ({} users, {} per user, opened {} at a time; each did `initialize`)",
        k.conns,
        k.idle_users,
        k.conns.div_ceil(k.idle_users),
        k.connect_concurrency
    );
    let tokens: Vec<Arc<str>> = (0..k.idle_users)
        .map(|u| auth.mint(&format!("idle-{u}"), 3600).map(Arc::from))
        .collect::<Result<_, _>>()?;
    // A first connection starts the agent once (its capabilities are cached for everyone).
    let (mut ws, _) = open(gw.addr, &tokens[0]).await?;
    close(&mut ws).await;
    drop(ws);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = gw.mem()?;
    println!("gateway before:              {before}");

    let (phase_tx, phase_rx) = watch::channel(Phase::Hold);
    let (report_tx, mut reports) = mpsc::unbounded_channel();
    let gate = Arc::new(Semaphore::new(k.connect_concurrency));
    let t = Instant::now();
    for i in 0..k.conns {
        let permit = gate.clone().acquire_owned().await?;
        let token = tokens[i % tokens.len()].clone();
        tokio::spawn(idle_client(gw.addr, token, permit, phase_rx.clone(), report_tx.clone()));
    }
    let opened = collect(&mut reports, k.conns, |r| match r {
        Report::Opened(r) => Some(r),
        _ => None,
    })
    .await?;
    let open_secs = t.elapsed().as_secs_f64();
    let failed: Vec<&String> = opened.iter().filter_map(|r| r.as_ref().err()).collect();
    println!(
        "opened {} in {:.2} s ({:.0} connections/s){}",
        k.conns - failed.len(),
        open_secs,
        k.conns as f64 / open_secs,
        failed
            .first()
            .map(|e| format!("; {} FAILED, first: {e}", failed.len()))
            .unwrap_or_default()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = gw.mem()?;
    println!("gateway with all open:       {after}");
    let per = |a: u64, b: u64| (a.saturating_sub(b)) as f64 / k.conns as f64;
    let rss_per = per(after.rss, before.rss);
    println!(
        "per connection: VmRSS {:.1} KiB, RssAnon {:.1} KiB{} (goal <= 64 KiB)",
        rss_per,
        per(after.rss_anon, before.rss_anon),
        match (after.pss_anon, before.pss_anon) {
            (Some(a), Some(b)) => format!(", Pss_Anon {:.1} KiB", per(a, b)),
            _ => String::new(),
        }
    );

    let t = Instant::now();
    phase_tx.send(Phase::Check)?;
    let checked = collect(&mut reports, k.conns, |r| match r {
        Report::Checked(ok) => Some(ok),
        _ => None,
    })
    .await?;
    let alive = checked.iter().filter(|ok| **ok).count();
    println!(
        "alive at the end: {alive}/{} answered a session/list (all at once, {:.2} s)",
        k.conns,
        t.elapsed().as_secs_f64()
    );
    let checked_mem = gw.mem()?;
    println!("gateway after one request each: {checked_mem}");

    phase_tx.send(Phase::Close)?;
    let closed = collect(&mut reports, k.conns, |r| match r {
        Report::Closed(ok) => Some(ok),
        _ => None,
    })
    .await?;
    let ended = closed.iter().filter(|c| c.ended).count();
    let acknowledged = closed.iter().filter(|c| c.acknowledged).count();
    println!(
        "closed by the clients: {ended}/{} ended; {acknowledged}/{} got the gateway's close frame back{}",
        k.conns,
        k.conns,
        if acknowledged < k.conns {
            " (NOTE: the gateway drops the socket without answering a client's close)"
        } else {
            ""
        }
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut gauge = connections_gauge(gw.addr).await?;
    while gauge > 0.0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        gauge = connections_gauge(gw.addr).await?;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    println!(
        "gateway after closing all:   {} (connections gauge: {gauge}; freed heap stays with the allocator)",
        gw.mem()?
    );
    ensure!(failed.is_empty(), "{} connections failed to open", failed.len());
    ensure!(
        alive == k.conns,
        "{} connections were not alive at the end",
        k.conns - alive
    );
    ensure!(
        ended == k.conns,
        "{} connections did not end after the client's close",
        k.conns - ended
    );
    ensure!(gauge == 0.0, "the gateway still counts {gauge} connections");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 2. Concurrent prompts.

#[derive(Default)]
struct PromptReport {
    session: String,
    latencies_ms: Vec<f64>,
    updates: u64,
    errors: Vec<String>,
}

/// One prompt: sends it, checks every notification until the answer.
async fn prompt_once(ws: &mut Ws, id: u64, session: &str, last_seq: &mut u64, expected: u64) -> Result<(f64, u64)> {
    let msg = json!({"jsonrpc": "2.0", "id": id, "method": "session/prompt", "params": {
        "sessionId": session,
        "prompt": [{"type": "text", "text": format!("scale round {id}")}],
    }});
    let t = Instant::now();
    ws.send(Message::text(msg.to_string())).await?;
    let mut updates = 0;
    loop {
        let v = next_text(ws).await?;
        if let Some(method) = v["method"].as_str() {
            ensure!(method == "session/update", "unexpected {method}: {v}");
            let sid = v["params"]["sessionId"].as_str().unwrap_or_default();
            ensure!(
                sid == session,
                "an update of another session ({sid}) reached this client"
            );
            let seq = v["params"]["_meta"]["gateway"]["seq"].as_u64().unwrap_or(0);
            ensure!(seq == *last_seq + 1, "seq {seq} after {last_seq}");
            *last_seq = seq;
            updates += 1;
        } else if v["id"] == json!(id) {
            let ms = t.elapsed().as_secs_f64() * 1e3;
            ensure!(v.get("error").is_none(), "prompt failed: {v}");
            ensure!(v["result"]["stopReason"].is_string(), "no stopReason: {v}");
            ensure!(updates == expected, "{updates} updates, expected {expected}");
            return Ok((ms, updates));
        } else {
            bail!("unexpected message: {v}");
        }
    }
}

struct Round {
    start: Arc<Barrier>,
    end: Arc<Barrier>,
}

async fn prompter(
    addr: SocketAddr,
    token: String,
    gate: Arc<Semaphore>,
    round: Arc<Round>,
    rounds: usize,
    expected: u64,
) -> PromptReport {
    let mut rep = PromptReport::default();
    let setup = async {
        let _permit = gate.acquire().await?;
        let (mut ws, cwd) = open(addr, &token).await?;
        let new = call(&mut ws, 2, "session/new", json!({"cwd": cwd, "mcpServers": []})).await?;
        let session = new["sessionId"].as_str().context("no sessionId")?.to_string();
        anyhow::Ok((ws, session))
    };
    let mut conn = match setup.await {
        Ok((ws, session)) => {
            rep.session = session;
            Some(ws)
        }
        Err(e) => {
            rep.errors.push(format!("setup: {e:#}"));
            None
        }
    };
    let mut last_seq = 0;
    for r in 0..rounds {
        round.start.wait().await;
        if let Some(ws) = conn.as_mut() {
            match prompt_once(ws, 10 + r as u64, &rep.session, &mut last_seq, expected).await {
                Ok((ms, n)) => {
                    rep.latencies_ms.push(ms);
                    rep.updates += n;
                }
                Err(e) => {
                    rep.errors.push(format!("round {r}: {e:#}"));
                    conn = None;
                }
            }
        }
        round.end.wait().await;
    }
    if let Some(ws) = conn.as_mut() {
        close(ws).await;
    }
    rep
}

async fn concurrent_prompts(gw: &GatewayProcess, auth: &Authenticator, k: &Knobs) -> Result<()> {
    let n = k.prompt_users * k.sessions_per_user;
    let expected = k.chunks as u64 + EXTRAS_PER_PROMPT;
    println!(
        "\n## 3. {n} sessions prompting at once ({} users x {} sessions, one connection each; \
         {} rounds; the demo agent streams {} chunks {} us apart = {expected} updates per prompt)",
        k.prompt_users, k.sessions_per_user, k.rounds, k.chunks, k.delay_us
    );
    let round = Arc::new(Round {
        start: Arc::new(Barrier::new(n + 1)),
        end: Arc::new(Barrier::new(n + 1)),
    });
    let gate = Arc::new(Semaphore::new(64));
    let procs_before = children_of(gw.pid).len();
    let t = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for u in 0..k.prompt_users {
        let token = auth.mint(&format!("prompt-{u}"), 3600)?;
        for _ in 0..k.sessions_per_user {
            tasks.push(tokio::spawn(prompter(
                gw.addr,
                token.clone(),
                gate.clone(),
                round.clone(),
                k.rounds,
                expected,
            )));
        }
    }
    let mut walls = Vec::with_capacity(k.rounds);
    let mut cpu = [0.0; 3];
    let mut machine = (0.0, 0.0);
    for r in 0..k.rounds {
        tokio::time::timeout(STEP * 2, round.start.wait())
            .await
            .context("clients never got ready")?;
        if r == 0 {
            println!(
                "setup (connect, initialize, session/new; {} agent processes started): {:.2} s",
                children_of(gw.pid).len().saturating_sub(procs_before),
                t.elapsed().as_secs_f64()
            );
        }
        let cpu_before = cpu_split(gw.pid);
        let machine_before = machine_cpu();
        let t = Instant::now();
        tokio::time::timeout(STEP * 2, round.end.wait())
            .await
            .context("a round never ended")?;
        walls.push(t.elapsed().as_secs_f64());
        for (total, (after, before)) in cpu.iter_mut().zip(cpu_split(gw.pid).iter().zip(cpu_before)) {
            *total += after - before;
        }
        let machine_after = machine_cpu();
        machine.0 += machine_after.0 - machine_before.0;
        machine.1 += machine_after.1 - machine_before.1;
    }
    let mut reports = Vec::with_capacity(n);
    for task in tasks {
        reports.push(task.await?);
    }
    let mut lat: Vec<f64> = reports.iter().flat_map(|r| r.latencies_ms.iter().copied()).collect();
    lat.sort_by(f64::total_cmp);
    let updates: u64 = reports.iter().map(|r| r.updates).sum();
    let wall: f64 = walls.iter().sum();
    let errors: Vec<&String> = reports.iter().flat_map(|r| &r.errors).collect();
    let mut ids: Vec<&str> = reports.iter().map(|r| r.session.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    println!(
        "prompt round trip (ms, {} prompts): p50 {:.1}, p90 {:.1}, p99 {:.1}, max {:.1}",
        lat.len(),
        quantile(&lat, 0.5),
        quantile(&lat, 0.9),
        quantile(&lat, 0.99),
        lat.last().copied().unwrap_or(f64::NAN)
    );
    println!(
        "rounds (s): {}; updates delivered: {updates} ({:.0} updates/s over the rounds' wall time)",
        walls.iter().map(|w| format!("{w:.2}")).collect::<Vec<_>>().join(", "),
        updates as f64 / wall
    );
    println!(
        "CPU during the rounds (s): gateway {:.2}, agents {:.2}, clients (this program) {:.2}; \
         the machine was busy {:.2} of {:.2} (other programs: {:.2})",
        cpu[0],
        cpu[1],
        cpu[2],
        machine.0,
        machine.1,
        (machine.0 - cpu.iter().sum::<f64>()).max(0.0)
    );
    println!(
        "isolation: {} distinct sessions; every client got only its own session's updates, {expected} per \
         prompt, seq without gaps: {}",
        ids.len(),
        if errors.is_empty() { "yes" } else { "NO" }
    );
    println!("gateway with {n} live sessions: {}", gw.mem()?);
    if let Some(e) = errors.first() {
        bail!("{} client errors, first: {e}", errors.len());
    }
    ensure!(ids.len() == n, "session ids are not all distinct");
    ensure!(updates == expected * (n * k.rounds) as u64, "updates missing");
    Ok(())
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
