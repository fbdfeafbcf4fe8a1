//! Sections 2 to 4: one connection streaming as fast as the agent writes, the memory that takes,
//! and eight connections streaming at once.

use super::*;

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
        bail!(
            "MISMATCH: received {notes} updates, expected {} (N={n} + {extras} extras)",
            n + extras
        );
    }
    Ok(Throughput {
        updates: notes,
        secs: rt.as_secs_f64(),
    })
}

/// Median and best rate of some runs.
fn rates(runs: &[Throughput]) -> (f64, f64) {
    let r: Vec<f64> = runs.iter().map(Throughput::rate).collect();
    let best = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (median(r), best)
}

/// Section 2: one connection streaming as fast as the agent writes; section 3: memory.
pub(super) async fn throughput(
    gw_rt: &tokio::runtime::Runtime,
    gw: &Gateway,
    direct: &mut Path<AgentPipe>,
    via: &mut Path<WsClient>,
    mut peer: Option<&mut Path<Peer>>,
    k: &Knobs,
    md: &mut String,
) -> Result<()> {
    println!();
    println!(
        "== 2. streaming throughput: one prompt, [chunks={}] [delay_us=0], one connection ==",
        k.n_updates
    );
    let (rss0, _) = rss_kib();
    let (mut d_runs, mut g_runs, mut p_runs) = (Vec::new(), Vec::new(), Vec::new());
    let mut flush_ms = Vec::new();
    // The gateway's own CPU time per update streamed (steadier than rates on a noisy machine).
    let mut cpu_us = Vec::new();
    // Updates per transcript commit in each run.
    let mut per_commit = Vec::new();
    let mut rss_after_stream = 0;
    let mut hwm = 0;
    for _ in 0..k.tp_runs {
        d_runs.push(stream_once(&mut direct.rpc, &direct.session, k.n_updates, AGENT_EXTRAS).await?);
        if let Some(p) = peer.as_deref_mut() {
            p_runs.push(stream_once(&mut p.rpc, &p.session, k.n_updates, AGENT_EXTRAS).await?);
        }
        let before = stored_last_seq(gw_rt, gw, &via.session).await?;
        let cpu = gateway_cpu();
        let commits = metric_total("acp_gateway_transcript_commit_seconds_count");
        let t = stream_once(&mut via.rpc, &via.session, k.n_updates, GATEWAY_EXTRAS).await?;
        cpu_us.push((gateway_cpu() - cpu).as_secs_f64() * 1e6 / t.updates as f64);
        per_commit
            .push(t.updates as f64 / (metric_total("acp_gateway_transcript_commit_seconds_count") - commits).max(1.0));
        rss_after_stream = rss_kib().0;
        // How long after the answer until the transcript is all in the database.
        let gw2 = gw.clone();
        let flush = gw_rt
            .spawn(async move {
                let started = Instant::now();
                gw2.sessions.flush().await;
                started.elapsed()
            })
            .await?;
        flush_ms.push(flush.as_secs_f64() * 1e3);
        hwm = rss_kib().1;
        let after = stored_last_seq(gw_rt, gw, &via.session).await?;
        let last_seq = serde_json::from_slice::<Value>(&via.rpc.last_note)
            .ok()
            .and_then(|v| v["params"]["_meta"]["gateway"]["seq"].as_i64());
        if after - before != (k.n_updates + GATEWAY_EXTRAS) as i64 || last_seq != Some(after) {
            bail!(
                "MISMATCH: stored last_seq went {before} -> {after} (expected +{}), last forwarded seq {last_seq:?}",
                k.n_updates + GATEWAY_EXTRAS
            );
        }
        g_runs.push(t);
    }
    let (rss1, _) = rss_kib();
    println!(
        "{:<10} {:>10} {:>16} {:>16}",
        "path", "updates", "best updates/s", "median upd/s"
    );
    let mut medians = Vec::new();
    for (name, runs) in [("direct", &d_runs), ("gateway", &g_runs), ("websocketd", &p_runs)] {
        if runs.is_empty() {
            continue;
        }
        let (mid, best) = rates(runs);
        medians.push(mid);
        println!("{:<10} {:>10} {:>16.0} {:>16.0}", name, runs[0].updates, best, mid);
    }
    let g = rates(&g_runs).0;
    println!(
        "gateway runs: {} updates/s; the client was fed from the store {} times (acp_gateway_client_catch_ups_total)",
        g_runs
            .iter()
            .map(|t| format!("{:.0}", t.updates as f64 / t.secs))
            .collect::<Vec<_>>()
            .join(" / "),
        metric_total("acp_gateway_client_catch_ups_total")
    );
    println!(
        "gateway CPU per update streamed: {} µs (its threads' time on a CPU during each run, /proc/self/task/*/schedstat); updates per transcript commit: {}",
        cpu_us.iter().map(|c| format!("{c:.2}")).collect::<Vec<_>>().join(" / "),
        per_commit
            .iter()
            .map(|c| format!("{c:.0}"))
            .collect::<Vec<_>>()
            .join(" / ")
    );
    let flush_text: Vec<String> = flush_ms.iter().map(|m| format!("{m:.1}")).collect();
    println!(
        "transcript fully flushed {} ms after the prompt's answer; stored transcript complete (last_seq matches the last forwarded seq)",
        flush_text.join(" / ")
    );
    let p = (!p_runs.is_empty()).then(|| rates(&p_runs).0);
    let _ = writeln!(
        md,
        "| | streaming, one connection, updates/s (median of {}) | {:.0} | – | {g:.0} | {} |",
        k.tp_runs,
        rates(&d_runs).0,
        p.map_or("–".into(), |p| format!("{p:.0}"))
    );
    if let Some(p) = p {
        println!(
            "target: >= 3x websocketd on one connection ({:.2}x): {}",
            g / p,
            if g >= 3.0 * p { "MEETS" } else { "MISSES" }
        );
    }
    println!();
    println!("== 3. memory of this process (gateway + bench client), KiB ==");
    println!(
        "VmRSS before throughput {rss0}, right after the gateway stream {rss_after_stream}, after flush {rss1} (delta {:+}); VmHWM {hwm}",
        rss1 as i64 - rss0 as i64
    );
    Ok(())
}

