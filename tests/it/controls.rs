//! The session controls (modes, config options, models) that `session/load` and
//! `session/resume` answer with, kept across agent processes and replicas. Real gateway, real
//! agent processes, real WebSocket clients.

use crate::common;

use std::path::Path;

use acp_gateway::infra::config::{AgentConfig, Config, DEFAULT_AGENT};
use common::serve_process::ServeProcess;
use common::{Client, Db, TestGateway};
use serde_json::{Value, json};

/// An agent that changes its mode and model on its own (`mode:ID`, `model:VALUE` prompts).
const MODES_AGENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/modes_agent.py");

fn p(path: &Path) -> String {
    path.to_str().expect("utf-8").to_string()
}

/// The demo agent's showcase (modes ask/code/plan; config options model and effort).
fn showcase(c: &mut Config) {
    let demo = c.agents.get_mut(DEFAULT_AGENT).expect("default agent");
    demo.args = ["demo-agent", "--showcase", "--delay-us", "0"]
        .map(String::from)
        .to_vec();
}

/// The modes agent as the default agent.
fn modes_agent(c: &mut Config) {
    let agent = AgentConfig {
        command: "/usr/bin/python3".into(),
        args: vec![MODES_AGENT.into()],
        ..Default::default()
    };
    c.agents.insert(DEFAULT_AGENT.into(), agent);
}

/// The result of `method` (`session/load` or `session/resume`) for `sid`.
async fn reopen(client: &mut Client, method: &str, sid: &str) -> Value {
    let cwd = client.root.clone();
    let r = client
        .request(method, json!({ "sessionId": sid, "cwd": cwd, "mcpServers": [] }))
        .await;
    r.get("result")
        .cloned()
        .unwrap_or_else(|| panic!("{method} failed: {r}"))
}

/// `currentModeId`, and the `currentValue` of config option `id`.
fn current(result: &Value, option: &str) -> (String, String) {
    let mode = result["modes"]["currentModeId"]
        .as_str()
        .unwrap_or_else(|| panic!("no modes: {result}"));
    let value = result["configOptions"]
        .as_array()
        .unwrap_or_else(|| panic!("no configOptions: {result}"))
        .iter()
        .find(|o| o["id"] == option)
        .and_then(|o| o["currentValue"].as_str())
        .unwrap_or_else(|| panic!("no option {option}: {result}"));
    (mode.to_string(), value.to_string())
}

