//! Misbehaving agents (`tests/agents/misbehaving_agent.py`): garbage, oversized and invalid lines,
//! unknown ids and sessions, agents that exit, hang, close stdout or flood stderr.

use super::*;

/// A gateway whose agent `bad` is the misbehaving agent run with `args`; short timeouts (the
/// request timeout, the prompt idle timeout, the permission wait) so faults show in seconds.
async fn with_bad_agent(args: &[&str], tweak: impl FnOnce(&mut Config)) -> TestGateway {
    let mut argv = vec![BAD_AGENT];
    argv.extend_from_slice(args);
    TestGateway::start(Db::Sqlite, |c| {
        let mut bad = agent("/usr/bin/python3", &argv);
        bad.pool.request_timeout_secs = 2;
        bad.pool.prompt_idle_timeout_secs = 2;
        c.agents.insert("bad".into(), bad);
        c.limits.max_line_bytes = MAX_LINE;
        c.limits.permission_wait_secs = 1;
        tweak(c);
    })
    .await
}

/// A connection to the `bad` agent, not initialized yet.
async fn connect_bad(gw: &TestGateway, user: &str) -> Client {
    Client::connect(&format!("{}?agent=bad", gw.ws_url()), &gw.token(user))
        .await
        .expect("connects")
}

/// An initialized connection to the `bad` agent.
async fn bad_client(gw: &TestGateway, user: &str) -> Client {
    let mut c = connect_bad(gw, user).await;
    let init = c.initialize().await;
    assert_eq!(init["result"]["agentInfo"]["name"], "misbehaving-agent", "{init}");
    c
}

fn prompt_params(session: &str, text: &str) -> Value {
    json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]})
}

/// `-32603` whose data names the agent `bad`.
fn assert_agent_error(answer: &Value) {
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    assert_eq!(
        answer["error"]["data"]["agent"], "bad",
        "the error names the agent: {answer}"
    );
}

/// A prompt that ends well on `session`, with `chunks` chunks; returns its updates.
async fn good_prompt(c: &mut Client, session: &str, text: &str, chunks: usize) -> Vec<Value> {
    let r = c.prompt(session, text).await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{text}: {r}");
    let updates = c.take_updates(session);
    assert_eq!(chunk_texts(&updates).len(), chunks, "{text}: {updates:?}");
    updates
}

/// Garbage lines around every message (the `initialize` answer included) are skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_lines_on_agent_stdout_are_skipped() {
    watch_panics();
    let gw = with_bad_agent(&["--garbage-always"], |_| {}).await;
    let mut c = bad_client(&gw, "alice").await;
    let s1 = c.new_session().await;
    let s2 = c.new_session().await;
    let mut live = good_prompt(&mut c, &s1, "one [chunks=5]", 5).await;
    live.extend(good_prompt(&mut c, &s1, "two [chunks=2]", 2).await);
    let live2 = good_prompt(&mut c, &s2, "other", 3).await;
    assert!(
        c.inbox.is_empty(),
        "nothing but the sessions' own traffic: {:?}",
        c.inbox
    );
    assert_eq!(assert_replay_holds(&gw, "alice", &s1, &live).await.len(), live.len());
    assert_replay_holds(&gw, "alice", &s2, &live2).await;
    finish(gw).await;
}

/// Hundreds of random lines (random text, random JSON, JSON-RPC-shaped messages with random
/// members, cut-off lines, requests and updates naming no session) before each reply: every
/// prompt is answered, nothing reaches any client, no update is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_agent_lines_never_break_a_session() {
    watch_panics();
    let gw = with_bad_agent(&[], |_| {}).await;
    let mut c = bad_client(&gw, "alice").await;
    let mut bob = bad_client(&gw, "bob").await;
    let s = c.new_session().await;
    let sb = bob.new_session().await;
    let mut live = Vec::new();
    for seed in 1..=4 {
        live.extend(good_prompt(&mut c, &s, &format!("seed {seed} [fuzz=300:{seed}]"), 3).await);
    }
    assert!(c.inbox.is_empty(), "{:?}", c.inbox);
    let bob_live = good_prompt(&mut bob, &sb, "bob's turn", 3).await;
    assert!(bob.inbox.is_empty(), "{:?}", bob.inbox);
    assert_replay_holds(&gw, "alice", &s, &live).await;
    assert_replay_holds(&gw, "bob", &sb, &bob_live).await;
    finish(gw).await;
}

