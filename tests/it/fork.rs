//! Issue 21, item 2: `session/fork` answered by the gateway for any agent, on both backends. A
//! fork at a seq starts with exactly the original's history up to it; prompting each branch
//! afterwards adds only to its own. A fork of the whole history on an agent that forks sessions
//! itself (the demo agent advertises `sessionCapabilities.fork`) is made by the agent, which then
//! remembers the conversation; any other fork is a new agent session whose first prompt carries
//! the history to it. Another user's session answers as an unknown one.

use crate::common;

use common::{Client, Db, TestGateway, seq};
use serde_json::{Value, json};

/// What the agent said in these updates, joined.
fn agent_text(updates: &[Value]) -> String {
    updates
        .iter()
        .filter(|u| u["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|u| u["params"]["update"]["content"]["text"].as_str())
        .collect()
}

/// The updates `session/load` replays for `session`, from a fresh connection of `user`.
async fn replayed(gw: &TestGateway, user: &str, session: &str) -> Vec<Value> {
    let mut c = gw.client(user).await;
    let updates = c.load(session).await;
    c.close().await;
    updates
}

async fn fork(c: &mut Client, session: &str, up_to: Option<i64>) -> Value {
    let root = c.root.clone();
    let mut params = json!({"sessionId": session, "cwd": root, "mcpServers": []});
    if let Some(n) = up_to {
        params["_meta"] = json!({"gateway": {"upToSeq": n}});
    }
    c.request("session/fork", params).await
}

async fn prompt_updates(c: &mut Client, session: &str, text: &str) -> Vec<Value> {
    let r = c.prompt(session, text).await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    c.take_updates(session)
}

async fn fork_at_a_seq_then_both_branches(db: Db) {
    let gw = TestGateway::start(db, |_| {}).await;
    let mut c = gw.client("alice").await;
    let init = c.request("initialize", json!({"protocolVersion": 1})).await;
    assert!(init.get("error").is_some(), "initialize twice is refused: {init}");
    let s = c.new_session().await;
    c.take_updates(&s);
    let one = prompt_updates(&mut c, &s, "one [chunks=2] [title=Branching]").await;
    let at = seq(one.last().expect("updates"));
    let two = prompt_updates(&mut c, &s, "two [chunks=2]").await;
    let original = replayed(&gw, "alice", &s).await;
    assert_eq!(original.len(), one.len() + two.len());

    // Forked after the first prompt: a new session whose history is the original's up to `at`.
    let f = fork(&mut c, &s, Some(at as i64)).await;
    let forked = f["result"]["sessionId"].as_str().expect("a forked session").to_string();
    assert_ne!(forked, s);
    let history = replayed(&gw, "alice", &forked).await;
    assert_eq!(history.len(), at as usize);
    for (copied, orig) in history.iter().zip(&original) {
        assert_eq!(seq(copied), seq(orig));
        assert_eq!(copied["params"]["update"], orig["params"]["update"]);
        assert_eq!(copied["params"]["sessionId"], forked.as_str());
    }
    // Its agent started afresh: the first prompt took the history to it (the agent saw two
    // blocks: the history, then what the user wrote), the second does not.
    let three = prompt_updates(&mut c, &forked, "three [recall]").await;
    let said = agent_text(&three);
    assert!(
        said.contains(&format!("You attached a file gateway:///fork/{forked}.md")),
        "{said}"
    );
    assert!(said.contains("I remember 2 user message blocks."), "{said}");
    assert_eq!(seq(&three[0]), at + 1, "the fork numbers on from where it was cut");
    let again = agent_text(&prompt_updates(&mut c, &forked, "three again").await);
    assert!(!again.contains("You attached"), "{again}");

    // Each branch goes on with only its own history.
    prompt_updates(&mut c, &s, "four").await;
    let texts = |updates: &[Value]| {
        updates
            .iter()
            .filter(|u| u["params"]["update"]["sessionUpdate"] == "user_message_chunk")
            .filter_map(|u| u["params"]["update"]["content"]["text"].as_str().map(str::to_string))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        texts(&replayed(&gw, "alice", &s).await),
        ["one [chunks=2] [title=Branching]", "two [chunks=2]", "four"]
    );
    assert_eq!(
        texts(&replayed(&gw, "alice", &forked).await),
        ["one [chunks=2] [title=Branching]", "three [recall]", "three again"]
    );

    // The list shows the fork with its origin and the original's title, marked.
    let list = c.request("session/list", json!({})).await;
    let entry = list["result"]["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .find(|e| e["sessionId"] == forked.as_str())
        .expect("the fork is listed")
        .clone();
    assert_eq!(entry["title"], "Branching (fork)", "{entry}");
    assert_eq!(
        entry["_meta"]["forkedFrom"],
        json!({"sessionId": s, "seq": at}),
        "{entry}"
    );

    // The whole history, on an agent that forks: the agent makes it and remembers everything.
    let whole = fork(&mut c, &s, None).await;
    let whole = whole["result"]["sessionId"].as_str().expect("forked").to_string();
    assert_eq!(
        replayed(&gw, "alice", &whole).await.len(),
        replayed(&gw, "alice", &s).await.len()
    );
    let said = agent_text(&prompt_updates(&mut c, &whole, "five [recall]").await);
    assert!(said.contains("I remember 4 user message blocks."), "{said}");
    assert!(!said.contains("You attached"), "{said}");

    // Refusals: a seq beyond the history; another user's session exactly as an unknown one.
    let beyond = fork(&mut c, &s, Some(100_000)).await;
    assert_eq!(beyond["error"]["code"], -32602, "{beyond}");
    assert!(
        beyond["error"]["message"]
            .as_str()
            .expect("message")
            .contains("upToSeq"),
        "{beyond}"
    );
    let mut bob = gw.client("bob").await;
    let foreign = fork(&mut bob, &s, None).await;
    let unknown = fork(&mut bob, "no-such-session", None).await;
    assert_eq!(foreign["error"], unknown["error"], "{foreign} {unknown}");
    assert_eq!(foreign["error"]["code"], -32002, "{foreign}");
    let bobs = bob.request("session/list", json!({})).await;
    assert_eq!(bobs["result"]["sessions"], json!([]), "nothing was made for Bob");
    c.close().await;
    bob.close().await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_at_a_seq_then_both_branches_sqlite() {
    fork_at_a_seq_then_both_branches(Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_at_a_seq_then_both_branches_postgres() {
    fork_at_a_seq_then_both_branches(Db::Postgres).await;
}

/// An agent that cannot fork: the whole history goes to it with the fork's first prompt, and
/// the gateway still says it forks (`sessionCapabilities.fork`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_without_fork_gets_the_history_with_the_first_prompt() {
    let gw = TestGateway::start(Db::Sqlite, |c| {
        let demo = c
            .agents
            .get_mut(acp_gateway::infra::config::DEFAULT_AGENT)
            .expect("demo");
        demo.args.extend(["--fork".to_string(), "false".to_string()]);
    })
    .await;
    let mut c = Client::connect(&gw.ws_url(), &gw.token("alice"))
        .await
        .expect("connects");
    let init = c.initialize().await;
    assert_eq!(
        init["result"]["agentCapabilities"]["sessionCapabilities"]["fork"],
        json!({})
    );
    let s = c.new_session().await;
    prompt_updates(&mut c, &s, "remember the word marmalade").await;
    let f = fork(&mut c, &s, None).await;
    let forked = f["result"]["sessionId"].as_str().expect("forked").to_string();
    let said = agent_text(&prompt_updates(&mut c, &forked, "what was the word? [recall]").await);
    assert!(
        said.contains(&format!("You attached a file gateway:///fork/{forked}.md")),
        "{said}"
    );
    assert!(said.contains("I remember 2 user message blocks."), "{said}");
    c.close().await;
    gw.stop().await;
}

/// A fork whose history still waits for its first prompt, forked whole: its agent knows none of
/// it, so the new fork is not the agent's own but gets the history with its first prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_of_a_fork_not_yet_prompted_keeps_the_history() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut c = gw.client("alice").await;
    let s = c.new_session().await;
    let one = prompt_updates(&mut c, &s, "one").await;
    prompt_updates(&mut c, &s, "two").await;
    let first = fork(&mut c, &s, Some(seq(one.last().expect("updates")) as i64)).await;
    let first = first["result"]["sessionId"].as_str().expect("forked").to_string();
    let second = fork(&mut c, &first, None).await;
    let second = second["result"]["sessionId"].as_str().expect("forked").to_string();
    assert_eq!(replayed(&gw, "alice", &second).await.len(), one.len());
    let said = agent_text(&prompt_updates(&mut c, &second, "go on [recall]").await);
    assert!(
        said.contains(&format!("You attached a file gateway:///fork/{second}.md")),
        "{said}"
    );
    c.close().await;
    gw.stop().await;
}

/// The copy counts against the user's stored bytes: a fork that would take them over the cap is
/// refused naming it, and leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_over_the_storage_cap_is_refused() {
    let gw = TestGateway::start(Db::Sqlite, |c| c.limits.max_stored_bytes_per_user = 4_000).await;
    let mut c = gw.client("alice").await;
    let s = c.new_session().await;
    prompt_updates(&mut c, &s, "fill [chunks=12]").await;
    gw.gw.sessions.flush().await; // SQLite counts stored bytes once the writer is quiet
    let used = gw.gw.sessions.store().stored_bytes("alice").await.expect("bytes");
    assert!((2_001..4_000).contains(&used), "a copy would pass the cap: {used}");
    let refused = fork(&mut c, &s, None).await;
    assert_eq!(refused["error"]["data"]["cap"], "stored_bytes", "{refused}");
    let list = c.request("session/list", json!({})).await;
    assert_eq!(
        list["result"]["sessions"].as_array().expect("sessions").len(),
        1,
        "{list}"
    );
    gw.gw.sessions.flush().await;
    assert_eq!(gw.gw.sessions.store().stored_bytes("alice").await.expect("bytes"), used);
    c.close().await;
    gw.stop().await;
}
