//! The web UI's workspace routes (`/api/fs/dirs`, `/api/fs/file`) and the session controls that
//! `session/load` and `session/resume` answer with. Real gateway, real agent processes, real
//! HTTP and WebSocket clients.

mod common;

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use acp_gateway::config::{AgentConfig, Config, DEFAULT_AGENT};
use common::serve_process::ServeProcess;
use common::{Client, Db, TestGateway};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// An agent that changes its mode and model on its own (`mode:ID`, `model:VALUE` prompts).
const MODES_AGENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/modes_agent.py");

/// Plain HTTP, no cookies kept.
fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

/// `user`'s first workspace root (created).
fn root(gw: &TestGateway, user: &str) -> PathBuf {
    gw.gw.tenancy.roots(user).expect("roots").remove(0)
}

fn p(path: &Path) -> String {
    path.to_str().expect("utf-8").to_string()
}

/// `GET` as `user` (bearer token); the status and the JSON body.
async fn get(gw: &TestGateway, user: &str, route: &str, query: &[(&str, &str)]) -> (StatusCode, Value) {
    let res = http()
        .get(gw.http_url(route))
        .query(query)
        .bearer_auth(gw.token(user))
        .send()
        .await
        .expect("request");
    let status = res.status();
    assert_eq!(
        res.headers().get("cache-control").and_then(|v| v.to_str().ok()),
        Some("no-store"),
        "{route} {query:?}"
    );
    (status, res.json().await.expect("JSON body"))
}

/// `POST /api/fs/dirs` as `user`.
async fn mkdir(gw: &TestGateway, user: &str, path: &str) -> (StatusCode, Value) {
    let res = http()
        .post(gw.http_url("/api/fs/dirs"))
        .bearer_auth(gw.token(user))
        .json(&json!({ "path": path }))
        .send()
        .await
        .expect("request");
    (res.status(), res.json().await.expect("JSON body"))
}