/// A line over `max_line_bytes` is skipped and the rest of the stream arrives; one just under
/// passes whole. An answer over the cap is lost, so the prompt ends as a silent agent's does
/// ("agent timed out", the process recycled) and the session carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_over_the_cap_is_skipped_and_the_session_carries_on() {
    watch_panics();
    let gw = with_bad_agent(&[], |_| {}).await;
    let pool = gw.gw.agents.pools.get("bad").expect("pool").clone();
    let mut c = bad_client(&gw, "alice").await;
    let s = c.new_session().await;
    let other = c.new_session().await;
    let mut live = good_prompt(&mut c, &s, &format!("[huge-update={}]", MAX_LINE * 2), 3).await;
    assert_eq!(live.len(), 4, "the prompt and three chunks: {live:?}");
    let near = MAX_LINE - 1024;
    let updates = good_prompt(&mut c, &s, &format!("[huge-update={near}] [chunks=1]"), 2).await;
    assert!(
        chunk_texts(&updates)[0].len() == near,
        "an update just under the cap arrives whole"
    );
    live.extend(updates);

    let before = pool.pids();
    let started = Instant::now();
    let r = c
        .prompt(&s, &format!("[huge-answer={}] [chunks=2]", MAX_LINE * 2))
        .await;
    assert_eq!(r["error"]["message"], "agent timed out", "{r}");
    assert_agent_error(&r);
    assert!(started.elapsed() < Duration::from_secs(6), "{:?}", started.elapsed());
    let updates = c.take_updates(&s);
    assert_eq!(
        chunk_texts(&updates).len(),
        2,
        "the chunks before the lost answer arrived"
    );
    live.extend(updates);
    eventually("the silent process to be recycled", || pool.pids() != before).await;

    live.extend(good_prompt(&mut c, &s, "after", 3).await);
    let other_live = good_prompt(&mut c, &other, "the other session", 3).await;
    assert_replay_holds(&gw, "alice", &s, &live).await;
    assert_replay_holds(&gw, "alice", &other, &other_live).await;
    finish(gw).await;
}

/// Answers to ids the gateway never used, of every type, are dropped; a prompt answered twice
/// reaches the client once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_to_unknown_ids_are_dropped_and_a_prompt_is_answered_once() {
    watch_panics();
    let gw = with_bad_agent(&[], |_| {}).await;
    let mut c = bad_client(&gw, "alice").await;
    let s = c.new_session().await;
    let id = c.start("session/prompt", prompt_params(&s, "[unknown-ids]")).await;
    let r = c.answer(id).await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "the first answer: {r}");
    let mut live = c.take_updates(&s);
    // The duplicate comes right after the first answer: by the next prompt's answer it has been
    // read and dropped.
    live.extend(good_prompt(&mut c, &s, "next", 3).await);
    assert!(
        !c.inbox.iter().any(|m| m.get("method").is_none()),
        "a second answer reached the client: {:?}",
        c.inbox
    );
    assert_eq!(chunk_texts(&live).len(), 6);
    assert_replay_holds(&gw, "alice", &s, &live).await;
    finish(gw).await;
}

/// Updates for sessions that do not exist (or naming none, or not by a string) go nowhere; a
/// request for a session that does not exist is answered to the agent `-32602`; other sessions
/// and users see none of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_and_requests_for_unknown_sessions_go_nowhere() {
    watch_panics();
    let gw = with_bad_agent(&[], |_| {}).await;
    let mut c = bad_client(&gw, "alice").await;
    let mut bob = bad_client(&gw, "bob").await;
    let s = c.new_session().await;
    let s2 = c.new_session().await;
    let sb = bob.new_session().await;
    let live = good_prompt(&mut c, &s, "[foreign-session]", 4).await;
    let report = chunk_texts(&live)
        .into_iter()
        .find(|t| t.starts_with("foreign answer: "))
        .expect("the agent reports the answer it got");
    let answer: Value = serde_json::from_str(&report["foreign answer: ".len()..]).expect("JSON");
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    assert!(c.inbox.is_empty(), "{:?}", c.inbox);
    let live2 = good_prompt(&mut c, &s2, "unaffected", 3).await;
    let bob_live = good_prompt(&mut bob, &sb, "unaffected", 3).await;
    assert!(bob.inbox.is_empty(), "{:?}", bob.inbox);
    assert_replay_holds(&gw, "alice", &s, &live).await;
    assert_replay_holds(&gw, "alice", &s2, &live2).await;
    assert_replay_holds(&gw, "bob", &sb, &bob_live).await;
    finish(gw).await;
}

