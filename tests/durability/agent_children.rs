//! No agent process outlives a SIGKILLed gateway, including what the agent itself started.

use super::*;

/// An agent that, like a coding agent running a shell command, has a child of its own that does
/// not read stdin (so it never sees the gateway's pipe close): `sleep` with a unique duration.
async fn agent_children_die_with_the_gateway(sandbox: &'static str) {
    let _serial = SERIAL.lock().await;
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().canonicalize().expect("canon");
    let agent = marked_gateway_bin("children");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .subsec_nanos();
    let child_marker = format!("86400.{}{nanos:09}", std::process::id());
    let script = format!("sleep {child_marker} & exec \"$0\" demo-agent --delay-us 0");
    let config = dir.join("gw.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\n[agents.default]\ncommand = \"/bin/sh\"\nargs = [\"-c\", {script:?}, {:?}]\nsandbox = {sandbox:?}\n",
            dir.join("data").display().to_string(),
            agent.display().to_string(),
        ),
    )
    .expect("config");
    let db_url = format!("sqlite://{}", dir.join("data/acp-gateway.db").display());
    let gw = ServeProcess::start(&config, &db_url, SECRET).await;
    let mut c = gw.client("alice").await;
    let s = c.new_session().await;
    let r = c.prompt(&s, "hello [chunks=3]").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let marker = agent.display().to_string();
    let ours = || {
        let mut p = common::processes_matching(&marker);
        p.extend(common::processes_matching(&child_marker));
        p.sort_unstable();
        p.dedup();
        p
    };
    let before = ours();
    assert!(
        !common::processes_matching(&child_marker).is_empty() && !common::processes_matching(&marker).is_empty(),
        "the agent and its child run: {before:?}"
    );
    gw.kill().await;
    if sandbox == "none" {
        // Unsandboxed, the agent itself has a parent-death signal; what it started has none,
        // and is killed with its process group when the gateway next starts (the reaper).
        let agent_gone = wait_until(WAIT, || common::processes_matching(&marker).is_empty()).await;
        if agent_gone.is_none() {
            kill_leftovers(&ours());
        }
        assert!(
            agent_gone.is_some(),
            "the agent outlived the SIGKILLed gateway (sandbox = none)"
        );
        let again = ServeProcess::start(&config, &db_url, SECRET).await;
        let gone = wait_until(WAIT, || ours().is_empty()).await;
        println!(
            "sandbox = none: the agent died with the gateway; its child was killed at the next start: {}",
            gone.map_or("NO".into(), ms)
        );
        if gone.is_none() {
            kill_leftovers(&ours());
        }
        again.stop().await;
        let _ = std::fs::remove_file(&agent);
        assert!(
            gone.is_some(),
            "the agent's child survived the next start (sandbox = none)"
        );
        return;
    }
    let gone = wait_until(WAIT, || ours().is_empty()).await;
    let left: Vec<String> = procfs::describe_processes(&marker)
        .into_iter()
        .chain(procfs::describe_processes(&child_marker))
        .collect();
    println!(
        "sandbox = {sandbox}: {} agent processes before the SIGKILL; after: {}",
        before.len(),
        gone.map_or_else(
            || format!("still running {left:?}"),
            |d| format!("all gone in {}", ms(d))
        )
    );
    if gone.is_none() {
        kill_leftovers(&ours());
    }
    let _ = std::fs::remove_file(&agent);
    assert!(
        gone.is_some(),
        "processes of the agent outlived the SIGKILLed gateway (sandbox = {sandbox}): {left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_own_children_die_with_a_sigkilled_gateway_bwrap() {
    agent_children_die_with_the_gateway("bwrap").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsandboxed_agent_dies_with_a_sigkilled_gateway_and_its_children_at_the_next_start() {
    agent_children_die_with_the_gateway("none").await;
}
