//! How long `session/load` takes to replay a long transcript, and whether memory stays flat.
//!
//! Streams one prompt of `REPLAY_UPDATES` (default 100,000) agent updates through a gateway with a
//! SQLite (or `DATABASE_URL` Postgres) store, then replays the whole transcript to a fresh client
//! several times, printing the time per replay, the rate, and the process's resident memory.

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
        let Some(Ok(Message::Text(t))) = ws.next().await else {
            panic!("socket closed")
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
    let n: u64 = std::env::var("REPLAY_UPDATES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
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
    let token = gw.auth.mint("bench", 3600).expect("token");
    tokio::spawn(app.run_until_stopped(std::future::pending()));

    let mut ws = connect(&url, &token).await;
    let (r, _) = call(&mut ws, 1, "session/new", json!({"cwd": "/tmp", "mcpServers": []})).await;
    let sid = r["result"]["sessionId"].as_str().expect("session").to_string();
    let started = Instant::now();
    let prompt = json!({"sessionId": sid, "prompt": [{"type": "text", "text": format!("[chunks={n}] [delay_us=0]")}]});
    let (_, live) = call(&mut ws, 2, "session/prompt", prompt).await;
    let stream_time = started.elapsed();
    gw.sessions.flush().await;
    let stored_after = started.elapsed();
    println!(
        "backend: {backend}; transcript: {live} updates streamed live in {stream_time:.2?} ({:.0}/s), all stored after {stored_after:.2?}",
        live as f64 / stream_time.as_secs_f64()
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
    times.sort();
    let median = times[times.len() / 2];
    println!(
        "median replay of {live} updates: {median:.2?} (goal: under {:?})",
        Duration::from_secs(1)
    );
}