/// An agent that exits as it starts: `initialize` gets `-32603` naming the agent and how it
/// ended; the connection stays open (and uninitialized), and may try again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_exits_at_start_fails_initialize_naming_it() {
    watch_panics();
    let gw = with_bad_agent(&["--exit-at-start"], |_| {}).await;
    let pool = gw.gw.agents.pools.get("bad").expect("pool").clone();
    let mut c = connect_bad(&gw, "alice").await;
    let init = json!({"protocolVersion": 1, "clientCapabilities": {}});
    for _ in 0..2 {
        let started = Instant::now();
        let r = c.request("initialize", init.clone()).await;
        assert_eq!(r["error"]["code"], -32603, "{r}");
        assert!(
            r["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("agent bad") && m.contains("exit code 3")),
            "names the agent and how it ended: {r}"
        );
        assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
        let r = c.request("session/list", json!({})).await;
        assert_eq!(r["error"]["code"], -32600, "still not initialized: {r}");
    }
    eventually("no process left", || pool.process_count() == 0).await;
    finish(gw).await;
}

/// An agent that never answers `initialize`: `-32603` "agent timed out" naming it, within the
/// request timeout; the connection stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_never_answers_initialize_times_out_naming_it() {
    watch_panics();
    let gw = with_bad_agent(&["--mute-init"], |_| {}).await;
    let mut c = connect_bad(&gw, "alice").await;
    let started = Instant::now();
    let r = c
        .request("initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}))
        .await;
    assert_eq!(r["error"]["message"], "agent timed out", "{r}");
    assert_agent_error(&r);
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    let r = c.request("session/list", json!({})).await;
    assert_eq!(r["error"]["code"], -32600, "{r}");
    finish(gw).await;
}

