//! Graceful drain on SIGTERM: a real `serve` process (signals, exit code, its agents' processes)
//! with the demo agent streaming slowly, clients mid-prompt and idle, and a restart on the same
//! data directory that must replay every update a client saw.

use crate::common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::serve_process::{ServeProcess, marked_gateway_bin};
use common::{Client, SECRET, processes_matching};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

/// `limits.drain_grace_secs` of the gateways here.
const DRAIN_GRACE: u64 = 5;
/// `limits.shutdown_grace_secs` of the gateways here.
const SHUTDOWN_GRACE: u64 = 4;

/// A gateway's data directory, config file and database, with a demo agent started through a
/// marked binary (so that its processes can be found in /proc).
struct Setup {
    _dir: tempfile::TempDir,
    config: PathBuf,
    db: String,
    marker: String,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().canonicalize().expect("canon").join("data");
    let agent = marked_gateway_bin("drain");
    let config = dir.path().join("gw.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {data:?}\n[limits]\ndrain_grace_secs = {DRAIN_GRACE}\nshutdown_grace_secs = {SHUTDOWN_GRACE}\n\
             [agents.default]\ncommand = {agent:?}\nargs = [\"demo-agent\", \"--delay-us\", \"0\", \"--chunks\", \"3\"]\n\
             sandbox = \"none\"\n"
        ),
    )
    .expect("config");
    Setup {
        db: format!("sqlite://{}", data.join("gw.db").display()),
        config,
        marker: agent.display().to_string(),
        _dir: dir,
    }
}

/// `GET /readyz`'s status.
async fn readyz(addr: &str) -> Option<u16> {
    reqwest::get(format!("http://{addr}/readyz"))
        .await
        .ok()
        .map(|r| r.status().as_u16())
}

/// Reads everything up to the close frame: the messages, and the close code (`None`: the socket
/// ended without one).
async fn until_closed(client: &mut Client) -> (Vec<Value>, Option<u16>) {
    let mut got: Vec<Value> = client.inbox.drain(..).collect();
    loop {
        match client.recv_frame().await {
            Some(Message::Text(t)) => got.push(serde_json::from_str(&t).expect("JSON")),
            Some(Message::Close(frame)) => return (got, frame.map(|f| u16::from(f.code))),
            Some(_) => {}
            None => return (got, None),
        }
    }
}

/// The updates of `session` among `messages`, by seq.
fn updates_by_seq(messages: &[Value], session: &str) -> BTreeMap<u64, Value> {
    messages
        .iter()
        .filter(|m| m["method"] == "session/update" && m["params"]["sessionId"] == session)
        .map(|m| (common::seq(m), m["params"]["update"].clone()))
        .collect()
}

/// The answer to request `id` among `messages`.
fn answer_to(messages: &[Value], id: u64) -> Option<&Value> {
    messages
        .iter()
        .find(|m| m.get("method").is_none() && m["id"] == json!(id))
}

/// Starts a prompt that streams `chunks` updates `delay_us` apart, and waits for its first
/// update (left in the inbox); returns the request id.
async fn start_streaming(client: &mut Client, session: &str, chunks: u64, delay_us: u64) -> u64 {
    let text = format!("drain me [chunks={chunks}] [delay_us={delay_us}]");
    let id = client
        .start(
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]}),
        )
        .await;
    let first = client
        .wait_for(|m| {
            m["method"] == "session/update"
                && m["params"]["sessionId"] == session
                && m["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
        })
        .await;
    client.inbox.push_back(first);
    id
}

/// After SIGTERM: `/readyz` turns 503 while the gateway drains (the listener is still open), and
/// a new WebSocket is refused with 503.
async fn refuses_new_work(gateway: &ServeProcess) {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        match readyz(&gateway.addr).await {
            Some(503) => break,
            Some(200) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(10)).await,
            other => panic!("/readyz answered {other:?} while draining"),
        }
    }
    match Client::connect(&gateway.ws_url(), &gateway.token("carol")).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status().as_u16(), 503, "a new connection while draining")
        }
        Err(e) => panic!("a new connection while draining failed unexpectedly: {e}"),
        Ok(_) => panic!("a new connection was accepted while draining"),
    }
}