async fn load_and_resume_answer_with_the_controls(db: Db) {
    let gw = TestGateway::start(db, showcase).await;
    let mut alice = gw.client("alice").await;
    let cwd = alice.root.clone();
    let new = alice
        .request("session/new", json!({ "cwd": cwd, "mcpServers": [] }))
        .await;
    let sid = new["result"]["sessionId"].as_str().expect("session id").to_string();
    let (mode, model) = current(&new["result"], "model");
    let available: Vec<&str> = new["result"]["modes"]["availableModes"]
        .as_array()
        .expect("modes")
        .iter()
        .map(|m| m["id"].as_str().expect("id"))
        .collect();
    assert!(available.len() >= 2, "{new}");
    let options = new["result"]["configOptions"][0]["options"]
        .as_array()
        .expect("model choices");
    let other_model = options
        .iter()
        .filter_map(|o| o["value"].as_str())
        .find(|v| *v != model)
        .expect("a second model")
        .to_string();
    // Plan mode if there is one (the showcase's ask mode asks before edits).
    let other_mode = available
        .iter()
        .find(|m| **m == "plan")
        .or_else(|| available.iter().find(|m| **m != mode))
        .expect("a second mode")
        .to_string();

    // A second tab: its load answers with what session/new did.
    let mut tab = gw.client("alice").await;
    let loaded = reopen(&mut tab, "session/load", &sid).await;
    assert_eq!(loaded["modes"], new["result"]["modes"], "{loaded}");
    assert_eq!(loaded["configOptions"], new["result"]["configOptions"]);

    // Changes from the first tab show in the next load and resume.
    let r = alice
        .request("session/set_mode", json!({ "sessionId": sid, "modeId": other_mode }))
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let r = alice
        .request(
            "session/set_config_option",
            json!({ "sessionId": sid, "configId": "model", "value": other_model }),
        )
        .await;
    assert!(r.get("result").is_some(), "{r}");
    for method in ["session/load", "session/resume"] {
        let again = reopen(&mut tab, method, &sid).await;
        assert_eq!(
            current(&again, "model"),
            (other_mode.clone(), other_model.clone()),
            "{method}: {again}"
        );
    }
    // A refused change changes nothing.
    let r = alice
        .request(
            "session/set_mode",
            json!({ "sessionId": sid, "modeId": "no-such-mode" }),
        )
        .await;
    assert!(r.get("error").is_some(), "{r}");
    let again = reopen(&mut tab, "session/load", &sid).await;
    assert_eq!(current(&again, "model"), (other_mode.clone(), other_model.clone()));
    // Another user's load of it: the usual not-found, no controls.
    let mut bob = gw.client("bob").await;
    let r = bob
        .request(
            "session/load",
            json!({ "sessionId": sid, "cwd": bob.root.clone(), "mcpServers": [] }),
        )
        .await;
    assert_eq!(r["error"]["code"], -32002, "{r}");

    // A gateway started on the same database (the process and the memory gone) reads them from
    // the store.
    alice.close().await;
    tab.close().await;
    let (dir, url) = (gw.dir().clone(), gw.db_url.clone());
    gw.stop().await;
    let gw = TestGateway::start_in(dir, Db::Url(url), showcase).await;
    let mut later = gw.client("alice").await;
    let stored = reopen(&mut later, "session/load", &sid).await;
    assert_eq!(
        current(&stored, "model"),
        (other_mode.clone(), other_model.clone()),
        "{stored}"
    );

    // The next request restores the session on a new agent process, which starts with its
    // defaults: it is put back to what the user chose, so the pickers are what it does. Its
    // answer to a change of another option lists all of them as it has them.
    let efforts = stored["configOptions"]
        .as_array()
        .expect("options")
        .iter()
        .find(|o| o["id"] == "effort")
        .cloned()
        .expect("the effort option");
    let effort = efforts["options"]
        .as_array()
        .expect("choices")
        .iter()
        .filter_map(|o| o["value"].as_str())
        .find(|v| *v != efforts["currentValue"])
        .expect("another effort")
        .to_string();
    let r = later
        .request(
            "session/set_config_option",
            json!({ "sessionId": sid, "configId": "effort", "value": effort }),
        )
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let agents = json!({ "modes": {"currentModeId": ""}, "configOptions": r["result"]["configOptions"] });
    assert_eq!(
        current(&agents, "model").1,
        other_model,
        "the restored agent has the chosen model: {r}"
    );
    let after = reopen(&mut later, "session/load", &sid).await;
    assert_eq!(
        current(&after, "model"),
        (other_mode.clone(), other_model.clone()),
        "{after}"
    );
    assert_eq!(current(&after, "effort").1, effort);
    gw.stop().await;
}