/// A permission request nobody answers: after `permission_wait_secs` the agent is answered
/// `cancelled` and the client is told with `$/cancel_request`; the prompt then ends normally
/// (the wait is not agent silence), and a late answer is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_permission_request_is_cancelled_after_the_wait() {
    watch_panics();
    let gw = with_bad_agent(&[], |c| {
        c.agents.get_mut("bad").expect("bad").pool.prompt_idle_timeout_secs = 1
    })
    .await;
    let mut c = bad_client(&gw, "alice").await;
    let s = c.new_session().await;
    let started = Instant::now();
    let id = c.start("session/prompt", prompt_params(&s, "[permission]")).await;
    let req = c.wait_for(|m| m["method"] == "session/request_permission").await;
    assert_eq!(req["params"]["sessionId"], s.as_str());
    let cancel = c.wait_for(|m| m["method"] == "$/cancel_request").await;
    assert_eq!(cancel["params"]["requestId"], req["id"], "{cancel}");
    let r = c.answer(id).await;
    let took = started.elapsed();
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(5),
        "{took:?}"
    );
    let mut live = c.take_updates(&s);
    assert!(
        chunk_texts(&live).contains(&r#"permission answer: {"outcome": {"outcome": "cancelled"}}"#.to_string()),
        "the agent was answered cancelled: {:?}",
        chunk_texts(&live)
    );
    let late =
        json!({"jsonrpc": "2.0", "id": req["id"], "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}});
    if let Err(got) = unanswered(&mut c, Message::text(late.to_string()), 0).await {
        panic!("a late answer was answered: {got}");
    }
    live.extend(good_prompt(&mut c, &s, "next", 3).await);
    assert_replay_holds(&gw, "alice", &s, &live).await;
    finish(gw).await;
}

/// An agent that writes a line that is not UTF-8: either the line is skipped (like any line
/// that is not JSON-RPC) and the prompt ends well, or the prompt is answered `-32603` naming the
/// agent and the process is recycled; either way every session carries on, nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_writing_invalid_utf8_fails_its_prompt_and_its_sessions_carry_on() {
    watch_panics();
    let gw = with_bad_agent(&[], |_| {}).await;
    let pool = gw.gw.agents.pools.get("bad").expect("pool").clone();
    let mut c = bad_client(&gw, "alice").await;
    let mut bob = bad_client(&gw, "bob").await;
    let s = c.new_session().await;
    let other = c.new_session().await;
    let sb = bob.new_session().await;
    let mut live = good_prompt(&mut c, &s, "before", 3).await;
    let before = pool.pids();
    assert_eq!(before.len(), 2, "alice's process and bob's");
    let started = Instant::now();
    let r = c.prompt(&s, "[utf8]").await;
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    let updates = c.take_updates(&s);
    if r.get("result").is_some() {
        // The line is skipped like any other line that is not JSON-RPC.
        assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
        assert_eq!(chunk_texts(&updates).len(), 3, "{updates:?}");
        assert_eq!(pool.pids(), before, "the process carries on");
    } else {
        // Or the gateway gives up on the agent, recycling it.
        assert_agent_error(&r);
        eventually("alice's process to be recycled", || pool.process_count() == 1).await;
    }
    live.extend(updates);
    live.extend(good_prompt(&mut c, &s, "after", 3).await);
    let other_live = good_prompt(&mut c, &other, "the other session", 3).await;
    let bob_live = good_prompt(&mut bob, &sb, "bob", 3).await;
    assert_replay_holds(&gw, "alice", &s, &live).await;
    assert_replay_holds(&gw, "alice", &other, &other_live).await;
    assert_replay_holds(&gw, "bob", &sb, &bob_live).await;
    finish(gw).await;
}

/// An agent that closes its stdout and keeps running (ignoring SIGTERM): the prompt is answered
/// `-32603` naming the agent, the process is killed, and the session carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_closes_stdout_but_keeps_running_is_killed_and_its_sessions_carry_on() {
    watch_panics();
    let gw = with_bad_agent(&[], |_| {}).await;
    let pool = gw.gw.agents.pools.get("bad").expect("pool").clone();
    let mut c = bad_client(&gw, "alice").await;
    let s = c.new_session().await;
    let other = c.new_session().await;
    let mut live = good_prompt(&mut c, &s, "before", 3).await;
    let pid = pool.pids()[0];
    let started = Instant::now();
    let r = c.prompt(&s, "[close-stdout]").await;
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    assert_agent_error(&r);
    live.extend(c.take_updates(&s));
    eventually("the agent that ignores SIGTERM to be killed", || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
            stat.rsplit(')').next().is_some_and(|s| s.trim_start().starts_with('Z'))
        })
    })
    .await;
    live.extend(good_prompt(&mut c, &s, "after", 3).await);
    let other_live = good_prompt(&mut c, &other, "the other session", 3).await;
    assert_replay_holds(&gw, "alice", &s, &live).await;
    assert_replay_holds(&gw, "alice", &other, &other_live).await;
    finish(gw).await;
}

/// An agent that writes a stderr line over the gateway's cap for stderr lines (8 KiB) and then
/// keeps writing to stderr: stderr is still drained (an agent never blocks on it, nor gets a
/// broken pipe), and the prompt ends well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_stderr_line_does_not_stop_the_agent() {
    watch_panics();
    let gw = with_bad_agent(&[], |_| {}).await;
    let pool = gw.gw.agents.pools.get("bad").expect("pool").clone();
    let mut c = bad_client(&gw, "alice").await;
    let s = c.new_session().await;
    let before = pool.pids();
    // 100 000 bytes after the long line: more than a pipe holds.
    let mut live = good_prompt(&mut c, &s, "[stderr=1000:20000]", 3).await;
    live.extend(good_prompt(&mut c, &s, "[stderr=1000:10]", 3).await);
    assert_eq!(pool.pids(), before, "the same process carries on");
    assert_replay_holds(&gw, "alice", &s, &live).await;
    finish(gw).await;
}
