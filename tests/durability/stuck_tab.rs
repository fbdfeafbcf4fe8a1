//! A tab that stops reading delays no other tab (of the same user, or of another user on a shared
//! process), is closed with 1013 once it has taken nothing for the timeout, and its socket is
//! released.

use super::*;

/// Prompts per latency measurement.
const ROUND_TRIPS: usize = 20;
/// The stuck tab's kernel receive buffer (the kernel doubles it): small, so that the tab backs up
/// at once, but not below loopback's 64 KiB segments. At 4 KiB, twice in 40 runs (both times
/// with 2,965 bytes queued at the tab when its window shut), the tab read 2.77 MB once it read
/// again (9,967 frames, ~100 fewer than in the runs that passed) and then got nothing more, and
/// its read ended after 297 s with a reset instead of the 1013 frame. The gateway had counted the
/// tab as a slow client both times; the stall is TCP's with that tiny window. Browsers' buffers
/// are far larger.
const STUCK_RECV_BUFFER: u32 = 64 << 10;
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
    gw.gw.config.limits.max_connections - gw.gw.life.connection_slots.available_permits()
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
    let pool = gw.gw.agents.pools.get(DEFAULT_AGENT).expect("pool").clone();
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
    // Which showed it: the slow-client counter (the writer timed out on it and closed it with
    // 1013) or only its connection slot (the connection ended some other way first).
    let counted = slow_clients_dropped() > drops_before;
    let reading = Instant::now();
    let ending = stuck.read_to_end().await;
    let read_for = reading.elapsed();
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
         stuck tab dropped by the gateway: {} ({})\n  \
         then read for {}: {} text frames ({} B), close frame: {} code {:?} {:?}, error {:?}\n  \
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
        if counted {
            "counted as a slow client"
        } else {
            "its connection slot freed, not counted as a slow client"
        },
        ms(read_for),
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