/// Section 4: eight connections (eight users, so eight agent processes, as websocketd runs one
/// per connection) streaming at once; the aggregate rate.
pub(super) async fn eight(
    addr: SocketAddr,
    tokens: &[String],
    peer: Option<SocketAddr>,
    k: &Knobs,
    md: &mut String,
) -> Result<()> {
    async fn all<T: Transport>(paths: &mut [Path<T>], n: u64) -> Result<f64> {
        let cpu = gateway_cpu();
        let started = Instant::now();
        let runs = futures_util::future::try_join_all(
            paths
                .iter_mut()
                .map(|p| stream_once(&mut p.rpc, &p.session, n, p.extras)),
        )
        .await?;
        let updates: u64 = runs.iter().map(|t| t.updates).sum();
        let rate = updates as f64 / started.elapsed().as_secs_f64();
        let cpu = gateway_cpu() - cpu;
        if paths.first().is_some_and(|p| p.name == "gateway") {
            println!(
                "gateway run: {rate:.0} updates/s, gateway CPU per update {:.2} µs",
                cpu.as_secs_f64() * 1e6 / updates as f64
            );
        }
        Ok(rate)
    }
    println!();
    println!(
        "== 4. streaming throughput: {EIGHT} connections at once, [chunks={}] each ==",
        k.eight_updates
    );
    let mut gws = Vec::new();
    for token in tokens {
        gws.push(
            Path::new(
                "gateway",
                WsClient::connect(addr, "/acp", Some(token)).await?,
                GATEWAY_EXTRAS,
            )
            .await?,
        );
    }
    let mut peers = Vec::new();
    if let Some(peer) = peer {
        for _ in 0..EIGHT {
            peers.push(Path::new("websocketd", WsClient::connect(peer, "/", None).await?, AGENT_EXTRAS).await?);
        }
    }
    let (mut g, mut p) = (Vec::new(), Vec::new());
    for _ in 0..k.tp_runs {
        g.push(all(&mut gws, k.eight_updates).await?);
        if !peers.is_empty() {
            p.push(all(&mut peers, k.eight_updates).await?);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v.get(v.len() / 2).copied()
    };
    let (g, p) = (median(&mut g).unwrap_or(f64::NAN), median(&mut p));
    println!(
        "gateway    {g:>16.0} updates/s (all {EIGHT} together, median of {} runs)",
        k.tp_runs
    );
    if let Some(p) = p {
        println!("websocketd {p:>16.0} updates/s");
        println!(
            "target: >= 1.5x websocketd on eight connections ({:.2}x): {}",
            g / p,
            if g >= 1.5 * p { "MEETS" } else { "MISSES" }
        );
    }
    let _ = writeln!(
        md,
        "| | streaming, {EIGHT} connections at once, updates/s | – | – | {g:.0} | {} |",
        p.map_or("–".into(), |p| format!("{p:.0}"))
    );
    Ok(())
}