common::both_backends!(
    load_and_resume_answer_with_the_controls_sqlite,
    load_and_resume_answer_with_the_controls_postgres,
    load_and_resume_answer_with_the_controls
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_changing_its_own_mode_is_followed_and_kept() {
    let gw = TestGateway::start(Db::Sqlite, modes_agent).await;
    let mut alice = gw.client("alice").await;
    let sid = alice.new_session().await;
    let mut tab = gw.client("alice").await;
    assert_eq!(
        current(&reopen(&mut tab, "session/load", &sid).await, "model"),
        ("ask".into(), "small".into())
    );

    let r = alice.prompt(&sid, "mode:code").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let r = alice.prompt(&sid, "model:large").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let after = reopen(&mut tab, "session/load", &sid).await;
    assert_eq!(current(&after, "model"), ("code".into(), "large".into()), "{after}");

    // The agent process is gone; restoring it (its resume says nothing of its controls) keeps
    // the stored ones, and a new gateway reads them.
    alice.close().await;
    tab.close().await;
    let (dir, url) = (gw.dir().clone(), gw.db_url.clone());
    gw.stop().await;
    let gw = TestGateway::start_in(dir, Db::Url(url), modes_agent).await;
    let mut later = gw.client("alice").await;
    let stored = reopen(&mut later, "session/resume", &sid).await;
    assert_eq!(current(&stored, "model"), ("code".into(), "large".into()), "{stored}");
    // A prompt restores the session on a new process; then the agent changes its mode again.
    let r = later.prompt(&sid, "mode:ask").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let after = reopen(&mut later, "session/load", &sid).await;
    assert_eq!(current(&after, "model"), ("ask".into(), "large".into()), "{after}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_without_controls_is_answered_as_before() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut alice = gw.client("alice").await;
    let sid = alice.new_session().await;
    for method in ["session/load", "session/resume"] {
        let mut answer = reopen(&mut alice, method, &sid).await;
        // Besides the controls, how the session's turn stands (for a client back from a drop).
        let meta = answer.as_object_mut().and_then(|a| a.remove("_meta"));
        assert_eq!(meta, Some(json!({"gateway": {"turn": {"running": false}}})), "{method}");
        assert_eq!(answer, json!({}), "{method}");
    }
    gw.stop().await;
}

/// Two `serve` processes (replicas `a` and `b`) on one Postgres, the showcase demo agent.
async fn two_replicas(tmp: &Path, db_url: &str) -> (ServeProcess, ServeProcess) {
    std::fs::create_dir_all(tmp.join("work")).expect("workspace");
    let mut replicas = Vec::new();
    for name in ["a", "b"] {
        let config = tmp.join(format!("{name}.toml"));
        std::fs::write(
            &config,
            format!(
                "data_dir = {:?}\nreplica_id = {name:?}\nworkspace_roots = [{:?}]\n\
                 [limits]\nlease_ttl_secs = 5\n\
                 [agents.default]\ncommand = {:?}\nargs = [\"demo-agent\", \"--showcase\", \"--delay-us\", \"0\"]\nsandbox = \"none\"\n",
                p(&tmp.join(name)),
                p(&tmp.join("work")),
                common::gateway_bin(),
            ),
        )
        .expect("config");
        replicas.push(ServeProcess::start(&config, db_url, common::SECRET).await);
    }
    let b = replicas.pop().expect("b");
    (replicas.pop().expect("a"), b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_answer_with_the_controls_the_serving_one_stored() {
    let tmp = tempfile::tempdir().expect("tmp");
    let tmp = tmp.path().canonicalize().expect("canon");
    let db_url = common::pg::fresh_database().await;
    let (a, b) = two_replicas(&tmp, &db_url).await;
    let mut on_a = a.client("alice").await;
    let cwd = on_a.root.clone();
    let new = on_a
        .request("session/new", json!({ "cwd": cwd, "mcpServers": [] }))
        .await;
    let sid = new["result"]["sessionId"].as_str().expect("session id").to_string();
    let mut on_b = b.client("alice").await;
    let loaded = reopen(&mut on_b, "session/load", &sid).await;
    assert_eq!(
        loaded["modes"], new["result"]["modes"],
        "B reads what A stored: {loaded}"
    );
    assert_eq!(loaded["configOptions"], new["result"]["configOptions"]);

    // B's client changes the mode; A serves the session, stores the change, then answers.
    let r = on_b
        .request("session/set_mode", json!({ "sessionId": sid, "modeId": "plan" }))
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let (_, model) = current(&loaded, "model");
    for (who, client) in [("B", &mut on_b), ("A", &mut on_a)] {
        let again = reopen(client, "session/resume", &sid).await;
        assert_eq!(
            current(&again, "model"),
            ("plan".into(), model.clone()),
            "{who}: {again}"
        );
    }

    // A dies; B takes the session over (its own agent process, put back in plan mode).
    a.kill().await;
    let killed = std::time::Instant::now();
    let answer = loop {
        let r = on_b
            .request(
                "session/set_config_option",
                json!({ "sessionId": sid, "configId": "effort", "value": "high" }),
            )
            .await;
        if r.get("result").is_some() {
            break r;
        }
        assert!(killed.elapsed().as_secs() < 15, "B did not take the session over: {r}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert!(answer["result"]["configOptions"].is_array(), "{answer}");
    let after = reopen(&mut on_b, "session/load", &sid).await;
    assert_eq!(current(&after, "model"), ("plan".into(), model), "{after}");
    assert_eq!(current(&after, "effort").1, "high");
    b.stop().await;
}
