//! Issue 8: a client that stops reading slows nobody else, and a SIGKILLed gateway loses nothing a
//! client saw (the contract's "Limits and faults" and "Durability").
//!
//! Every test here takes [`SERIAL`]: the stall tests measure latencies (on 2 cores a concurrent
//! 50,000-update stream would be what they measure), and the metric they watch is per process.
//!
//! Figures are printed; see them with `cargo test --test durability -- --nocapture`.
//! `DURABILITY_SEED=N` replays the kill points of an earlier run.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use acp_gateway::config::DEFAULT_AGENT;
use common::procfs::{self, TcpSocket};
use common::serve_process::{ServeProcess, marked_gateway_bin};
use common::{Client, Db, TestGateway, WAIT, seq, wait_until};
use serde_json::{Value, json};

/// One test at a time in this binary (see the module docs).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

// ---------------------------------------------------------------------------------------------
// A tab that stops reading
// ---------------------------------------------------------------------------------------------

/// Prompts per latency measurement.
const ROUND_TRIPS: usize = 20;
/// The stuck tab's kernel receive buffer (the kernel doubles it).
const STUCK_RECV_BUFFER: u32 = 4096;
/// Frames per client outbox in these tests (small, so the stuck tab's queue fills at once).
const CLIENT_QUEUE: usize = 256;
/// Bytes per client outbox in these tests.
const CLIENT_QUEUE_BYTES: usize = 256 << 10;
/// How long the stuck tab may take nothing before it is closed.
const STUCK_TIMEOUT_SECS: u64 = 2;

/// `/proc/net/tcp`'s state number for an established connection.
const TCP_ESTABLISHED: u8 = 1;

/// Round trips of `n` prompts of "hi" on `session`, one after the other.
async fn round_trips(tab: &mut Client, session: &str, n: usize) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let r = tab.prompt(session, "hi").await;
        out.push(start.elapsed());
        assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
        tab.take_updates(session);
    }
    out
}

/// Median and maximum.
fn p50_max(samples: &[Duration]) -> (Duration, Duration) {
    let mut s = samples.to_vec();
    s.sort();
    (s[s.len() / 2], *s.last().expect("samples"))
}

/// `acp_gateway_slow_clients_dropped_total` of this process (the in-process gateway's recorder).
fn slow_clients_dropped() -> f64 {
    common::metric_sum("acp_gateway_slow_clients_dropped_total")
}

/// WebSocket connections the gateway holds a slot for.
fn open_connections(gw: &TestGateway) -> usize {
    gw.gw.config.limits.max_connections - gw.gw.connection_slots.available_permits()
}

/// Targets (`socket:[…]`, paths…) this process has more fds on than in `before`, with how many more.
fn more_fds_than(before: &[String]) -> Vec<(String, usize)> {
    let mut counts: HashMap<String, isize> = HashMap::new();
    for t in procfs::fd_targets() {
        *counts.entry(t).or_default() += 1;
    }
    for t in before {
        *counts.entry(t.clone()).or_default() -= 1;
    }
    let mut more: Vec<(String, usize)> = counts
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(t, n)| (t, n as usize))
        .collect();
    more.sort();
    more
}

