//! Updates an agent sends right after `session/new`, and its first burst: in order, to the client
//! and the transcript.

use super::*;

/// The demo agent with `--showcase` announces its slash commands right after answering
/// `session/new`, as claude-code-acp and codex-acp do. The client gets the answer first, then
/// the commands as the session's first update (stored, `seq` 1), and `session/load` replays them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_sent_right_after_session_new_reach_the_client_and_the_transcript() {
    let gw = TestGateway::start(Db::Sqlite, |c| {
        let demo = c
            .agents
            .get_mut(acp_gateway::infra::config::DEFAULT_AGENT)
            .expect("default agent");
        demo.args = ["demo-agent", "--showcase", "--delay-us", "0"]
            .map(String::from)
            .to_vec();
    })
    .await;
    let mut c = gw.client("alice").await;
    let s = c.new_session().await;
    assert!(
        c.take_updates(&s).is_empty(),
        "the client learns the session from its answer before any update of it"
    );
    // Pings keep `wait_for` from timing out on its own.
    let commands = tokio::time::timeout(common::WAIT, c.wait_for(|m| m["params"]["sessionId"] == s.as_str()))
        .await
        .expect("the commands the agent sent right after its answer reach the client");
    assert_eq!(kind(&commands), "available_commands_update", "{commands}");
    assert_eq!(seq(&commands), 1, "{commands}");
    let names: Vec<&str> = commands["params"]["update"]["availableCommands"]
        .as_array()
        .expect("commands")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert!(names.contains(&"explain"), "{names:?}");

    let mut other = gw.client("alice").await;
    let r = other
        .request(
            "session/load",
            json!({"sessionId": s, "cwd": other.root, "mcpServers": []}),
        )
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let replayed = other.take_updates(&s);
    assert_eq!(replayed.len(), 1, "{replayed:?}");
    assert_eq!(replayed[0]["params"]["update"], commands["params"]["update"]);
    assert_eq!(seq(&replayed[0]), 1);
}

const EARLY_AGENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/early_updates_agent.py");

async fn early_client(gw: &TestGateway, user: &str) -> Client {
    let mut c = Client::connect(&format!("{}?agent=early", gw.ws_url()), &gw.token(user))
        .await
        .expect("connect");
    let init = c.initialize().await;
    assert_eq!(init["result"]["agentInfo"]["name"], "early-updates-agent", "{init}");
    c
}

/// Texts of the chunks (and `[kind]` for other updates), with their seqs.
fn transcript(updates: &[Value]) -> Vec<(u64, String)> {
    updates
        .iter()
        .map(|u| {
            let text = match kind(u) {
                "agent_message_chunk" | "user_message_chunk" => text_of(u),
                other => format!("[{other}]"),
            };
            (seq(u), text)
        })
        .collect()
}

/// A burst an agent writes together with its `session/new` answer is the session's start, in
/// the agent's order, before anything later (a second session on the same process gets only its
/// own); an update for an id the agent never created reaches nobody; and when the session is
/// restored on a new process, what the agent replays before answering is not stored again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_first_burst_is_kept_in_order_and_a_restores_replay_is_not() {
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.agents
            .insert("early".into(), agent("python3", &[EARLY_AGENT, "--early", "20"]));
    })
    .await;
    let mut c = early_client(&gw, "alice").await;
    let mut expected: Vec<(u64, String)> = vec![(1, "[available_commands_update]".into())];
    expected.extend((1..=20).map(|i| (i + 1, format!("early {i}"))));
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let s = c.new_session().await;
        assert!(c.take_updates(&s).is_empty(), "the answer comes first");
        let early = tokio::time::timeout(common::WAIT, c.updates_until(&s, |u| text_of(u) == "early 20"))
            .await
            .expect("what the agent sent right after its answer reaches the client");
        assert_eq!(transcript(&early), expected);
        sessions.push(s);
    }
    let s = sessions[0].clone();
    let r = c.prompt(&s, "hi").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    assert_eq!(
        transcript(&c.take_updates(&s)),
        vec![(22, "hi".to_string()), (23, "reply: hi".to_string())]
    );

    // Restored on a fresh process, the agent replays "replayed 1..3" before answering.
    let pool = gw.gw.agents.pools.get("early").expect("pool").clone();
    let pids = pool.pids();
    assert_eq!(pids.len(), 1, "both sessions share the process");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pids[0] as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill");
    eventually("dead process dropped", || pool.process_count() == 0).await;
    let r = c.prompt(&s, "again").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let live = c.take_updates(&s);
    assert!(
        live.iter().all(|u| !text_of(u).starts_with("replayed")),
        "the restore's replay is not stored again: {live:?}"
    );
    assert_eq!(live.last().map(text_of).as_deref(), Some("reply: again"), "{live:?}");

    let mut d = early_client(&gw, "alice").await;
    let r = d
        .request("session/load", json!({"sessionId": s, "cwd": d.root, "mcpServers": []}))
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let all = d.take_updates(&s);
    let seqs: Vec<u64> = all.iter().map(seq).collect();
    assert_eq!(seqs, (1..=all.len() as u64).collect::<Vec<_>>());
    let mut live_too: Vec<(u64, String)> = expected.clone();
    live_too.extend([(22, "hi".to_string()), (23, "reply: hi".to_string())]);
    live_too.extend(transcript(&live));
    assert_eq!(transcript(&all), live_too, "the replay is what the client saw live");
    for m in c.inbox.iter().chain(d.inbox.iter()) {
        assert!(
            sessions.iter().any(|s| m["params"]["sessionId"] == s.as_str()),
            "nothing for a session the agent never created: {m}"
        );
    }
}
