//! SIGKILL at random points of a 50,000-update stream: nothing a client saw is lost.

use super::*;

/// Reply chunks per streamed prompt.
const CHUNKS: usize = 50_000;
/// Kill points per backend.
const KILLS: usize = 3;
/// The latest kill point, in updates received.
const LATEST_KILL: u64 = 45_000;
/// Updates a demo-agent prompt sends besides its chunks (the stored prompt, a plan, a tool call and
/// two tool call updates).
const DEMO_EXTRAS: usize = 5;
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