/// One user's tab stops reading in the middle of a fast stream; another tab (of the same user, or
/// of another user on the same shared agent process) keeps prompting. The contract: the stuck tab
/// never slows the other one, is closed with 1013 once it has taken nothing for
/// `slow_client_timeout_secs`, and its socket is released.
async fn stuck_tab(shared_process: bool) {
    let _serial = SERIAL.lock().await;
    let gw = TestGateway::start(Db::Sqlite, |cfg| {
        cfg.limits.client_queue = CLIENT_QUEUE;
        cfg.limits.client_queue_bytes = CLIENT_QUEUE_BYTES;
        // Keepalive must not be what ends the stuck tab (it sends no pongs while stuck).
        cfg.limits.ping_interval_secs = 120;
        cfg.limits.slow_client_timeout_secs = STUCK_TIMEOUT_SECS;
        let agent = cfg.agents.get_mut(DEFAULT_AGENT).expect("default agent");
        agent.pool.share_between_users = shared_process;
    })
    .await;
    let (stuck_user, other_user) = if shared_process {
        ("alice", "bob")
    } else {
        ("alice", "alice")
    };
    let mut tab = gw.client(other_user).await;
    let session = tab.new_session().await;
    round_trips(&mut tab, &session, 5).await; // warm-up
    let quiet = round_trips(&mut tab, &session, ROUND_TRIPS).await;
    // The database's files are left out of fd counts: its connection pool opens connections on
    // demand (under the stuck tab's stream) and keeps them.
    let db_file = gw.db_url.trim_start_matches("sqlite://").to_string();
    let fds = || procfs::fd_targets().iter().filter(|t| !t.starts_with(&db_file)).count();
    let fds_before = fds();
    let fd_list_before = procfs::fd_targets();
    let drops_before = slow_clients_dropped();

    // The stuck tab: small receive buffer, a long fast prompt, then it never reads again.
    let mut stuck =
        Client::connect_with_recv_buffer(&gw.ws_url(), gw.addr, &gw.token(stuck_user), STUCK_RECV_BUFFER).await;
    stuck.initialize().await;
    let stuck_session = stuck.new_session().await;
    let pool = gw.gw.pools.get(DEFAULT_AGENT).expect("pool").clone();
    assert_eq!(
        pool.pids().len(),
        1,
        "both sessions must live on one agent process for this test to mean anything"
    );
    let client_end = stuck.local_addr();
    let gateway_end: TcpSocket = procfs::tcp_socket(gw.addr, client_end).expect("the gateway's end of the stuck tab");
    assert_eq!(
        procfs::fds_on_socket(gateway_end.inode),
        1,
        "the gateway holds the stuck tab's socket"
    );
    let connections_with_stuck = open_connections(&gw);
    let fds_with_stuck = fds();
    stuck
        .start(
            "session/prompt",
            json!({"sessionId": stuck_session, "prompt": [{"type": "text", "text": "[chunks=200000] [delay_us=0]"}]}),
        )
        .await;
    // Stuck: the tab's kernel buffer holds bytes it does not read and the gateway has bytes it
    // cannot send, both unchanged for 20 ms (the window is shut); or the gateway has already let go
    // of its end.
    let mut last: Option<(u64, u64, Instant)> = None;
    let mut queues = (0, 0, "still established");
    let backed_up = wait_until(WAIT, || {
        let gateway = procfs::tcp_socket(gw.addr, client_end);
        let client = procfs::tcp_socket(client_end, gw.addr);
        let (Some(g), Some(c)) = (gateway, client) else {
            return false;
        };
        queues = (g.tx_queue, c.rx_queue, "still established");
        if g.state != TCP_ESTABLISHED || g.inode != gateway_end.inode {
            queues.2 = "the gateway was already closing it";
            return true;
        }
        if g.tx_queue == 0 || c.rx_queue == 0 {
            last = None;
            return false;
        }
        match last {
            Some((tx, rx, since)) if (tx, rx) == (g.tx_queue, c.rx_queue) => {
                since.elapsed() >= Duration::from_millis(20)
            }
            _ => {
                last = Some((g.tx_queue, c.rx_queue, Instant::now()));
                false
            }
        }
    })
    .await
    .expect("the stuck tab's socket backs up");

    let stalled = round_trips(&mut tab, &session, ROUND_TRIPS).await;

    // Wait for the gateway to give up on the stuck tab (the drop counter, or its connection slot),
    // then read what is left on its socket: what was in flight, then the close frame.
    let dropped_after = wait_until(WAIT, || {
        slow_clients_dropped() > drops_before || open_connections(&gw) < connections_with_stuck
    })
    .await;
    let ending = stuck.read_to_end().await;
    let released_after = wait_until(WAIT, || procfs::fds_on_socket(gateway_end.inode) == 0).await;
    drop(stuck);
    let fds_back_after = wait_until(WAIT, || fds() <= fds_before).await;
    let fds_after = fds();

    let (q50, qmax) = p50_max(&quiet);
    let (s50, smax) = p50_max(&stalled);
    let added_p50 = s50.saturating_sub(q50);
    let worst_added = smax.saturating_sub(q50);
    println!(
        "stuck tab ({}): {ROUND_TRIPS} prompt round trips on another session of the same process\n  \
         quiet:               p50 {} max {}\n  \
         stuck tab backed up: p50 {} max {}  (socket queues: gateway tx {} B, tab rx {} B, {}, after {})\n  \
         added delay:         p50 {}  worst {}\n  \
         stuck tab dropped by the gateway: {}\n  \
         then read: {} text frames ({} B), close frame: {} code {:?} {:?}, error {:?}\n  \
         gateway's socket for it released: {}\n  \
         open fds (besides the database's): before the stuck tab {fds_before}, with it {}, after {fds_after} ({}); \
         all fds now {}\n  \
         stalled round trips in order: {:?}",
        if shared_process {
            "another user, share_between_users = true"
        } else {
            "same user"
        },
        ms(q50),
        ms(qmax),
        ms(s50),
        ms(smax),
        queues.0,
        queues.1,
        queues.2,
        ms(backed_up),
        ms(added_p50),
        ms(worst_added),
        dropped_after.map_or("not within the wait".into(), |d| format!(
            "{} after the stalled round trips",
            ms(d)
        )),
        ending.texts,
        ending.bytes,
        ending.closed_by_frame,
        ending.close_code,
        ending.close_reason,
        ending.error,
        released_after.map_or("NO".into(), |d| format!("{} after reading", ms(d))),
        fds_with_stuck,
        fds_back_after.map_or("NOT back to the baseline".into(), |d| format!("back in {}", ms(d))),
        procfs::open_fds(),
        stalled.iter().map(|d| d.as_millis()).collect::<Vec<_>>(),
    );

    let mut failures = Vec::new();
    if added_p50 >= Duration::from_millis(100) || worst_added >= Duration::from_secs(1) {
        failures.push(format!(
            "a stuck tab delayed another tab's prompts: p50 {} → {}, max {} → {} (allowed: +100 ms p50, +1 s worst)",
            ms(q50),
            ms(s50),
            ms(qmax),
            ms(smax)
        ));
    }
    if dropped_after.is_none() {
        failures.push(
            "the gateway never dropped the stuck tab (no slow-client drop counted, its connection slot still held)"
                .to_string(),
        );
    }
    if ending.close_code != Some(1013) {
        failures.push(format!(
            "after the frames in flight, the stuck tab must get a close frame with code 1013; got {ending:?} \
             (the gateway must put the close frame behind what the socket already holds, and keep the socket \
             a bounded time for it to drain, before it lets go)"
        ));
    }
    if released_after.is_none() {
        failures.push(format!(
            "the gateway still holds the stuck tab's socket (inode {})",
            gateway_end.inode
        ));
    }
    if fds_back_after.is_none() {
        failures.push(format!(
            "open fds did not return to {fds_before}: now {fds_after}; more than before: {:?}",
            more_fds_than(&fd_list_before)
                .into_iter()
                .filter(|(t, _)| !t.starts_with(&db_file))
                .collect::<Vec<_>>()
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // The other tab is fine, and the stuck user can come back (and stop their stream).
    let r = tab.prompt(&session, "still here").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let mut back = gw.client(stuck_user).await;
    back.send(json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": stuck_session}}))
        .await;
    tab.close().await;
    back.close().await;
    let stopping = Instant::now();
    gw.stop().await;
    println!("  gateway stopped in {}", ms(stopping.elapsed()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_tab_does_not_delay_another_tab() {
    stuck_tab(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_user_does_not_delay_another_user_on_a_shared_process() {
    stuck_tab(true).await;
}

// ---------------------------------------------------------------------------------------------
// SIGKILL at random points of a 50,000-update stream
// ---------------------------------------------------------------------------------------------

/// Reply chunks per streamed prompt.
const CHUNKS: usize = 50_000;
/// Kill points per backend.
const KILLS: usize = 3;
/// The latest kill point, in updates received.
const LATEST_KILL: u64 = 45_000;
/// Updates a demo-agent prompt sends besides its chunks (the stored prompt, a plan, a tool call and
/// two tool call updates).
const DEMO_EXTRAS: usize = 5;
/// The JWT secret of the gateway processes.
const SECRET: &str = "durability-secret-0123456789-0123456789";

/// splitmix64: enough randomness for kill points, reproducible from a printed seed.
struct Rng(u64);

impl Rng {
    fn seeded() -> (Self, u64) {
        let seed = std::env::var("DURABILITY_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .expect("clock");
                t.as_nanos() as u64 ^ u64::from(std::process::id())
            });
        (Self(seed), seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `1..=max`.
    fn between_1_and(&mut self, max: u64) -> u64 {
        1 + self.next() % max
    }
}

/// A gateway process on `db_url`, its demo agent under a fresh `/proc`-findable name.
struct Gw {
    process: ServeProcess,
    /// What every one of its agent processes has in its command line.
    marker: String,
    sandbox: &'static str,
}

/// Starts a gateway whose client outboxes never overflow: the test's client (a debug build, on 2
/// cores shared with the gateway, the agent and the database) can fall behind a `delay_us=0`
/// stream, and a 1013 is not what these tests are about.
async fn start_gateway(dir: &Path, db_url: &str, sandbox: &'static str) -> Gw {
    let agent = marked_gateway_bin("durability");
    let config = dir.join("gw.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\n\
             [limits]\n\
             client_queue = 1000000\n\
             client_queue_bytes = 1000000000\n\
             [agents.default]\n\
             command = {:?}\n\
             args = [\"demo-agent\", \"--delay-us\", \"0\"]\n\
             sandbox = {sandbox:?}\n",
            dir.join("data").display().to_string(),
            agent.display().to_string(),
        ),
    )
    .expect("config");
    Gw {
        process: ServeProcess::start(&config, db_url, SECRET).await,
        marker: agent.display().to_string(),
        sandbox,
    }
}

/// Kills (by pid) processes this test started that should not be there any more.
fn kill_leftovers(pids: &[u32]) {
    for pid in pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

async fn sigkill_rounds(db: Db, sandboxes: [&'static str; KILLS]) {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let (mut rng, seed) = Rng::seeded();
    let backend = match db {
        Db::Sqlite => "sqlite",
        _ => "postgres",
    };
    println!("sigkill ({backend}): seed {seed} (DURABILITY_SEED={seed} to replay these kill points)");
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().canonicalize().expect("canon");
    let db_url = match db {
        Db::Sqlite => format!("sqlite://{}", dir.join("data/acp-gateway.db").display()),
        Db::Postgres => common::pg::fresh_database().await,
        Db::Url(u) => u,
    };
    // Everything the kill points found wrong, reported together at the end.
    let mut failures: Vec<String> = Vec::new();
    let mut gw = start_gateway(&dir, &db_url, sandboxes[0]).await;
    for (round, next_sandbox) in sandboxes.iter().skip(1).chain([&"bwrap"]).enumerate() {
        let round_start = Instant::now();
        let kill_at = rng.between_1_and(LATEST_KILL) as usize;
        let mut c = gw.process.client("alice").await;
        let s = c.new_session().await;
        let agents = common::processes_matching(&gw.marker);
        assert!(!agents.is_empty(), "the agent runs under its marked name {}", gw.marker);
        c.start(
            "session/prompt",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": format!("[chunks={CHUNKS}] [delay_us=0]")}]}),
        )
        .await;
        // Read as fast as the stream comes (raw frames, parsed after the kill), so the kill lands
        // where the gateway is in the stream, not far behind it in the socket buffers.
        let mut frames = Vec::with_capacity(CHUNKS + 16);
        let mut updates = 0;
        while updates < kill_at {
            let Some(text) = c.recv_text().await else {
                panic!("the gateway ended the stream after {updates} updates, before the kill point {kill_at}")
            };
            updates += usize::from(text.contains("\"session/update\""));
            frames.push(text);
        }
        // SIGKILL, then read whatever the gateway had already put on the wire: that was sent too.
        let gateway_pid = gw.process.pid();
        let killed_sandbox = gw.sandbox;
        gw.process.kill().await;
        let frames_at_kill = frames.len();
        while let Some(text) = c.recv_text().await {
            frames.push(text);
        }
        let mut received: Vec<(u64, Value)> = Vec::with_capacity(frames.len());
        let mut at_kill = 0;
        for (i, text) in frames.iter().enumerate() {
            let m: Value = serde_json::from_str(text).expect("the gateway sends JSON");
            if m["method"] == "session/update" && m["params"]["sessionId"] == s {
                received.push((seq(&m), m["params"]["update"].clone()));
                if i < frames_at_kill {
                    at_kill += 1;
                }
            }
        }
        let in_flight = received.len() - at_kill;
        let max_received = received.iter().map(|(s, _)| *s).max().unwrap_or(0);
        let stream_total = (CHUNKS + DEMO_EXTRAS) as u64;

        // No agent process outlives its gateway.
        let gone = wait_until(WAIT, || common::processes_matching(&gw.marker).is_empty()).await;
        if gone.is_none() {
            let left = procfs::describe_processes(&gw.marker);
            failures.push(format!(
                "round {round} ({backend}, sandbox = {killed_sandbox}): agent processes outlived the SIGKILLed gateway \
                 {gateway_pid}: {left:?}"
            ));
            kill_leftovers(&common::processes_matching(&gw.marker));
        }
        let _ = std::fs::remove_file(&gw.marker);

        // Restart on the same database and load the session.
        gw = start_gateway(&dir, &db_url, next_sandbox).await;
        let mut c = gw.process.client("alice").await;
        let root = c.root.clone();
        let r = c
            .request("session/load", json!({"sessionId": s, "cwd": root, "mcpServers": []}))
            .await;
        assert!(r.get("result").is_some(), "session/load after the restart: {r}");
        let replay: Vec<(u64, Value)> = c
            .take_updates(&s)
            .into_iter()
            .map(|m| (seq(&m), m["params"]["update"].clone()))
            .collect();
        let max_replayed = replay.iter().map(|(s, _)| *s).max().unwrap_or(0);
        let in_order = replay.windows(2).all(|w| w[0].0 < w[1].0);
        let stored: HashMap<u64, &Value> = replay.iter().map(|(s, u)| (*s, u)).collect();
        let missing: Vec<u64> = received
            .iter()
            .filter(|(s, _)| !stored.contains_key(s))
            .map(|(s, _)| *s)
            .collect();
        let differing: Vec<u64> = received
            .iter()
            .filter(|(s, u)| stored.get(s).is_some_and(|stored| *stored != u))
            .map(|(s, _)| *s)
            .collect();

        // The session carries on above every seq ever sent.
        let r = c.prompt(&s, "after [chunks=3]").await;
        let after: Vec<u64> = c.take_updates(&s).iter().map(seq).collect();
        let first_after = after.first().copied();

        println!(
            "  round {round} ({backend}, sandbox = {killed_sandbox}): {at_kill} updates received at the SIGKILL (+{in_flight} in flight), \
             max seq {max_received} of {stream_total}{}; agents gone: {}; replay after restart: {} updates, max seq {max_replayed}, \
             missing {} of the received, {} differing; first seq after restart {first_after:?}; {}",
            if max_received < stream_total {
                " (mid-stream)"
            } else {
                " (the stream had ended)"
            },
            gone.map_or("NO".into(), ms),
            replay.len(),
            missing.len(),
            differing.len(),
            ms(round_start.elapsed()),
        );
        let tag = format!("round {round} ({backend}, kill after {at_kill}, seed {seed})");
        if !missing.is_empty() {
            failures.push(format!(
                "{tag}: {} updates a client received are not in the replay (seqs {}..={}, first few {:?}); \
                 the replay ends at seq {max_replayed}, the client saw up to {max_received}",
                missing.len(),
                missing.first().expect("some"),
                missing.last().expect("some"),
                &missing[..missing.len().min(5)]
            ));
        }
        if !differing.is_empty() {
            failures.push(format!(
                "{tag}: {} replayed updates differ from what the client received under the same seq (first {:?}: \
                 received {}, replayed {})",
                differing.len(),
                differing[0],
                received.iter().find(|(s, _)| *s == differing[0]).expect("there").1,
                stored[&differing[0]],
            ));
        }
        if !in_order {
            failures.push(format!("{tag}: the replay's seqs are not strictly increasing"));
        }
        if r["result"]["stopReason"] != "end_turn" {
            failures.push(format!("{tag}: the prompt after the restart failed: {r}"));
        }
        match first_after {
            Some(first) if first > max_received && first > max_replayed => {}
            other => failures.push(format!(
                "{tag}: the first update after the restart has seq {other:?}; every seq sent before was up to \
                 {max_received} (live) / {max_replayed} (replayed)"
            )),
        }
        c.close().await;
    }
    let last_marker = gw.marker.clone();
    gw.process.stop().await;
    let _ = wait_until(WAIT, || common::processes_matching(&last_marker).is_empty()).await;
    let _ = std::fs::remove_file(&last_marker);
    println!("sigkill ({backend}): {KILLS} kill points in {}", ms(started.elapsed()));
    assert!(
        failures.is_empty(),
        "SIGKILL lost what a client saw ({backend}, seed {seed}):\n{}",
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_sigkill_loses_nothing_a_client_saw_sqlite() {
    sigkill_rounds(Db::Sqlite, ["bwrap", "none", "bwrap"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_sigkill_loses_nothing_a_client_saw_postgres() {
    sigkill_rounds(Db::Postgres, ["none", "bwrap", "none"]).await;
}

// ---------------------------------------------------------------------------------------------
// No agent process outlives a SIGKILLed gateway, including what the agent itself started
// ---------------------------------------------------------------------------------------------

/// An agent that, like a coding agent running a shell command, has a child of its own that does
/// not read stdin (so it never sees the gateway's pipe close): `sleep` with a unique duration.
async fn agent_children_die_with_the_gateway(sandbox: &'static str) {
    let _serial = SERIAL.lock().await;
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().canonicalize().expect("canon");
    let agent = marked_gateway_bin("children");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .subsec_nanos();
    let child_marker = format!("86400.{}{nanos:09}", std::process::id());
    let script = format!("sleep {child_marker} & exec \"$0\" demo-agent --delay-us 0");
    let config = dir.join("gw.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\n[agents.default]\ncommand = \"/bin/sh\"\nargs = [\"-c\", {script:?}, {:?}]\nsandbox = {sandbox:?}\n",
            dir.join("data").display().to_string(),
            agent.display().to_string(),
        ),
    )
    .expect("config");
    let db_url = format!("sqlite://{}", dir.join("data/acp-gateway.db").display());
    let gw = ServeProcess::start(&config, &db_url, SECRET).await;
    let mut c = gw.client("alice").await;
    let s = c.new_session().await;
    let r = c.prompt(&s, "hello [chunks=3]").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let marker = agent.display().to_string();
    let ours = || {
        let mut p = common::processes_matching(&marker);
        p.extend(common::processes_matching(&child_marker));
        p.sort_unstable();
        p.dedup();
        p
    };
    let before = ours();
    assert!(
        !common::processes_matching(&child_marker).is_empty() && !common::processes_matching(&marker).is_empty(),
        "the agent and its child run: {before:?}"
    );
    gw.kill().await;
    if sandbox == "none" {
        // Unsandboxed, the agent itself has a parent-death signal; what it started has none,
        // and is killed with its process group when the gateway next starts (the reaper).
        let agent_gone = wait_until(WAIT, || common::processes_matching(&marker).is_empty()).await;
        if agent_gone.is_none() {
            kill_leftovers(&ours());
        }
        assert!(
            agent_gone.is_some(),
            "the agent outlived the SIGKILLed gateway (sandbox = none)"
        );
        let again = ServeProcess::start(&config, &db_url, SECRET).await;
        let gone = wait_until(WAIT, || ours().is_empty()).await;
        println!(
            "sandbox = none: the agent died with the gateway; its child was killed at the next start: {}",
            gone.map_or("NO".into(), ms)
        );
        if gone.is_none() {
            kill_leftovers(&ours());
        }
        again.stop().await;
        let _ = std::fs::remove_file(&agent);
        assert!(
            gone.is_some(),
            "the agent's child survived the next start (sandbox = none)"
        );
        return;
    }
    let gone = wait_until(WAIT, || ours().is_empty()).await;
    let left: Vec<String> = procfs::describe_processes(&marker)
        .into_iter()
        .chain(procfs::describe_processes(&child_marker))
        .collect();
    println!(
        "sandbox = {sandbox}: {} agent processes before the SIGKILL; after: {}",
        before.len(),
        gone.map_or_else(
            || format!("still running {left:?}"),
            |d| format!("all gone in {}", ms(d))
        )
    );
    if gone.is_none() {
        kill_leftovers(&ours());
    }
    let _ = std::fs::remove_file(&agent);
    assert!(
        gone.is_some(),
        "processes of the agent outlived the SIGKILLed gateway (sandbox = {sandbox}): {left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_own_children_die_with_a_sigkilled_gateway_bwrap() {
    agent_children_die_with_the_gateway("bwrap").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsandboxed_agent_dies_with_a_sigkilled_gateway_and_its_children_at_the_next_start() {
    agent_children_die_with_the_gateway("none").await;
}
