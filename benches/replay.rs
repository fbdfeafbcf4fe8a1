//! How long `session/load` takes to replay a long transcript, and whether memory stays flat.
//!
//! Streams one prompt of `REPLAY_UPDATES` (default 100,000) agent updates through a gateway with a
//! SQLite (or `DATABASE_URL` Postgres) store, then replays the whole transcript to a fresh client
//! several times, and then to four clients at once, printing the time per replay, the rate, and
//! the process's resident memory.
//!
//! `REPLAY_PROMPTS=400 REPLAY_UPDATES=35 REPLAY_DELAY_US=2000` builds the transcript a person
//! makes instead: 400 prompts of 35 updates, each update stored on its own (about one chunk per
//! update), which is what a replay reads slowest.

// Tests and benchmarks spawn freely: their runtime ends with them.
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use acp_gateway::app::Application;
use acp_gateway::infra::config::{CliOverrides, Config, DEFAULT_AGENT};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

async fn connect(url: &str, token: &str) -> Ws {
    let mut req = url.into_client_request().expect("request");
    req.headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().expect("header"));
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.expect("connect");
    call(&mut ws, 0, "initialize", json!({"protocolVersion": 1})).await;
    ws
}

/// Sends a request and reads until its answer; returns (answer, number of updates seen).
async fn call(ws: &mut Ws, id: u64, method: &str, params: serde_json::Value) -> (serde_json::Value, u64) {
    let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    ws.send(Message::text(msg.to_string())).await.expect("send");
    let mut updates = 0;
    loop {
        let t = match ws.next().await {
            Some(Ok(Message::Text(t))) => t,
            Some(Ok(Message::Close(why))) => panic!("the gateway closed the socket: {why:?}"),
            Some(Ok(_)) => continue,
            other => panic!("socket closed: {other:?}"),
        };
        // Cheap classification: updates are notifications; only answers are parsed.
        if t.as_str().starts_with(r#"{"jsonrpc":"2.0","method":"session/update""#) {
            updates += 1;
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&t).expect("json");
        if v["id"] == json!(id) && v.get("method").is_none() {
            return (v, updates);
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let setting =
        |name: &str, default: u64| -> u64 { std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default) };
    let n = setting("REPLAY_UPDATES", 100_000);
    let prompts = setting("REPLAY_PROMPTS", 1);
    let delay_us = setting("REPLAY_DELAY_US", 0);
    let dir = tempfile::tempdir().expect("tmp");
    let mut config = Config::load_with_env(&CliOverrides::default(), |_| None).expect("config");
    config.listen = "127.0.0.1:0".parse().expect("addr");
    config.database_url = std::env::var("DATABASE_URL")
        .ok()
        .filter(|u| u.starts_with("postgres"))
        .unwrap_or_else(|| format!("sqlite://{}/bench.db", dir.path().display()));
    config.data_dir = dir.path().to_path_buf();
    // One user, trusted with /tmp: the benchmark measures replay, not workspace checks.
    config.workspace_roots = vec!["/tmp".into()];
    config.jwt.secret = Some("bench-secret-0123456789-0123456789".to_string().into());
    let agent = config.agents.get_mut(DEFAULT_AGENT).expect("default agent");
    agent.command = env!("CARGO_BIN_EXE_acp-gateway").into();
    agent.args = vec!["demo-agent".into(), "--delay-us".into(), "0".into()];
    let backend = if config.database_url.starts_with("postgres") {
        "postgres"
    } else {
        "sqlite"
    };
    let app = Application::build(config).await.expect("gateway");
    let url = format!("ws://{}/acp", app.local_addr());
    let gw = app.gateway().clone();
    let token = gw.identity.auth.mint("bench", 3600).expect("token");
    tokio::spawn(app.run_until_stopped(std::future::pending()));

    let mut ws = connect(&url, &token).await;
    let (r, _) = call(&mut ws, 1, "session/new", json!({"cwd": "/tmp", "mcpServers": []})).await;
    let sid = r["result"]["sessionId"].as_str().expect("session").to_string();
    let started = Instant::now();
    let mut live = 0;
    for i in 0..prompts {
        let text = format!("[chunks={n}] [delay_us={delay_us}]");
        let prompt = json!({"sessionId": sid, "prompt": [{"type": "text", "text": text}]});
        live += call(&mut ws, 2 + i, "session/prompt", prompt).await.1;
    }
    let stream_time = started.elapsed();
    gw.sessions.flush().await;
    let stored_after = started.elapsed();
    println!(
        "backend: {backend}; transcript: {live} updates from {prompts} prompts streamed live in {stream_time:.2?} \
         ({:.0}/s), all stored after {stored_after:.2?}",
        live as f64 / stream_time.as_secs_f64()
    );

    let mut chunks = 0;
    let mut after = 0;
    loop {
        let page = gw
            .sessions
            .store()
            .read_events("bench", &sid, after, 1024)
            .await
            .expect("read");
        let Some(last) = page.last() else { break };
        after = last.seq_to;
        chunks += page.len();
    }
    println!(
        "stored as {chunks} chunks ({:.2} updates per chunk)",
        live as f64 / chunks.max(1) as f64
    );
    println!(
        "{:>6} {:>10} {:>12} {:>12} {:>10}",
        "run", "updates", "time", "updates/s", "RSS MiB"
    );
    println!(
        "{:>6} {:>10} {:>12} {:>12} {:>10.1}",
        "before",
        "-",
        "-",
        "-",
        rss_mib()
    );
    let mut times = Vec::new();
    for run in 1..=5 {
        let mut c = connect(&url, &token).await;
        let t = Instant::now();
        let (r, replayed) = call(
            &mut c,
            1,
            "session/load",
            json!({"sessionId": sid, "cwd": "/tmp", "mcpServers": []}),
        )
        .await;
        let took = t.elapsed();
        assert!(r.get("result").is_some(), "load failed: {r}");
        assert_eq!(replayed, live, "replay must return every update");
        times.push(took);
        println!(
            "{run:>6} {replayed:>10} {took:>12.2?} {:>12.0} {:>10.1}",
            replayed as f64 / took.as_secs_f64(),
            rss_mib()
        );
        let _ = c.close(None).await;
    }
    // Four replays at once, each on its own socket.
    let t = Instant::now();
    let together = futures_util::future::join_all((0..4).map(|_| async {
        let mut c = connect(&url, &token).await;
        let started = Instant::now();
        let load = json!({"sessionId": sid, "cwd": "/tmp", "mcpServers": []});
        let (r, replayed) = call(&mut c, 1, "session/load", load).await;
        assert!(r.get("result").is_some(), "load failed: {r}");
        assert_eq!(replayed, live, "replay must return every update");
        started.elapsed()
    }))
    .await;
    let slowest = together.iter().max().copied().unwrap_or_default();
    println!(
        "four at once: slowest {slowest:.2?} ({:.0} updates/s each), all done in {:.2?}, RSS {:.1} MiB",
        live as f64 / slowest.as_secs_f64(),
        t.elapsed(),
        rss_mib()
    );
    times.sort();
    let median = times[times.len() / 2];
    println!(
        "median replay of {live} updates: {median:.2?} (goal: under {:?})",
        Duration::from_secs(1)
    );
}
