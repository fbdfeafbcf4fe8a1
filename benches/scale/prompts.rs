//! Part 3: concurrent prompts, each client checked to get exactly its own session's updates, in
//! order.

use super::*;

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

pub(crate) async fn concurrent_prompts(gw: &GatewayProcess, auth: &Authenticator, k: &Knobs) -> Result<()> {
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
