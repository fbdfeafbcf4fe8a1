//! Issue 19: a client that falls behind is fed from the store instead of being cut off (the
//! contract's "Limits and faults"). Real gateway at its default queue limits, real demo agent
//! streaming as fast as it can, real WebSocket clients with small kernel buffers.
//!
//! Every test here takes [`SERIAL`]: they watch per-process counters, fds and RSS.
//! Figures are printed; see them with `cargo test --test catch_up -- --nocapture`.

// Tests and benchmarks spawn freely: their runtime ends with them.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::{Duration, Instant};

use common::procfs;
use common::{Client, Db, TestGateway, WAIT, metric_sum, wait_until};
use serde_json::{Value, json};

/// One test at a time in this binary (see the module docs).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The lagging clients' kernel receive buffer (the kernel doubles it): fixed, so that a client
/// that stops reading backs the gateway's writes up after a bounded amount, and at least two
/// loopback segments (64 KiB each), so that a reader that starts again opens its window in
/// whole segments. A smaller one (4 KiB) makes the receiver too small to announce the window
/// it frees: the gateway's kernel then sends only on its zero-window probes, whose interval
/// has backed off during the stall, and a resumed reader gets ~30 frames a second.
const RECV_BUFFER: u32 = 256 << 10;
/// Updates of the long stream.
const CHUNKS: u64 = 200_000;
/// Updates of a demo-agent prompt besides its chunks, the user's prompt included.
const EXTRAS: u64 = 5;

/// This process's resident memory, in MiB.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS");
    kib / 1024.0
}

/// A reader stops for 10 s in the middle of a 200,000-update stream, with a prompt that asks
/// for permission queued behind it; when it reads again it gets every update once and in
/// order, the first prompt's answer after its last update, the permission request right after
/// the update it follows, the answer to a `session/new` it sent as it stopped, and no close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_pauses_gets_every_update_once_in_order_and_is_not_cut_off() {
    let _serial = SERIAL.lock().await;
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let catch_ups_before = metric_sum("acp_gateway_client_catch_ups_total");
    let drops_before = metric_sum("acp_gateway_slow_clients_dropped_total");
    let mut c = Client::connect_with_recv_buffer(&gw.ws_url(), gw.addr, &gw.token("alice"), RECV_BUFFER).await;
    c.initialize().await;
    let session = c.new_session().await;
    let long = c
        .start(
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": format!("[chunks={CHUNKS}] [delay_us=0]")}]}),
        )
        .await;
    // Queued by the agent behind the long one: its permission request comes while the reader
    // is still far behind.
    let asking = c
        .start(
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": "[chunks=1] [permission] after the stream"}]}),
        )
        .await;

    let started = Instant::now();
    let mut last_seq = 0u64;
    let mut updates = 0u64;
    let mut last_update = Value::Null;
    let mut long_answered_after = None;
    let mut permission_after = None;
    let mut paused = false;
    let mut opened = None;
    let mut new_session = None;
    loop {
        let Some(text) = c.recv_text().await else {
            panic!("the connection ended after {updates} updates (seq {last_seq})");
        };
        let msg: Value = serde_json::from_str(&text).expect("JSON");
        match msg.get("method").and_then(Value::as_str) {
            Some("session/update") => {
                let seq = common::seq(&msg);
                assert_eq!(seq, last_seq + 1, "seq {seq} after {last_seq}: a gap or a repeat");
                last_seq = seq;
                updates += 1;
                last_update = msg;
                if updates == 1000 && !paused {
                    // The reader stops reading for 10 s (the scenario, not a wait for an
                    // event). 2 s in, its queue full of what the store feeds it, it asks for a
                    // new session: the answer waits for it however long (it waited 5 s, then
                    // the client was closed with 1013).
                    paused = true;
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    let cwd = c.root.clone();
                    new_session = Some(c.start("session/new", json!({"cwd": cwd, "mcpServers": []})).await);
                    tokio::time::sleep(Duration::from_secs(8)).await;
                }
            }
            Some("session/request_permission") => {
                permission_after = Some((last_seq, last_update["params"]["update"].clone()));
                let id = msg["id"].clone();
                let options = msg["params"]["options"].as_array().expect("options");
                let allow = options
                    .iter()
                    .find(|o| o["kind"].as_str().is_some_and(|k| k.starts_with("allow")))
                    .expect("an allow option");
                c.send(json!({"jsonrpc": "2.0", "id": id, "result": {"outcome": {"outcome": "selected", "optionId": allow["optionId"]}}}))
                    .await;
            }
            Some(other) => panic!("unexpected request {other}: {msg}"),
            None if new_session.is_some_and(|id| msg["id"] == json!(id)) => {
                opened = msg["result"]["sessionId"].as_str().map(str::to_string);
                assert!(opened.is_some(), "session/new answered: {msg}");
            }
            None if msg["id"] == json!(long) => {
                assert_eq!(msg["result"]["stopReason"], "end_turn", "{msg}");
                long_answered_after = Some((last_seq, last_update["params"]["update"].clone()));
            }
            None if msg["id"] == json!(asking) => {
                assert_eq!(msg["result"]["stopReason"], "end_turn", "{msg}");
                break;
            }
            None => panic!("unexpected answer {msg}"),
        }
    }
    let took = started.elapsed();
    let catch_ups = metric_sum("acp_gateway_client_catch_ups_total") - catch_ups_before;
    println!(
        "paused reader: {updates} updates in order in {:.1} s (10 s of it paused), fell behind and was fed from the store {catch_ups} time(s)",
        took.as_secs_f64()
    );

    assert_eq!(
        updates,
        CHUNKS + EXTRAS + EXTRAS + 1,
        "every update of both prompts, once"
    );
    let (at, update) = long_answered_after.expect("the long prompt was answered");
    assert_eq!(
        update["content"]["text"],
        format!("chunk {CHUNKS}/{CHUNKS}: you said: [chunks={CHUNKS}] [delay_us=0]\n"),
        "the long prompt's answer comes after its last update (seq {at})"
    );
    let (at, update) = permission_after.expect("the permission request reached the reader");
    assert_eq!(
        (update["sessionUpdate"].as_str(), update["title"].as_str()),
        (Some("tool_call"), Some("Read the workspace")),
        "the permission request comes right after the tool call it asks about (seq {at}), not before the updates ahead of it"
    );
    assert!(
        catch_ups >= 1.0,
        "the reader never fell behind: the test did not test the catch-up"
    );
    let opened = opened.expect("the session/new sent as the reader stopped was answered");
    assert_eq!(
        metric_sum("acp_gateway_slow_clients_dropped_total"),
        drops_before,
        "nobody was cut off"
    );
    // The reader is live again: a short prompt streams to it as usual.
    let r = c.prompt(&session, "still here").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let r = c.prompt(&opened, "and here").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    gw.stop().await;
}

