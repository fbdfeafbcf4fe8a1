//! `session/new` for a user whose agent process is already warm vs one that must be spawned,
//! with the bubblewrap sandbox and without, side by side in one run.
//!
//! Run: `cargo bench --bench session_new`. `BENCH_USERS` (default 20): users per case, each
//! connecting once and creating one session. Each case runs its own in-process gateway (SQLite,
//! the demo agent); the warm cases use `min_idle = 1`, which starts a process for a user when
//! they connect, and wait for it before timing `session/new`.

// Tests and benchmarks spawn freely: their runtime ends with them.
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use acp_gateway::app::Application;
use acp_gateway::infra::config::{CliOverrides, Config, DEFAULT_AGENT, SandboxMode};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

const STEP: Duration = Duration::from_secs(60);

async fn call(ws: &mut Ws, id: u64, method: &str, params: Value) -> Value {
    let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    ws.send(Message::text(msg.to_string())).await.expect("send");
    loop {
        let frame = tokio::time::timeout(STEP, ws.next())
            .await
            .expect("an answer in time")
            .expect("open")
            .expect("frame");
        if let Message::Text(t) = frame {
            let v: Value = serde_json::from_str(&t).expect("json");
            if v["id"] == json!(id) {
                assert!(v.get("error").is_none(), "{method} failed: {v}");
                return v;
            }
        }
    }
}

/// Medians and p90 of `session/new` for `users` fresh users.
async fn case(sandbox: SandboxMode, warm: bool, users: usize) -> (f64, f64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = Config::load_with_env(&CliOverrides::default(), |_| None).expect("config");
    config.listen = "127.0.0.1:0".parse().expect("addr");
    config.database_url = format!("sqlite://{}/bench.db", dir.path().display());
    config.data_dir = dir.path().to_path_buf();
    config.jwt.secret = Some("bench-secret-0123456789-0123456789".to_string().into());
    let agent = config.agents.get_mut(DEFAULT_AGENT).expect("default agent");
    agent.command = env!("CARGO_BIN_EXE_acp-gateway").into();
    agent.args = vec!["demo-agent".into(), "--delay-us".into(), "0".into()];
    agent.sandbox = sandbox;
    agent.pool.min_idle = usize::from(warm);
    let app = Application::build(config).await.expect("gateway");
    let url = format!("ws://{}/acp", app.local_addr());
    let gw = app.gateway().clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until_stopped(async move {
        let _ = stopped.await;
    }));
    let pool = gw.agents.pools.get(DEFAULT_AGENT).expect("pool").clone();
    // Learn the agent's capabilities once, so every case times only the user's process.
    pool.info().await.expect("agent starts");
    let mut samples = Vec::with_capacity(users);
    let mut sockets = Vec::with_capacity(users);
    for i in 0..users {
        let user = format!("user{i}");
        let mut req = url.as_str().into_client_request().expect("request");
        let token = gw.identity.auth.mint(&user, 600).expect("token");
        req.headers_mut()
            .insert("authorization", format!("Bearer {token}").parse().expect("header"));
        let (mut ws, _) = tokio_tungstenite::connect_async(req).await.expect("connect");
        let before = pool.process_count();
        let init = call(&mut ws, 1, "initialize", json!({"protocolVersion": 1})).await;
        let cwd = init["result"]["_meta"]["gateway"]["workspaceRoots"][0].clone();
        if warm {
            let deadline = Instant::now() + STEP;
            while pool.process_count() == before {
                assert!(Instant::now() < deadline, "the warm process never started");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            // The process is listed once it has answered `initialize`: it is ready.
        }
        let t = Instant::now();
        call(&mut ws, 2, "session/new", json!({"cwd": cwd, "mcpServers": []})).await;
        samples.push(t.elapsed().as_secs_f64() * 1e3);
        sockets.push(ws);
    }
    drop(sockets);
    let _ = stop.send(());
    let _ = server.await;
    samples.sort_by(f64::total_cmp);
    (samples[samples.len() / 2], samples[samples.len() * 9 / 10])
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let users = std::env::var("BENCH_USERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    println!("session/new per fresh user, {users} users per case (ms)");
    println!("{:<10} {:<6} {:>8} {:>8}", "sandbox", "start", "p50", "p90");
    let mut rows = Vec::new();
    for sandbox in [SandboxMode::None, SandboxMode::Bwrap] {
        for warm in [false, true] {
            let (p50, p90) = case(sandbox, warm, users).await;
            let label = if warm { "warm" } else { "cold" };
            println!("{:<10} {:<6} {:>8.2} {:>8.2}", format!("{sandbox:?}"), label, p50, p90);
            rows.push(p50);
        }
    }
    println!(
        "cold/warm p50: {:.1}x without sandbox, {:.1}x with bubblewrap; bubblewrap's cold-start cost: {:.2} ms",
        rows[0] / rows[1],
        rows[2] / rows[3],
        rows[2] - rows[0]
    );
}
