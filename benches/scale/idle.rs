//! Part 1: idle connections, opened, answered once each, and closed.

use super::*;

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

pub(crate) async fn idle_connections(gw: &GatewayProcess, auth: &Authenticator, k: &Knobs) -> Result<()> {
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