/// Ten readers that never read, one after the other, each on a fast stream: each is closed
/// with 1013 once it has taken nothing for `slow_client_timeout_secs` (not before), gets the
/// close frame behind what its socket held, and leaves the fds and memory it held behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_that_never_read_are_closed_with_1013_and_leave_nothing_behind() {
    const TIMEOUT_SECS: u64 = 2;
    const READERS: usize = 10;
    let _serial = SERIAL.lock().await;
    let gw = TestGateway::start(Db::Sqlite, |cfg| cfg.limits.slow_client_timeout_secs = TIMEOUT_SECS).await;
    // Warm up: alice's agent process (its pipes are fds of this process), the database's
    // connections.
    let mut tab = gw.client("alice").await;
    let s = tab.new_session().await;
    tab.prompt(&s, "[chunks=2000] warm up").await;
    tab.close().await;
    let db_file = gw.db_url.trim_start_matches("sqlite://").to_string();
    let fds = || procfs::fd_targets().iter().filter(|t| !t.starts_with(&db_file)).count();
    let fds_before = fds();
    let mut rss = Vec::new();
    let mut closed_after = Vec::new();
    for i in 0..READERS {
        let drops = metric_sum("acp_gateway_slow_clients_dropped_total");
        let mut stuck = Client::connect_with_recv_buffer(&gw.ws_url(), gw.addr, &gw.token("alice"), RECV_BUFFER).await;
        stuck.initialize().await;
        let session = stuck.new_session().await;
        stuck
            .start(
                "session/prompt",
                json!({"sessionId": session, "prompt": [{"type": "text", "text": "[chunks=20000] [delay_us=0] never read"}]}),
            )
            .await;
        let since = Instant::now();
        let dropped = wait_until(WAIT, || metric_sum("acp_gateway_slow_clients_dropped_total") > drops).await;
        let dropped = dropped.unwrap_or_else(|| panic!("reader {i} was never closed"));
        closed_after.push(dropped);
        assert!(
            since.elapsed() >= Duration::from_secs(TIMEOUT_SECS),
            "reader {i} was closed after {dropped:?}, before the {TIMEOUT_SECS} s timeout"
        );
        let ending = stuck.read_to_end().await;
        assert_eq!(
            ending.close_code,
            Some(1013),
            "reader {i}: the close frame comes after what its socket held: {ending:?}"
        );
        drop(stuck);
        let back = wait_until(WAIT, || fds() <= fds_before).await;
        assert!(back.is_some(), "reader {i}: open fds {} (before: {fds_before})", fds());
        rss.push(rss_mib());
    }
    println!(
        "{READERS} readers that never read: closed {:?} after their stream began (timeout {TIMEOUT_SECS} s); RSS after each: {:?} MiB",
        closed_after
            .iter()
            .map(|d| format!("{:.1} s", d.as_secs_f64()))
            .collect::<Vec<_>>(),
        rss.iter().map(|m| format!("{m:.0}")).collect::<Vec<_>>()
    );
    // Flat: what the first reader's stream left (allocator pools, the store's page cache) is
    // reused, not added to, by the next nine.
    let growth = rss[READERS - 1] - rss[1];
    assert!(
        growth < 24.0,
        "RSS grew {growth:.0} MiB from the second reader to the last: {rss:?}"
    );
    let mut again = gw.client("alice").await;
    let s = again.new_session().await;
    let r = again.prompt(&s, "still here").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    gw.stop().await;
}