fn names(listing: &Value) -> Vec<&str> {
    listing["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| e["name"].as_str().expect("name"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directories_inside_the_roots_are_listed() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let root = root(&gw, "alice");
    for d in ["beta", "Alpha", "gamma/inner", ".hidden"] {
        std::fs::create_dir_all(root.join(d)).expect("mkdir");
    }
    std::fs::write(root.join("file.txt"), "hi").expect("write");
    symlink(root.join("gamma"), root.join("to-gamma")).expect("symlink");
    symlink("/etc", root.join("to-etc")).expect("symlink");
    symlink(root.join("nowhere"), root.join("dangling")).expect("symlink");

    // No path: the first root; directories only, sorted by name, no hidden ones, links followed
    // only where they stay inside.
    let (status, listing) = get(&gw, "alice", "/api/fs/dirs", &[]).await;
    assert_eq!(status, StatusCode::OK, "{listing}");
    assert_eq!(listing["path"], p(&root));
    assert_eq!(listing["parent"], Value::Null, "a root has no parent to go to");
    assert_eq!(listing["roots"], json!([p(&root)]));
    assert_eq!(listing["truncated"], false);
    assert_eq!(names(&listing), ["Alpha", "beta", "gamma", "to-gamma"]);
    let entries = listing["entries"].as_array().expect("entries");
    assert_eq!(entries[0]["path"], p(&root.join("Alpha")));
    assert_eq!(
        entries[3]["path"],
        p(&root.join("gamma")),
        "a link is named by where it leads"
    );

    let (_, with_hidden) = get(&gw, "alice", "/api/fs/dirs", &[("hidden", "1")]).await;
    assert_eq!(names(&with_hidden), [".hidden", "Alpha", "beta", "gamma", "to-gamma"]);

    // Inside: the parent is the root; `..` and `.` are resolved.
    let (status, inner) = get(&gw, "alice", "/api/fs/dirs", &[("path", &p(&root.join("gamma")))]).await;
    assert_eq!(status, StatusCode::OK, "{inner}");
    assert_eq!(inner["parent"], p(&root));
    assert_eq!(names(&inner), ["inner"]);
    let winding = format!("{}/beta/../gamma/./inner", p(&root));
    let (status, deep) = get(&gw, "alice", "/api/fs/dirs", &[("path", &winding)]).await;
    assert_eq!(status, StatusCode::OK, "{deep}");
    assert_eq!(deep["path"], p(&root.join("gamma/inner")));
    assert_eq!(deep["parent"], p(&root.join("gamma")));
    assert_eq!(deep["entries"], json!([]));

    // Missing inside: 404; a file: 400; relative: 400.
    let (status, _) = get(&gw, "alice", "/api/fs/dirs", &[("path", &p(&root.join("nope")))]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = get(&gw, "alice", "/api/fs/dirs", &[("path", &p(&root.join("file.txt")))]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = get(&gw, "alice", "/api/fs/dirs", &[("path", "gamma")]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_outside_the_roots_is_reachable_or_probed() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let alice = root(&gw, "alice");
    let bob = root(&gw, "bob");
    std::fs::create_dir_all(bob.join("secret-project")).expect("mkdir");
    std::fs::write(bob.join("notes.txt"), "bob's").expect("write");
    symlink("/etc", alice.join("to-etc")).expect("symlink");
    symlink(&bob, alice.join("to-bob")).expect("symlink");
    symlink("/etc/hostname", alice.join("hostname")).expect("symlink");

    let refused = [
        p(&bob),                                        // another user's workspace
        p(&bob.join("secret-project")),                 // ... and what is in it
        p(&bob.join("no-such-dir")),                    // ... and what is not
        format!("{}/../bob", p(&alice)),                // `..` out of the root
        format!("{}/../../../../../../etc", p(&alice)), // far out
        p(&alice.join("to-etc")),                       // a link out
        p(&alice.join("to-bob/secret-project")),        // a link into another user's
        String::from("/"),
        String::from("/nonexistent/deeper"),
        String::from("/etc/hostname/x"), // a file in the middle, outside
        // `..` after a missing directory, then a link out: an existing and a missing target
        format!("{}/nope/../to-etc/hostname", p(&alice)),
        format!("{}/nope/../to-etc/no-such-file", p(&alice)),
        format!("{}/nope/../to-bob/secret-project", p(&alice)),
    ];
    let mut bodies = Vec::new();
    for path in &refused {
        let (status, body) = get(&gw, "alice", "/api/fs/dirs", &[("path", path)]).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
        assert_eq!(body["roots"], json!([p(&alice)]), "{path}: the allowed roots are named");
        bodies.push(body);
        let (status, _) = get(&gw, "alice", "/api/fs/file", &[("path", path)]).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "file {path}");
    }
    assert!(
        bodies.windows(2).all(|w| w[0] == w[1]),
        "one answer whether the path exists or not: {bodies:?}"
    );
    for file in [
        p(&bob.join("notes.txt")),
        p(&alice.join("hostname")),
        "/etc/passwd".into(),
    ] {
        let (status, _) = get(&gw, "alice", "/api/fs/file", &[("path", &file)]).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{file}");
    }

    // Making directories: refused outside, and nothing is made there.
    for path in [
        p(&bob.join("planted")),
        format!("{}/../bob/planted2", p(&alice)),
        p(&alice.join("to-bob/planted3")),
        p(&alice.join("to-etc/planted4")),
        format!("{}/nope/../to-bob/planted5", p(&alice)),
        format!("{}/nope/../to-bob/secret-project", p(&alice)), // exists: no 409 either
    ] {
        let (status, body) = mkdir(&gw, "alice", &path).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
    }
    for name in ["planted", "planted2", "planted3", "planted5"] {
        assert!(!bob.join(name).exists(), "{name} was made in bob's workspace");
    }
    assert!(!Path::new("/etc/planted4").exists());
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_signed_in_callers_from_our_own_pages() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let alice = root(&gw, "alice");
    std::fs::write(alice.join("a.txt"), "a").expect("write");
    for (route, query) in [
        ("/api/fs/dirs", vec![]),
        ("/api/fs/file", vec![("path", p(&alice.join("a.txt")))]),
    ] {
        let res = http()
            .get(gw.http_url(route))
            .query(&query)
            .send()
            .await
            .expect("request");
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{route}");
        let res = http()
            .get(gw.http_url(route))
            .query(&query)
            .bearer_auth("not-a-jwt")
            .send()
            .await
            .expect("request");
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{route}");
    }
    let res = http()
        .post(gw.http_url("/api/fs/dirs"))
        .json(&json!({ "path": p(&alice.join("anon")) }))
        .send()
        .await
        .expect("request");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);

    // The web UI's cookie works from our own pages, not from another site's (CSRF).
    let cookie = format!("acp_gateway_token={}", gw.token("alice"));
    let ours = format!("http://{}", gw.addr);
    for (origin, want) in [
        (ours.as_str(), StatusCode::CREATED),
        ("http://evil.example", StatusCode::UNAUTHORIZED),
    ] {
        let dir = alice.join(format!("from-{}", origin.len()));
        let res = http()
            .post(gw.http_url("/api/fs/dirs"))
            .header("cookie", &cookie)
            .header("origin", origin)
            .json(&json!({ "path": p(&dir) }))
            .send()
            .await
            .expect("request");
        assert_eq!(res.status(), want, "Origin {origin}");
        assert_eq!(dir.exists(), want == StatusCode::CREATED, "Origin {origin}");
    }
    let res = http()
        .get(gw.http_url("/api/fs/dirs"))
        .header("cookie", &cookie)
        .header("sec-fetch-site", "cross-site")
        .send()
        .await
        .expect("request");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_folders_are_private_and_made_once() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let alice = root(&gw, "alice");
    let deep = alice.join("projects/new-app/src");
    let (status, body) = mkdir(&gw, "alice", &p(&deep)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body, json!({ "path": p(&deep) }));
    for dir in [alice.join("projects"), alice.join("projects/new-app"), deep.clone()] {
        let mode = std::fs::metadata(&dir).expect("made").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", dir.display());
    }
    let (status, _) = mkdir(&gw, "alice", &p(&deep)).await;
    assert_eq!(status, StatusCode::CONFLICT, "it exists now");
    std::fs::write(alice.join("file"), "x").expect("write");
    let (status, _) = mkdir(&gw, "alice", &p(&alice.join("file/sub"))).await;
    assert!(
        status == StatusCode::BAD_REQUEST || status == StatusCode::FORBIDDEN,
        "a file in the middle: {status}"
    );
    let (status, _) = mkdir(&gw, "alice", "relative/path").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let res = http()
        .post(gw.http_url("/api/fs/dirs"))
        .bearer_auth(gw.token("alice"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("request");
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    // The new folder is what the picker lists, and a session can start in it.
    let (_, listing) = get(&gw, "alice", "/api/fs/dirs", &[("path", &p(&alice.join("projects")))]).await;
    assert_eq!(names(&listing), ["new-app"]);
    let mut client = gw.client("alice").await;
    let r = client
        .request("session/new", json!({ "cwd": p(&deep), "mcpServers": [] }))
        .await;
    assert!(r["result"]["sessionId"].is_string(), "{r}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_files_are_read_binary_ones_refused_big_ones_cut() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let alice = root(&gw, "alice");
    std::fs::create_dir_all(alice.join("src")).expect("mkdir");
    let text = "fn main() {\n    println!(\"héllo\");\n}\n";
    std::fs::write(alice.join("src/main.rs"), text).expect("write");
    let (status, file) = get(
        &gw,
        "alice",
        "/api/fs/file",
        &[("path", &p(&alice.join("src/main.rs")))],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{file}");
    assert_eq!(
        file,
        json!({ "path": p(&alice.join("src/main.rs")), "text": text, "size": text.len(), "truncated": false })
    );
    // Through a link that stays inside: named by where it leads.
    symlink(alice.join("src/main.rs"), alice.join("main-link.rs")).expect("symlink");
    let (status, linked) = get(
        &gw,
        "alice",
        "/api/fs/file",
        &[("path", &p(&alice.join("main-link.rs")))],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(linked["path"], p(&alice.join("src/main.rs")));

    let mut binary = b"\x7fELF".to_vec();
    binary.extend([0u8; 64]);
    std::fs::write(alice.join("a.out"), &binary).expect("write");
    std::fs::write(alice.join("latin1.txt"), b"caf\xe9\n").expect("write");
    for name in ["a.out", "latin1.txt"] {
        let (status, body) = get(&gw, "alice", "/api/fs/file", &[("path", &p(&alice.join(name)))]).await;
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{name}: {body}");
    }

    // 1.5 MiB of text with a two-byte character across the 1 MiB mark: cut before it.
    let mib = 1 << 20;
    let mut big = "a".repeat(mib - 1);
    big.push('é');
    big.push_str(&"b".repeat(mib / 2));
    std::fs::write(alice.join("big.log"), &big).expect("write");
    let (status, cut) = get(&gw, "alice", "/api/fs/file", &[("path", &p(&alice.join("big.log")))]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(cut["truncated"], true);
    assert_eq!(cut["size"], big.len());
    let got = cut["text"].as_str().expect("text");
    assert_eq!(got.len(), mib - 1, "cut at a character boundary");
    assert!(big.starts_with(got));

    let (status, _) = get(&gw, "alice", "/api/fs/file", &[("path", &p(&alice.join("src")))]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "a directory");
    let (status, _) = get(&gw, "alice", "/api/fs/file", &[("path", &p(&alice.join("nope.rs")))]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = get(&gw, "alice", "/api/fs/file", &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "no path");
    nix_mkfifo(&alice.join("pipe"));
    let (status, _) = get(&gw, "alice", "/api/fs/file", &[("path", &p(&alice.join("pipe")))]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "a FIFO is not read (nor waited on)");
    gw.stop().await;
}

/// Makes a FIFO with `mkfifo(1)`.
fn nix_mkfifo(path: &Path) {
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo runs")
        .success();
    assert!(ok, "mkfifo {}", path.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_stops_at_a_thousand() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let alice = root(&gw, "alice");
    let many = alice.join("many");
    for i in 0..1005 {
        std::fs::create_dir_all(many.join(format!("d{i:04}"))).expect("mkdir");
    }
    let (status, listing) = get(&gw, "alice", "/api/fs/dirs", &[("path", &p(&many))]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listing["truncated"], true);
    let got = names(&listing);
    assert_eq!(got.len(), 1000);
    assert_eq!(got[0], "d0000");
    assert_eq!(got[999], "d0999", "the first thousand by name");
    gw.stop().await;
}

// ---- Session controls: what session/load and session/resume answer with ----

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
    let (dir, url) = (gw.dir.clone(), gw.db_url.clone());
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
    let (dir, url) = (gw.dir.clone(), gw.db_url.clone());
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
        assert_eq!(reopen(&mut alice, method, &sid).await, json!({}), "{method}");
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
