//! Timeouts (contract, "Limits and faults"): a request to an agent that does not answer in
//! `request_timeout_secs` gets `-32603` "agent timed out"; a prompt may run as long as the agent
//! streams, and `prompt_idle_timeout_secs` of silence ends it the same way and recycles the
//! process. Real agent processes throughout.

use crate::common;

use std::time::{Duration, Instant};

use common::{Client, Db, TestGateway, agent, eventually};
use serde_json::json;

/// The gateway's config with the default agent's pool edited by `tweak`.
fn pool(
    tweak: impl FnOnce(&mut acp_gateway::infra::config::PoolConfig),
) -> impl FnOnce(&mut acp_gateway::infra::config::Config) {
    move |c| tweak(&mut c.agents.get_mut("default").expect("default agent").pool)
}

fn assert_timed_out(answer: &serde_json::Value) {
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    assert_eq!(answer["error"]["message"], "agent timed out", "{answer}");
}

fn process_exists(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| !stat.rsplit(')').next().is_some_and(|s| s.trim_start().starts_with('Z')))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_prompt_times_out_the_process_is_recycled_and_the_session_carries_on() {
    let gw = TestGateway::start(Db::Sqlite, pool(|p| p.prompt_idle_timeout_secs = 1)).await;
    let pool = gw.gw.agents.pools.get("default").expect("pool").clone();
    let mut c = gw.client("alice").await;
    let s = c.new_session().await;
    let before = pool.pids();
    assert_eq!(before.len(), 1, "one agent process");

    // `[hang]`: the agent sends its plan, then nothing, and never answers.
    let started = Instant::now();
    let r = c.prompt(&s, "[hang]").await;
    let took = started.elapsed();
    assert_timed_out(&r);
    assert!(took < Duration::from_secs(5), "timed out after {took:?}");
    assert!(
        took >= Duration::from_secs(1),
        "cut off before the idle timeout: {took:?}"
    );
    // The error comes after the updates the agent sent before it.
    assert!(
        c.take_updates(&s)
            .iter()
            .any(|u| u["params"]["update"]["sessionUpdate"] == "plan"),
        "the plan arrived before the error"
    );

    // Recycled: out of the pool at once, and the OS process ends.
    assert_eq!(pool.process_count(), 0, "a timed-out process takes no more work");
    eventually("the timed-out agent process to end", || !process_exists(before[0])).await;

    // The same session goes on, restored on a fresh process.
    let r = c.prompt(&s, "are you there?").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let after = pool.pids();
    assert_eq!(after.len(), 1, "a fresh process");
    assert_ne!(after, before, "not the timed-out one");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_prompt_that_keeps_streaming_is_not_cut_off() {
    let gw = TestGateway::start(Db::Sqlite, pool(|p| p.prompt_idle_timeout_secs = 1)).await;
    let pool = gw.gw.agents.pools.get("default").expect("pool").clone();
    let mut c = gw.client("alice").await;
    let s = c.new_session().await;
    let pids = pool.pids();

    // 40 chunks 100 ms apart: four times the idle timeout in all, never silent for a second.
    let started = Instant::now();
    let r = c.prompt(&s, "slowly [chunks=40] [delay_us=100000]").await;
    let took = started.elapsed();
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    assert!(took >= Duration::from_secs(3), "the prompt streamed for {took:?}");
    let chunks = c
        .take_updates(&s)
        .iter()
        .filter(|u| u["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .count();
    assert_eq!(chunks, 40, "every chunk arrived");
    assert_eq!(pool.pids(), pids, "the same process carries on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_waiting_for_a_permission_answer_is_not_idle() {
    let gw = TestGateway::start(Db::Sqlite, pool(|p| p.prompt_idle_timeout_secs = 1)).await;
    let pool = gw.gw.agents.pools.get("default").expect("pool").clone();
    let mut c = gw.client("alice").await;
    let s = c.new_session().await;
    let pids = pool.pids();

    let id = c
        .start(
            "session/prompt",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": "write it [permission]"}]}),
        )
        .await;
    let req = c.wait_for(|m| m["method"] == "session/request_permission").await;
    // The person deliberates for longer than the idle timeout: the agent waits on them, not
    // the other way round.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    c.send(
        json!({"jsonrpc": "2.0", "id": req["id"], "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}}),
    )
    .await;
    let r = c.answer(id).await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    assert_eq!(pool.pids(), pids, "the same process carries on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_never_answers_initialize_times_out_and_the_connection_stays_usable() {
    let gw = TestGateway::start(Db::Sqlite, |c| {
        let mut mute = agent("sh", &["-c", "cat > /dev/null"]);
        mute.pool.request_timeout_secs = 1;
        c.agents.insert("default".into(), mute);
    })
    .await;
    let pool = gw.gw.agents.pools.get("default").expect("pool").clone();
    let mut c = Client::connect(&gw.ws_url(), &gw.token("alice"))
        .await
        .expect("connects");
    let init = json!({"protocolVersion": 1, "clientCapabilities": {}});

    let started = Instant::now();
    let r = c.request("initialize", init.clone()).await;
    let took = started.elapsed();
    assert_timed_out(&r);
    assert!(took < Duration::from_secs(5), "answered after {took:?}");
    eventually("the mute agent to be stopped", || pool.process_count() == 0).await;

    // The connection is still open and answering: not initialized yet, so other methods get
    // -32600, and initialize may be tried again.
    let r = c.request("session/list", json!({})).await;
    assert_eq!(r["error"]["code"], -32600, "{r}");
    let r = c.request("initialize", init).await;
    assert_timed_out(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_request_the_agent_never_answers_times_out_and_the_process_carries_on() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/misbehaving_agent.py");
    let gw = TestGateway::start(Db::Sqlite, |c| {
        let mut mute = agent("python3", &[script, "--mute-controls"]);
        mute.pool.request_timeout_secs = 2;
        c.agents.insert("default".into(), mute);
    })
    .await;
    let pool = gw.gw.agents.pools.get("default").expect("pool").clone();
    let mut c = gw.client("alice").await;
    let s = c.new_session().await;
    let pids = pool.pids();

    for (method, params) in [
        ("session/set_mode", json!({"sessionId": s, "modeId": "plan"})),
        (
            "session/set_config_option",
            json!({"sessionId": s, "configId": "model", "value": "fast"}),
        ),
    ] {
        let started = Instant::now();
        let r = c.request(method, params).await;
        let took = started.elapsed();
        assert_timed_out(&r);
        // The upkeep looks once a second.
        assert!(
            took >= Duration::from_secs(2) && took < Duration::from_secs(6),
            "{method} answered after {took:?}"
        );
    }

    // One unanswered request says nothing of the session: it goes on, on the same process.
    let r = c.prompt(&s, "still there?").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    assert_eq!(pool.pids(), pids, "the same process carries on");
}
