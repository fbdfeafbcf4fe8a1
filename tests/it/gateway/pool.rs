//! The agent process pool: killed agents, idle reaping, no orphans, warm processes, who shares a
//! process.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_fails_the_pending_prompt_fast_and_the_next_session_gets_a_fresh_process() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut c = gw.client("alice").await;
    let s = c.new_session().await;
    let pool = gw.gw.agents.pools.get("default").expect("pool").clone();
    assert_eq!(pool.process_count(), 1);

    let id = c
        .start(
            "session/prompt",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": "[hang]"}]}),
        )
        .await;
    c.wait_for(|m| m["params"]["update"]["sessionUpdate"] == "plan").await;
    let agent_pids = pool.pids();
    assert_eq!(agent_pids.len(), 1, "one agent process");
    let killed_at = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent_pids[0] as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill");
    let answer = c.answer(id).await;
    let took = killed_at.elapsed();
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("agent process exited")),
        "{answer}"
    );
    assert!(took < Duration::from_secs(1), "pending prompt failed after {took:?}");

    eventually("the dead process to leave the pool", || pool.process_count() == 0).await;
    let s2 = c.new_session().await;
    assert_ne!(s2, s);
    let r = c.prompt(&s2, "hi").await;
    assert_eq!(r["result"]["stopReason"], "end_turn");
    assert_eq!(pool.process_count(), 1, "a fresh process");

    // A crash the agent causes itself, mid-stream, is reported the same way.
    let r = c.prompt(&s2, "[crash]").await;
    assert_eq!(r["error"]["code"], -32603, "{r}");
    let error_id = r["error"]["data"]["errorId"].as_str().unwrap_or_default();
    assert!(error_id.len() >= 8, "an id to find the log line by: {r}");
    assert!(
        r["error"]["data"].get("stderrTail").is_none(),
        "stderr stays in the log: {r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_processes_are_reaped_and_sessions_come_back() {
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.agents.get_mut("default").expect("default").pool.idle_timeout_secs = 1
    })
    .await;
    let mut c = gw.client("alice").await;
    let s = c.new_session().await;
    assert_eq!(c.prompt(&s, "one").await["result"]["stopReason"], "end_turn");
    let pool = gw.gw.agents.pools.get("default").expect("pool").clone();
    assert_eq!(pool.process_count(), 1);
    eventually("the idle process to be reaped", || pool.process_count() == 0).await;
    // The next prompt restores the session on a new process (the demo agent supports resume).
    let r = c.prompt(&s, "two").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    assert_eq!(pool.process_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_agent_process_outlives_the_gateway() {
    let marker = format!("acp-test-marker-{}", uuid_like());
    let gw = TestGateway::start(Db::Sqlite, |c| {
        // A wrapper shell that starts the real agent as its child: killing only the shell would
        // orphan the agent (the npx/uvx trap). The marker lets us count exactly our processes.
        let demo = c.agents.get_mut("default").expect("default");
        demo.args = vec![
            "-c".into(),
            format!(
                "exec -a {marker} {} demo-agent --delay-us 0 <&0 & wait",
                common::gateway_bin()
            ),
        ];
        demo.command = "bash".into();
    })
    .await;
    let mut clients = Vec::new();
    for user in ["u1", "u2", "u3"] {
        let mut c = gw.client(user).await;
        let s = c.new_session().await;
        assert_eq!(c.prompt(&s, "hi").await["result"]["stopReason"], "end_turn");
        clients.push(c);
    }
    let running = common::processes_named(&marker);
    assert_eq!(running.len(), 3, "one agent per user: {running:?}");
    gw.stop().await;
    eventually("every agent process to be gone", || {
        common::processes_named(&marker).is_empty()
    })
    .await;
}

fn uuid_like() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos() ^ rand_u64()
    )
}

fn rand_u64() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_processes_start_for_a_user_who_connects_and_serve_only_them() {
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.agents.get_mut("default").expect("default").pool.min_idle = 1
    })
    .await;
    let pool = gw.gw.agents.pools.get("default").expect("pool").clone();
    // The first connection learns the agent's capabilities on a process of its own user.
    let mut alice = gw.client("alice").await;
    assert_eq!(pool.process_count(), 1);
    // Nobody else's process is generic: bob's connection warms one for bob.
    let mut bob = gw.client("bob").await;
    eventually("bob's warm process", || pool.process_count() == 2).await;
    let a = alice.new_session().await;
    let b = bob.new_session().await;
    assert_eq!(pool.process_count(), 2, "both sessions found their user's warm process");
    assert_eq!(alice.prompt(&a, "hi").await["result"]["stopReason"], "end_turn");
    assert_eq!(bob.prompt(&b, "hi").await["result"]["stopReason"], "end_turn");
    let a2 = alice.new_session().await;
    assert_ne!(a2, a);
    assert_eq!(pool.process_count(), 2, "alice's second session shares her process");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_agent_keeps_generic_warm_processes() {
    let gw = TestGateway::start(Db::Sqlite, |c| {
        let pool = &mut c.agents.get_mut("default").expect("default").pool;
        pool.min_idle = 2;
        pool.share_between_users = true;
        pool.max_sessions_per_process = 1;
    })
    .await;
    let pool = gw.gw.agents.pools.get("default").expect("pool").clone();
    eventually("two warm processes", || pool.process_count() == 2).await;
    let mut alice = gw.client("alice").await;
    let a = alice.new_session().await;
    assert_eq!(alice.prompt(&a, "hi").await["result"]["stopReason"], "end_turn");
    // The session took a warm process; another is started to stay warm.
    eventually("warm processes replenished", || pool.process_count() == 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_share_a_process_only_when_configured() {
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.agents.get_mut("default").expect("default").pool.share_between_users = true
    })
    .await;
    let pool = gw.gw.agents.pools.get("default").expect("pool").clone();
    let mut alice = gw.client("alice").await;
    let mut bob = gw.client("bob").await;
    let a = alice.new_session().await;
    let b = bob.new_session().await;
    assert_eq!(pool.process_count(), 1, "shared");
    let (ra, rb) = tokio::join!(alice.prompt(&a, "a [chunks=50]"), bob.prompt(&b, "b [chunks=50]"));
    assert_eq!(
        (ra["result"]["stopReason"].clone(), rb["result"]["stopReason"].clone()),
        (json!("end_turn"), json!("end_turn"))
    );
    assert!(
        alice.inbox.iter().all(|m| m["params"]["sessionId"] == a.as_str()),
        "still no cross-talk"
    );
    assert!(bob.inbox.iter().all(|m| m["params"]["sessionId"] == b.as_str()));
}