/// Waits for the exit (0) within the grace periods and a margin; no agent process may be left.
async fn exits_cleanly(mut gateway: ServeProcess, marker: &str, signalled: Instant) {
    let limit = Duration::from_secs(DRAIN_GRACE + SHUTDOWN_GRACE + 3);
    let status = gateway.wait_exit(limit).await;
    assert_eq!(status.code(), Some(0), "exit status after SIGTERM: {status}");
    assert!(signalled.elapsed() < limit, "took {:?}", signalled.elapsed());
    assert_eq!(
        processes_matching(marker),
        Vec::<u32>::new(),
        "agent processes left behind"
    );
}

/// A gateway restarted on the same data replays every update `seen` (same seq, same content).
async fn replays_everything_seen(s: &Setup, session: &str, seen: &BTreeMap<u64, Value>) {
    let gateway = ServeProcess::start(&s.config, &s.db, SECRET).await;
    let mut alice = gateway.client("alice").await;
    let cwd = alice.root.clone();
    let r = alice
        .request(
            "session/load",
            json!({"sessionId": session, "cwd": cwd, "mcpServers": []}),
        )
        .await;
    assert!(r.get("result").is_some(), "session/load: {r}");
    let replayed = updates_by_seq(&alice.take_updates(session).into_iter().collect::<Vec<_>>(), session);
    for (seq, update) in seen {
        assert_eq!(
            replayed.get(seq),
            Some(update),
            "seq {seq} seen by the client, not replayed as seen"
        );
    }
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_prompt_finish_then_closes_with_1001_and_exits_clean() {
    let s = setup();
    let gateway = ServeProcess::start(&s.config, &s.db, SECRET).await;
    let mut alice = gateway.client("alice").await;
    let session = alice.new_session().await;
    let mut bob = gateway.client("bob").await;
    bob.new_session().await;
    // A second and a half of streaming: within the drain grace.
    let id = start_streaming(&mut alice, &session, 60, 25_000).await;

    let signalled = Instant::now();
    gateway.terminate();
    // An idle client is closed at once.
    let (_, bob_close) = until_closed(&mut bob).await;
    assert_eq!(bob_close, Some(1001), "an idle client is told the gateway goes away");
    assert!(
        signalled.elapsed() < Duration::from_secs(DRAIN_GRACE),
        "the idle client waited for the drain grace"
    );
    refuses_new_work(&gateway).await;

    // The prompt runs to its end: every update, the answer, then 1001.
    let (got, close) = until_closed(&mut alice).await;
    let answer = answer_to(&got, id).unwrap_or_else(|| panic!("no answer before the close: {got:?}"));
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(close, Some(1001));
    let seen = updates_by_seq(&alice.inbox.drain(..).chain(got).collect::<Vec<_>>(), &session);
    let chunks = seen
        .values()
        .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
        .count();
    assert_eq!(chunks, 60, "every chunk of the prompt reached the client");
    let seqs: Vec<u64> = seen.keys().copied().collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "no gap in what the client saw"
    );
    exits_cleanly(gateway, &s.marker, signalled).await;
    replays_everything_seen(&s, &session, &seen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_still_running_after_the_drain_grace_is_cancelled_then_closed_with_1001() {
    let s = setup();
    let gateway = ServeProcess::start(&s.config, &s.db, SECRET).await;
    let mut alice = gateway.client("alice").await;
    let session = alice.new_session().await;
    // Minutes of streaming: far past the drain grace.
    let id = start_streaming(&mut alice, &session, 100_000, 20_000).await;

    let signalled = Instant::now();
    gateway.terminate();
    refuses_new_work(&gateway).await;
    // A request sent while draining is refused; the prompt goes on.
    let refused = alice.request("session/list", json!({})).await;
    assert_eq!(refused["error"]["data"]["reason"], "shutting_down", "{refused}");

    let (got, close) = until_closed(&mut alice).await;
    let answer = answer_to(&got, id).unwrap_or_else(|| panic!("no answer before the close: {got:?}"));
    assert_eq!(answer["result"]["stopReason"], "cancelled", "{answer}");
    assert_eq!(close, Some(1001));
    let waited = signalled.elapsed();
    assert!(
        waited >= Duration::from_secs(DRAIN_GRACE) && waited < Duration::from_secs(DRAIN_GRACE + SHUTDOWN_GRACE),
        "cancelled after the drain grace, answered within the shutdown grace: {waited:?}"
    );
    let seen = updates_by_seq(&alice.inbox.drain(..).chain(got).collect::<Vec<_>>(), &session);
    assert!(seen.len() > 10, "it streamed during the grace: {}", seen.len());
    exits_cleanly(gateway, &s.marker, signalled).await;
    replays_everything_seen(&s, &session, &seen).await;
}
