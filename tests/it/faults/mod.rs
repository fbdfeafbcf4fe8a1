//! Issue 9, item 7: faults and fuzz. Hostile frames from a client, misbehaving agent processes
//! (`tests/agents/misbehaving_agent.py`), and random frames through the real router. Every case
//! runs a real gateway, real agent processes and a real WebSocket client, and checks four things:
//! exactly what the client gets; that the connection lives where it should (a valid request
//! afterwards is answered); that the gateway lives (`/healthz`, another user's prompt, a clean
//! stop); and that nothing acknowledged is lost (the replayed transcript holds every update the
//! client saw, numbered without a gap). A panic hook fails a test when any code outside `tests/`
//! panicked (a gateway task's panic would otherwise only be printed).

mod bad_agents;
mod client_frames;
use crate::common;
mod floods;
mod fuzz;

use std::collections::HashMap;
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

use acp_gateway::infra::config::Config;
use common::{Client, Db, TestGateway, WAIT, agent, eventually, seq};
use futures_util::{SinkExt, StreamExt};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};

const BAD_AGENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/misbehaving_agent.py");

/// The line cap the misbehaving-agent gateways run with.
const MAX_LINE: usize = 64 * 1024;

// ---------------------------------------------------------------------------------------------
// Panics, survival, transcripts
// ---------------------------------------------------------------------------------------------

/// Panics whose location is outside `tests/` (the gateway's own code or a dependency's).
static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Records every panic outside the tests themselves (then prints it as usual).
fn watch_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let at = info.location().map(|l| l.file().to_string()).unwrap_or_default();
            if !(at.starts_with("tests/") || at.contains("/tests/")) {
                PANICS.lock().unwrap_or_else(|e| e.into_inner()).push(format!("{info}"));
            }
            default(info);
        }));
    });
}

fn assert_no_panics() {
    let panics = PANICS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert!(panics.is_empty(), "code outside the tests panicked: {panics:#?}");
}

/// The gateway is alive and well: `/healthz` answers, a user nobody has touched runs a prompt on
/// the default agent and gets its whole transcript back, and nothing panicked.
async fn assert_gateway_lives(gw: &TestGateway) {
    let r = reqwest::get(gw.http_url("/healthz")).await.expect("/healthz answers");
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.expect("JSON"), json!({"status": "ok"}));
    let mut w = gw.client("witness").await;
    let s = w.new_session().await;
    let r = w.prompt(&s, "still there?").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let live = w.take_updates(&s);
    assert_replay_holds(gw, "witness", &s, &live).await;
    w.close().await;
    assert_no_panics();
}

/// Stops the gateway (it must stop cleanly and in time) and checks, last, for panics.
async fn finish(gw: TestGateway) {
    assert_gateway_lives(&gw).await;
    gw.stop().await;
    assert_no_panics();
}

/// Replays `session` on a fresh connection: the stored transcript is numbered 1, 2, 3… without a
/// gap, and every update in `live` (what a client received) is in it, same seq, same content.
/// Returns the replay.
async fn assert_replay_holds(gw: &TestGateway, user: &str, session: &str, live: &[Value]) -> Vec<Value> {
    let mut c = gw.client(user).await;
    let r = c
        .request("session/load", json!({"sessionId": session, "mcpServers": []}))
        .await;
    assert!(r.get("result").is_some(), "session/load failed: {r}");
    let replay = c.take_updates(session);
    let seqs: Vec<u64> = replay.iter().map(seq).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "the transcript is numbered without a gap"
    );
    for u in live {
        let n = seq(u);
        let stored = replay
            .get(n as usize - 1)
            .unwrap_or_else(|| panic!("update {n} the client saw is not stored: {u}"));
        assert_eq!(
            stored["params"]["update"], u["params"]["update"],
            "update {n} replays as it was sent"
        );
    }
    c.close().await;
    replay
}

fn chunk_texts(updates: &[Value]) -> Vec<String> {
    updates
        .iter()
        .filter(|u| u["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .map(|u| {
            u["params"]["update"]["content"]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Raw frames
// ---------------------------------------------------------------------------------------------

/// The next text frame, raw (pings skipped); panics when the socket closes instead.
async fn next_text(c: &mut Client) -> String {
    loop {
        match c.recv_frame().await {
            Some(Message::Text(t)) => return t.to_string(),
            Some(Message::Close(f)) => panic!("the connection was closed: {f:?}"),
            None => panic!("the connection ended"),
            Some(_) => {}
        }
    }
}

/// The next text frame if one comes within `wait` (for an answer that may never come).
async fn next_text_within(c: &mut Client, wait: Duration) -> Option<String> {
    tokio::time::timeout(wait, next_text(c)).await.ok()
}

/// The close code the gateway ends the connection with (`None`: it ended without a close frame).
async fn close_code(c: &mut Client) -> Option<u16> {
    loop {
        match c.recv_frame().await {
            Some(Message::Close(frame)) => return frame.map(|f| u16::from(f.code)),
            Some(_) => {}
            None => return None,
        }
    }
}

/// A message's `id`, raw (byte for byte as the gateway wrote it).
fn raw_id(text: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct IdOf<'a> {
        #[serde(borrow)]
        id: Option<&'a RawValue>,
    }
    serde_json::from_str::<IdOf<'_>>(text)
        .ok()
        .map(|m| m.id.map_or_else(|| "null".to_string(), |id| id.get().to_string()))
}

fn code_of(text: &str) -> Option<i64> {
    // Not through `Value`: an id like `1e400` is JSON that `Value` cannot hold.
    #[derive(Deserialize)]
    struct E {
        code: i64,
    }
    #[derive(Deserialize)]
    struct M {
        error: Option<E>,
    }
    serde_json::from_str::<M>(text).ok()?.error.map(|e| e.code)
}

/// Sends `frame`, then a sentinel request the gateway answers at once in its read loop: the next
/// frame must be the sentinel's answer, or `frame` was answered. Returns what came instead.
async fn unanswered(c: &mut Client, frame: Message, n: usize) -> Result<(), String> {
    c.send_message(frame).await;
    let sentinel = format!("sentinel-{n}");
    c.send(json!({"jsonrpc": "2.0", "id": sentinel, "method": "x/sentinel"}))
        .await;
    let next = next_text(c).await;
    if raw_id(&next).as_deref() == Some(&format!("\"{sentinel}\"")) {
        assert_eq!(code_of(&next), Some(-32601), "{next}");
        Ok(())
    } else {
        // Drain up to the sentinel so the next check starts clean.
        loop {
            let t = next_text(c).await;
            if raw_id(&t).as_deref() == Some(&format!("\"{sentinel}\"")) {
                break;
            }
        }
        Err(next)
    }
}
