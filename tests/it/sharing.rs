//! Issue 21, item 4: a session shared with a teammate, on both backends and across replicas.
//! An observer sees the history and the live stream and can do nothing else: its prompt, control
//! change and cancel are refused (the cancel is ignored: the turn runs to its end), it is never
//! asked the agent's permission requests, and its answer to one counts for nothing. A controller
//! (here let in by a link) prompts and answers. Another user, an unknown id and an ended share
//! answer alike. Revoking a share closes the sockets it let in (on this replica at once, on
//! another one at its next check); so does expiry. Only a link's hash is stored. Every step is
//! audited.

use crate::common;

use std::time::{Duration, Instant};

use common::serve_process::ServeProcess;
use common::{Client, Db, SECRET, TestGateway, WAIT, seq};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

/// `method path` with a JSON body as `token`'s user on the gateway at `base`: status and body.
async fn call(base: &str, token: &str, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .request(method, format!("{base}{path}"))
        .bearer_auth(token);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let res = req.send().await.expect("request");
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

/// `base` of a gateway whose WebSocket is at `ws` (`ws://host/acp`).
fn http_base(ws: &str) -> String {
    ws.replacen("ws://", "http://", 1).trim_end_matches("/acp").to_string()
}

/// Shares `session` as `role` (with `user`, or as a link): the answer's body.
async fn share(base: &str, owner_token: &str, session: &str, body: Value) -> Value {
    let (status, answer) = call(
        base,
        owner_token,
        reqwest::Method::POST,
        &format!("/api/sessions/{session}/shares"),
        Some(body),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    answer
}

/// Whether `session` on `gw`, loaded by its owner alice, holds an update whose text is `text`.
async fn stored_text(gw: &ServeProcess, session: &str, text: &str) -> bool {
    let history = gw.client("alice").await.load(session).await;
    history.iter().any(|u| u["params"]["update"]["content"]["text"] == text)
}

/// Revokes `made` (a share's creation answer) of `session` as `owner_token`'s user; the status.
async fn revoke(base: &str, owner_token: &str, session: &str, made: &Value) -> u16 {
    let id = made["share"]["id"].as_str().expect("share id");
    let path = format!("/api/sessions/{session}/shares/{id}");
    call(base, owner_token, reqwest::Method::DELETE, &path, None).await.0
}

/// Reads until the server closes the socket; the close code (`None`: no close frame).
async fn closed_with(c: &mut Client) -> Option<u16> {
    loop {
        match c.recv_frame().await {
            Some(Message::Close(frame)) => return frame.map(|f| u16::from(f.code)),
            Some(_) => {}
            None => return None,
        }
    }
}

async fn attach(c: &mut Client, session: &str, extra: Value) -> Value {
    let mut params = json!({ "sessionId": session });
    if let (Some(p), Some(e)) = (params.as_object_mut(), extra.as_object()) {
        p.extend(e.clone());
    }
    c.request("session/attach", params).await
}

fn is_permission(m: &Value) -> bool {
    m["method"] == "session/request_permission"
}

async fn observer_and_controller(db: Db) {
    let gw = TestGateway::start(db, |_| {}).await;
    let base = gw.http_url("");
    let mut alice = gw.client("alice").await;
    let s = alice.new_session().await;
    let r = alice.prompt(&s, "first [chunks=3] [title=Pairing]").await;
    assert_eq!(r["result"]["stopReason"], "end_turn");
    alice.take_updates(&s);
    let history = alice.load(&s).await;
    assert!(history.len() >= 4, "{history:?}");

    // Before any share, bob is a stranger: his attach is answered like an unknown id's.
    let mut bob = gw.client("bob").await;
    let unknown = attach(&mut bob, "no-such-session", json!({})).await;
    let foreign = attach(&mut bob, &s, json!({})).await;
    assert_eq!(foreign["error"], unknown["error"], "{foreign} vs {unknown}");
    assert_eq!(foreign["error"]["code"], -32002);

    // Bob by name, as an observer; a link, as a controller (carol opens it).
    let by_name = share(
        &base,
        &gw.token("alice"),
        &s,
        json!({"role": "observer", "user": "bob"}),
    )
    .await;
    assert!(
        by_name.get("token").is_none(),
        "a share by name has no token: {by_name}"
    );
    let link = share(&base, &gw.token("alice"), &s, json!({"role": "controller"})).await;
    let token = link["token"].as_str().expect("a link's token").to_string();
    let (status, opened) = call(
        &base,
        &gw.token("carol"),
        reqwest::Method::POST,
        "/api/shares/redeem",
        Some(json!({ "token": token })),
    )
    .await;
    assert_eq!(status, 200, "{opened}");
    assert_eq!(opened["sessionId"], s.as_str());
    assert_eq!(opened["role"], "controller");
    let (status, _) = call(
        &base,
        &gw.token("dave"),
        reqwest::Method::POST,
        "/api/shares/redeem",
        Some(json!({ "token": format!("{token}x") })),
    )
    .await;
    assert_eq!(status, 404, "a wrong token opens nothing");
    // The owner's list: both shares, the link opened once, no token in it.
    let (status, listed) = call(
        &base,
        &gw.token("alice"),
        reqwest::Method::GET,
        &format!("/api/sessions/{s}/shares"),
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(listed["shares"].as_array().map(Vec::len), Some(2), "{listed}");
    assert!(!listed.to_string().contains(&token));
    assert_eq!(listed["shares"][1]["members"], 1, "{listed}");
    // Nobody else may list or revoke them.
    let (status, _) = call(
        &base,
        &gw.token("bob"),
        reqwest::Method::GET,
        &format!("/api/sessions/{s}/shares"),
        None,
    )
    .await;
    assert_eq!(status, 404);
    let (status, shared) = call(&base, &gw.token("bob"), reqwest::Method::GET, "/api/shared", None).await;
    assert_eq!(status, 200);
    assert_eq!(shared["sessions"][0]["sessionId"], s.as_str(), "{shared}");
    assert_eq!(shared["sessions"][0]["owner"], "alice");
    assert_eq!(shared["sessions"][0]["title"], "Pairing");

    // Bob observes: the whole history first.
    let a = attach(&mut bob, &s, json!({})).await;
    assert_eq!(a["result"]["role"], "observer", "{a}");
    assert_eq!(a["result"]["_meta"]["gateway"]["owner"], "alice");
    let replayed = bob.take_updates(&s);
    assert_eq!(replayed.len(), history.len());
    assert_eq!(
        replayed.iter().map(seq).collect::<Vec<_>>(),
        history.iter().map(seq).collect::<Vec<_>>()
    );
    let asked_controller = attach(&mut bob, &s, json!({"role": "controller"})).await;
    assert!(asked_controller.get("error").is_some(), "{asked_controller}");
    // What an observer may not do, each tried.
    let p = bob.prompt(&s, "observer's prompt").await;
    assert_eq!(p["error"]["data"]["reason"], "observer", "{p}");
    for (method, params) in [
        ("session/set_mode", json!({"sessionId": s, "modeId": "x"})),
        ("session/set_model", json!({"sessionId": s, "modelId": "x"})),
        (
            "session/set_config_option",
            json!({"sessionId": s, "configId": "x", "value": "y"}),
        ),
        (
            "_gateway/queue/add",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": "later"}]}),
        ),
    ] {
        let m = bob.request(method, params).await;
        assert_eq!(m["error"]["data"]["reason"], "observer", "{method}: {m}");
    }
    for method in ["session/load", "session/fork", "session/delete"] {
        let r = bob
            .request(
                method,
                json!({"sessionId": s, "cwd": bob.root.clone(), "mcpServers": []}),
            )
            .await;
        assert_eq!(r["error"]["code"], -32002, "{method}: {r}");
    }
    let (status, _) = call(
        &base,
        &gw.token("bob"),
        reqwest::Method::GET,
        &format!("/api/sessions/{s}/export?format=jsonl"),
        None,
    )
    .await;
    assert_eq!(status, 404, "an observer cannot export");

    // Alice's turn asks a permission: bob sees the turn live but is not asked; his cancel and
    // his answer to the id he would have been asked under do nothing.
    let turn = alice
        .start(
            "session/prompt",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": "second [permission] [chunks=2]"}]}),
        )
        .await;
    let ask = alice.wait_for(is_permission).await;
    let live = bob
        .updates_until(&s, |u| u["params"]["update"]["sessionUpdate"] == "tool_call")
        .await;
    assert!(seq(&live[0]) > seq(replayed.last().expect("history")));
    bob.send(json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": s}}))
        .await;
    bob.send(json!({"jsonrpc": "2.0", "id": 0, "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}}))
        .await;
    let option = ask["params"]["options"][0]["optionId"].clone();
    alice
        .send(json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"outcome": {"outcome": "selected", "optionId": option}}}))
        .await;
    let done = alice.answer(turn).await;
    assert_eq!(
        done["result"]["stopReason"], "end_turn",
        "an observer's cancel is ignored: {done}"
    );
    let seen = bob
        .updates_until(&s, |u| u["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .await;
    assert!(!seen.is_empty());
    assert!(
        !bob.inbox.iter().any(is_permission),
        "an observer is never asked: {:?}",
        bob.inbox
    );

    // Carol, a controller by link, prompts; alice sees her turn live.
    let mut carol = gw.client("carol").await;
    let a = attach(&mut carol, &s, json!({"historyPolicy": "none"})).await;
    assert_eq!(a["result"]["role"], "controller", "{a}");
    assert!(carol.take_updates(&s).is_empty(), "historyPolicy none replays nothing");
    let r = carol.prompt(&s, "carol here [chunks=1]").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    alice
        .updates_until(&s, |u| {
            u["params"]["update"]["sessionUpdate"] == "user_message_chunk"
                && u["params"]["update"]["content"]["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("carol here"))
        })
        .await;

    // Revoked: bob's socket closes at once, and he is a stranger again.
    let started = Instant::now();
    assert_eq!(revoke(&base, &gw.token("alice"), &s, &by_name).await, 204);
    assert_eq!(closed_with(&mut bob).await, Some(1008));
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "closed after {took:?}");
    let mut bob = gw.client("bob").await;
    let again = attach(&mut bob, &s, json!({})).await;
    assert_eq!(
        again["error"], unknown["error"],
        "a revoked share answers like an unknown id"
    );

    // Expiry: erin's share lasts a second; her socket closes when it ends.
    share(
        &base,
        &gw.token("alice"),
        &s,
        json!({"role": "observer", "user": "erin", "expiresInSecs": 1}),
    )
    .await;
    let mut erin = gw.client("erin").await;
    let a = attach(&mut erin, &s, json!({"historyPolicy": "pending_only"})).await;
    assert_eq!(a["result"]["role"], "observer", "{a}");
    assert_eq!(closed_with(&mut erin).await, Some(1008));
    let mut erin = gw.client("erin").await;
    let r = attach(&mut erin, &s, json!({})).await;
    assert_eq!(
        r["error"]["code"], -32002,
        "an expired share answers like an unknown id: {r}"
    );

    // A link's token is not in the database, only its hash.
    if gw.db_url.starts_with("sqlite:") {
        for entry in std::fs::read_dir(gw.dir().path()).expect("dir").flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if name.starts_with("gw.db") {
                let bytes = std::fs::read(entry.path()).expect("read");
                assert!(
                    !bytes.windows(token.len()).any(|w| w == token.as_bytes()),
                    "{name} holds the link token"
                );
            }
        }
    }

    // The audit log has it all (entries are written a moment after they happen).
    let expected = [
        ("alice", "share_create", "ok"),
        ("carol", "share_redeem", "ok"),
        ("dave", "share_redeem", "refused"),
        ("bob", "session_attach", "ok"),
        ("bob", "share_refused", "refused"),
        ("alice", "share_revoke", "ok"),
        ("bob", "share_ended", "ok"),
        ("erin", "share_ended", "ok"),
    ];
    let deadline = Instant::now() + WAIT;
    loop {
        let actions: Vec<(String, String, String)> = gw
            .gw
            .audit
            .page(&acp_gateway::audit::AuditFilter {
                limit: 500,
                ..Default::default()
            })
            .await
            .expect("audit")
            .into_iter()
            .map(|e| (e.actor, e.action, e.outcome))
            .collect();
        let missing: Vec<_> = expected
            .iter()
            .filter(|(actor, action, outcome)| {
                !actions
                    .iter()
                    .any(|(a, b, c)| a == actor && b == action && c == outcome)
            })
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "not audited: {missing:?} in {actions:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.stop().await;
}

#[tokio::test]
async fn observer_and_controller_sqlite() {
    observer_and_controller(Db::Sqlite).await;
}

#[tokio::test]
async fn observer_and_controller_postgres() {
    observer_and_controller(Db::Postgres).await;
}

/// A viewer on replica B of a session served by replica A sees its turns live; a controller on B
/// prompts it (served on A); the viewer is closed when the owner revokes its share on A. A
/// controller's prompt right after its share is revoked on A is refused, and a message it queued
/// through B is not sent when the turn ends after the revoke.
#[tokio::test]
async fn a_viewer_on_another_replica_sees_it_live_until_revoked() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().canonicalize().expect("canon");
    std::fs::create_dir_all(dir.join("work")).expect("workspace");
    let db_url = common::pg::fresh_database().await;
    let config = |name: &str| {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(
            &path,
            format!(
                "data_dir = {:?}\nreplica_id = {name:?}\nworkspace_roots = [{:?}]\n\
                 [agents.default]\ncommand = {:?}\nargs = [\"demo-agent\", \"--delay-us\", \"0\"]\nsandbox = \"none\"\n",
                dir.join(name).display().to_string(),
                dir.join("work").display().to_string(),
                common::gateway_bin(),
            ),
        )
        .expect("config");
        path
    };
    let a = ServeProcess::start(&config("a"), &db_url, SECRET).await;
    let b = ServeProcess::start(&config("b"), &db_url, SECRET).await;
    let mut alice = a.client("alice").await;
    let s = alice.new_session().await;
    let r = alice.prompt(&s, "hello [chunks=2]").await;
    assert_eq!(r["result"]["stopReason"], "end_turn");
    alice.take_updates(&s);
    let made = share(
        &http_base(&a.ws_url()),
        &a.token("alice"),
        &s,
        json!({"role": "observer", "user": "bob"}),
    )
    .await;

    let mut bob = b.client("bob").await;
    let at = attach(&mut bob, &s, json!({})).await;
    assert_eq!(at["result"]["role"], "observer", "{at}");
    let before = bob.take_updates(&s);
    let last = before.last().map(seq).expect("history");
    let r = alice.prompt(&s, "live [chunks=5]").await;
    assert_eq!(r["result"]["stopReason"], "end_turn");
    let on_a = alice.take_updates(&s);
    let on_b = bob
        .updates_until(&s, |u| seq(u) >= on_a.last().map(seq).unwrap_or(u64::MAX))
        .await;
    let seqs: Vec<u64> = on_b.iter().map(seq).filter(|n| *n > last).collect();
    assert_eq!(
        seqs,
        on_a.iter().map(seq).collect::<Vec<_>>(),
        "B's viewer got A's turn once, in order"
    );

    // A controller on B prompts the session A serves: the prompt goes to A, the answer comes back.
    let carols = share(
        &http_base(&a.ws_url()),
        &a.token("alice"),
        &s,
        json!({"role": "controller", "user": "carol"}),
    )
    .await;
    let mut carol = b.client("carol").await;
    let at = attach(&mut carol, &s, json!({"historyPolicy": "none"})).await;
    assert_eq!(at["result"]["role"], "controller", "{at}");
    let r = carol.prompt(&s, "from B [chunks=1]").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    alice
        .updates_until(&s, |u| {
            u["params"]["update"]["content"]["text"]
                .as_str()
                .is_some_and(|t| t.contains("you said: from B"))
        })
        .await;

    let started = Instant::now();
    assert_eq!(revoke(&http_base(&a.ws_url()), &a.token("alice"), &s, &made).await, 204);
    assert_eq!(closed_with(&mut bob).await, Some(1008));
    assert!(started.elapsed() < WAIT);
    eprintln!("revoked on A; B closed its viewer after {:?}", started.elapsed());

    // Carol's share is revoked on A, and she prompts through B at once, before B's watcher can
    // have noticed: refused (B asks the store before each teammate's prompt, and A again before
    // running it), or B closed her first.
    assert_eq!(
        revoke(&http_base(&a.ws_url()), &a.token("alice"), &s, &carols).await,
        204
    );
    let id = carol
        .start(
            "session/prompt",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": "after the revoke"}]}),
        )
        .await;
    loop {
        match carol.recv_raw().await {
            None => break,
            Some(m) if m["id"] == id => {
                assert_eq!(m["error"]["code"], -32002, "refused as an unknown session: {m}");
                break;
            }
            Some(_) => {}
        }
    }
    assert!(
        !stored_text(&a, &s, "after the revoke").await,
        "a revoked teammate's prompt reached the owner's agent"
    );

    // Carol, a controller again, queues a message through B while alice's turn waits on A; the
    // share is revoked on A, where nobody watches carol: when the turn ends, A checks her share
    // before sending it, and does not.
    let again = share(
        &http_base(&a.ws_url()),
        &a.token("alice"),
        &s,
        json!({"role": "controller", "user": "carol"}),
    )
    .await;
    let turn = alice
        .start(
            "session/prompt",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": "hold [permission]"}]}),
        )
        .await;
    let ask = alice.wait_for(|m| m["method"] == "session/request_permission").await;
    let mut carol = b.client("carol").await;
    let at = attach(&mut carol, &s, json!({"historyPolicy": "none"})).await;
    assert_eq!(at["result"]["role"], "controller", "{at}");
    let r = carol
        .request(
            "_gateway/queue/add",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": "queued on B"}]}),
        )
        .await;
    assert!(r["result"]["id"].is_u64(), "{r}");
    let queued_on_b =
        |m: &Value| m["method"] == "_gateway/queue" && m["params"]["queue"][0]["prompt"][0]["text"] == "queued on B";
    alice.wait_for(queued_on_b).await;
    assert_eq!(
        revoke(&http_base(&a.ws_url()), &a.token("alice"), &s, &again).await,
        204
    );
    alice
        .send(json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}}))
        .await;
    assert_eq!(alice.answer(turn).await["result"]["stopReason"], "end_turn");
    alice
        .wait_for(|m| {
            m["method"] == "_gateway/queue"
                && m["params"]["running"] == false
                && m["params"]["queue"].as_array().is_some_and(Vec::is_empty)
        })
        .await;
    assert!(
        !stored_text(&a, &s, "queued on B").await,
        "a revoked teammate's queued message reached the owner's agent"
    );
}

/// Security review F4: a controller runs the owner's agent, so its role is always named (a share
/// without one is refused), and a controller link nobody gave an end to lasts a day (shares by
/// name and observer links last until revoked, as asked). `ownerKeys` is for controllers only.
#[tokio::test]
async fn a_controller_link_is_asked_for_and_ends_within_a_day() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let base = gw.http_url("");
    let token = gw.token("alice");
    let mut alice = gw.client("alice").await;
    let s = alice.new_session().await;
    let path = format!("/api/sessions/{s}/shares");
    let post = |body: Value| call(&base, &token, reqwest::Method::POST, &path, Some(body));

    let (status, _) = post(json!({"user": "bob"})).await;
    assert!((400..500).contains(&status), "a share without a role: {status}");

    let before = acp_gateway::store::now_micros();
    let link = share(&base, &token, &s, json!({"role": "controller"})).await;
    let by_name = share(&base, &token, &s, json!({"role": "controller", "user": "bob"})).await;
    let observers = share(&base, &token, &s, json!({"role": "observer"})).await;
    let asked = share(&base, &token, &s, json!({"role": "controller", "expiresInSecs": 3600})).await;
    let after = acp_gateway::store::now_micros();
    let rows = gw.gw.shares.list("alice", &s).await.expect("list");
    let ends = |made: &Value| {
        let id = made["share"]["id"].as_str().expect("id");
        rows.iter().find(|r| r.id == id).expect("listed").expires_at
    };
    const DAY: i64 = 24 * 3600 * 1_000_000;
    let link_ends = ends(&link).expect("a controller link ends");
    assert!(
        (before + DAY..=after + DAY).contains(&link_ends),
        "a day after it was made: {link_ends}"
    );
    assert_eq!(ends(&by_name), None, "a share by name lasts until revoked");
    assert_eq!(ends(&observers), None, "an observer link lasts until revoked");
    let asked_ends = ends(&asked).expect("asked for an hour");
    assert!(asked_ends <= after + 3_600_000_000, "{asked_ends}");

    // Lending the owner's keys is for controllers, and said in the list.
    let (status, refused) = post(json!({"role": "observer", "ownerKeys": true})).await;
    assert_eq!(status, 400, "an observer never prompts: {refused}");
    let lends = share(
        &base,
        &token,
        &s,
        json!({"role": "controller", "user": "carol", "ownerKeys": true}),
    )
    .await;
    assert_eq!(lends["share"]["ownerKeys"], true, "{lends}");
    assert_eq!(link["share"]["ownerKeys"], false, "{link}");
    gw.stop().await;
}

const KEYS_AGENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/keys_agent.py");
const PROBE_AGENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/probe_agent.py");

/// `made` (a share's creation answer) of `session` revoked by alice on `gw`.
async fn revoke_on(gw: &TestGateway, session: &str, made: &Value) {
    assert_eq!(revoke(&gw.http_url(""), &gw.token("alice"), session, made).await, 204);
}

/// Whether `session`'s stored transcript (read as its owner alice) holds `text` anywhere.
async fn transcript_has(gw: &TestGateway, session: &str, text: &str) -> bool {
    let history = gw.client("alice").await.load(session).await;
    history.iter().any(|u| u.to_string().contains(text))
}

/// Security review F4: the agent keys an owner stored (given to their agent process as its
/// environment) are not lent to a controller. Carol's prompt on alice's keys agent is refused
/// (`owner_keys`), and so is a message she queues; a share that lends them (`ownerKeys`) lets her
/// prompt, and the agent answers with alice's key.
async fn a_controller_does_not_get_the_owners_stored_keys(db: Db) {
    let gw = TestGateway::start(db, |c| {
        c.agents
            .insert("default".into(), common::agent("/usr/bin/python3", &[KEYS_AGENT]));
    })
    .await;
    let (status, _) = gw_put_keys(&gw, "alice").await;
    assert_eq!(status, 204);
    let mut alice = gw.client("alice").await;
    let s = alice.new_session().await;
    let r = alice.prompt(&s, "alice asks").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "alice's key works: {r}");
    let base = gw.http_url("");
    let plain = share(
        &base,
        &gw.token("alice"),
        &s,
        json!({"role": "controller", "user": "carol"}),
    )
    .await;

    let mut carol = gw.client("carol").await;
    let at = attach(&mut carol, &s, json!({"historyPolicy": "none"})).await;
    assert_eq!(at["result"]["role"], "controller", "{at}");
    let r = carol.prompt(&s, "carol reads the key").await;
    assert_eq!(r["error"]["code"], -32600, "{r}");
    assert_eq!(r["error"]["data"]["reason"], "owner_keys", "{r}");
    assert_eq!(r["error"]["data"]["keys"], true, "{r}");
    assert!(
        r["error"]["message"].as_str().is_some_and(|m| m.contains("alice")),
        "{r}"
    );
    let q = carol
        .request(
            "_gateway/queue/add",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": "carol queues"}]}),
        )
        .await;
    assert_eq!(q["error"]["data"]["reason"], "owner_keys", "{q}");
    assert!(!transcript_has(&gw, &s, "carol reads the key").await);
    assert!(!transcript_has(&gw, &s, "carol queues").await);

    // Alice lends them: carol's prompt runs, with alice's key.
    share(
        &base,
        &gw.token("alice"),
        &s,
        json!({"role": "controller", "user": "carol", "ownerKeys": true}),
    )
    .await;
    let r = carol.prompt(&s, "carol, lent").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    assert!(transcript_has(&gw, &s, "carol, lent").await);
    revoke_on(&gw, &s, &plain).await;

    // Audited as carol's refusal, not alice's.
    let deadline = Instant::now() + WAIT;
    loop {
        let refused = gw
            .gw
            .audit
            .page(&acp_gateway::audit::AuditFilter {
                limit: 500,
                ..Default::default()
            })
            .await
            .expect("audit")
            .into_iter()
            .any(|e| {
                e.actor == "carol"
                    && e.action == "share_refused"
                    && e.detail.as_deref().is_some_and(|d| d.contains("owner_keys"))
            });
        if refused {
            break;
        }
        assert!(Instant::now() < deadline, "carol's refusal not audited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.stop().await;
}

async fn gw_put_keys(gw: &TestGateway, user: &str) -> (u16, Value) {
    call(
        &gw.http_url(""),
        &gw.token(user),
        reqwest::Method::PUT,
        "/api/agents/default/keys",
        Some(json!({"methodId": "openai-key", "vars": {"OPENAI_API_KEY": "sk-alice-secret-7421"}})),
    )
    .await
}

#[tokio::test]
async fn a_controller_does_not_get_the_owners_stored_keys_sqlite() {
    a_controller_does_not_get_the_owners_stored_keys(Db::Sqlite).await;
}

#[tokio::test]
async fn a_controller_does_not_get_the_owners_stored_keys_postgres() {
    a_controller_does_not_get_the_owners_stored_keys(Db::Postgres).await;
}

/// Security review F4: an owner's MCP server with a secret header, given to the session's agent,
/// is not lent to a controller either, and removing it from the owner's settings does not
/// make a difference while the agent still holds it.
#[tokio::test]
async fn a_controller_does_not_get_the_owners_mcp_headers() {
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.agents
            .insert("default".into(), common::agent("/usr/bin/python3", &[PROBE_AGENT]));
    })
    .await;
    let base = gw.http_url("");
    let (status, body) = call(
        &base,
        &gw.token("alice"),
        reqwest::Method::PUT,
        "/api/mcp-servers/tools",
        Some(json!({"type": "http", "url": "https://mcp.example.test/mcp",
                    "headers": [{"name": "Authorization", "value": "Bearer alice-s3cret"}]})),
    )
    .await;
    assert_eq!(status, 204, "{body}");
    let mut alice = gw.client("alice").await;
    let s = alice.new_session().await;
    share(
        &base,
        &gw.token("alice"),
        &s,
        json!({"role": "controller", "user": "carol"}),
    )
    .await;
    let mut carol = gw.client("carol").await;
    let at = attach(&mut carol, &s, json!({"historyPolicy": "none"})).await;
    assert_eq!(at["result"]["role"], "controller", "{at}");
    let r = carol.prompt(&s, "carol calls the tools").await;
    assert_eq!(r["error"]["data"]["reason"], "owner_keys", "{r}");
    assert_eq!(r["error"]["data"]["mcpHeaders"], true, "{r}");

    // Removed from alice's settings: the agent was still given it for this session.
    let (status, _) = call(
        &base,
        &gw.token("alice"),
        reqwest::Method::DELETE,
        "/api/mcp-servers/tools",
        None,
    )
    .await;
    assert_eq!(status, 204);
    let r = carol.prompt(&s, "carol calls the tools again").await;
    assert_eq!(r["error"]["data"]["reason"], "owner_keys", "{r}");
    // A new session of alice's carries nothing of hers: carol may prompt it.
    let s2 = alice.new_session().await;
    share(
        &base,
        &gw.token("alice"),
        &s2,
        json!({"role": "controller", "user": "carol"}),
    )
    .await;
    attach(&mut carol, &s2, json!({"historyPolicy": "none"})).await;
    let r = carol.prompt(&s2, "carol, no secrets here").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    assert!(!transcript_has(&gw, &s, "carol calls the tools").await);
    gw.stop().await;
}

/// A message a controller queued while a share lent the owner's secrets is not sent once no
/// share of theirs does: checked again when its turn comes (here: a stdio MCP server whose
/// environment holds a token, given at the session's start). The owner's tabs are told why.
#[tokio::test]
async fn a_controllers_queued_message_is_checked_again_when_its_turn_comes() {
    let gw = TestGateway::start(Db::Sqlite, |c| {
        if let Some(a) = c.agents.get_mut("default") {
            a.allowed_stdio_mcp = vec!["/bin/true".into()];
        }
    })
    .await;
    let base = gw.http_url("");
    let mut alice = gw.client("alice").await;
    let cwd = alice.root.clone();
    let r = alice
        .request(
            "session/new",
            json!({"cwd": cwd, "mcpServers": [{"name": "t", "command": "/bin/true", "args": [],
                    "env": [{"name": "TOKEN", "value": "alice-token"}]}]}),
        )
        .await;
    let s = r["result"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"))
        .to_string();
    let lending = share(
        &base,
        &gw.token("alice"),
        &s,
        json!({"role": "controller", "user": "carol", "ownerKeys": true}),
    )
    .await;
    let mut carol = gw.client("carol").await;
    let at = attach(&mut carol, &s, json!({"historyPolicy": "none"})).await;
    assert_eq!(at["result"]["role"], "controller", "{at}");

    let turn = alice
        .start(
            "session/prompt",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": "hold [permission]"}]}),
        )
        .await;
    let ask = alice.wait_for(is_permission).await;
    let q = carol
        .request(
            "_gateway/queue/add",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": "carol queued"}]}),
        )
        .await;
    assert!(q["result"]["id"].is_u64(), "lent, so queued: {q}");
    // Still a controller, no longer lent anything.
    share(
        &base,
        &gw.token("alice"),
        &s,
        json!({"role": "controller", "user": "carol"}),
    )
    .await;
    revoke_on(&gw, &s, &lending).await;
    alice
        .send(json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}}))
        .await;
    assert_eq!(alice.answer(turn).await["result"]["stopReason"], "end_turn");
    let told = alice
        .wait_for(|m| {
            m["method"] == "_gateway/queue"
                && m["params"]["queue"].as_array().is_some_and(Vec::is_empty)
                && m["params"]["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("carol's queued message was not sent"))
        })
        .await;
    assert_eq!(told["params"]["running"], false, "{told}");
    assert!(!transcript_has(&gw, &s, "carol queued").await);
    gw.stop().await;
}

/// Ended shares are purged by the gateway itself (security review: their rows stayed until the
/// session's next share): one that ended before a start is gone soon after it.
#[tokio::test]
async fn a_gateway_purges_ended_shares() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut alice = gw.client("alice").await;
    let s = alice.new_session().await;
    let now = acp_gateway::store::now_micros();
    let ended = now - 1_000_000;
    let shares = |url: String| async move {
        let db = acp_gateway::store::open(&url, None)
            .await
            .expect("open the database")
            .db;
        acp_gateway::sharing::ShareStore::new(db)
    };
    let store = shares(gw.db_url.clone()).await;
    let made = store
        .create(
            &acp_gateway::sharing::NewShare {
                id: "shr_ended",
                session_id: &s,
                owner: "alice",
                grantee: Some("bob"),
                token_hash: None,
                role: "controller",
                created_at: ended - 1_000_000,
                expires_at: Some(ended),
                owner_keys: false,
            },
            32,
        )
        .await
        .expect("create_share");
    assert!(made);
    let rows = |store: acp_gateway::sharing::ShareStore, s: String| async move {
        store.of_session("alice", &s, ended - 1).await.expect("shares").len()
    };
    assert_eq!(rows(store.clone(), s.clone()).await, 1, "kept until purged");
    let (dir, url) = (gw.dir().clone(), gw.db_url.clone());
    alice.close().await;
    gw.stop().await;

    let gw = TestGateway::start_in(dir, Db::Url(url.clone()), |_| {}).await;
    let store = shares(url).await;
    let deadline = Instant::now() + WAIT;
    while rows(store.clone(), s.clone()).await > 0 {
        assert!(Instant::now() < deadline, "the ended share is still stored");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.stop().await;
}

/// An owner's queued message a controller rewrote is the controller's: when their share is
/// revoked it leaves the queue with their own, instead of going to the owner's agent in the
/// owner's name with the controller's words.
#[tokio::test]
async fn an_owners_queued_message_a_controller_rewrote_goes_with_their_share() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let base = gw.http_url("");
    let mut alice = gw.client("alice").await;
    let s = alice.new_session().await;
    let carols = share(
        &base,
        &gw.token("alice"),
        &s,
        json!({"role": "controller", "user": "carol"}),
    )
    .await;
    let mut carol = gw.client("carol").await;
    let at = attach(&mut carol, &s, json!({"historyPolicy": "none"})).await;
    assert_eq!(at["result"]["role"], "controller", "{at}");
    let turn = alice
        .start(
            "session/prompt",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": "hold [permission]"}]}),
        )
        .await;
    let ask = alice.wait_for(is_permission).await;
    let q = alice
        .request(
            "_gateway/queue/add",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": "alice's words"}]}),
        )
        .await;
    let queued = q["result"]["id"].as_u64().unwrap_or_else(|| panic!("{q}"));
    let e = carol
        .request(
            "_gateway/queue/edit",
            json!({"sessionId": s, "id": queued, "prompt": [{"type": "text", "text": "carol's words"}]}),
        )
        .await;
    assert!(e.get("result").is_some(), "{e}");
    assert_eq!(revoke(&base, &gw.token("alice"), &s, &carols).await, 204);
    assert_eq!(closed_with(&mut carol).await, Some(1008));
    alice
        .wait_for(|m| m["method"] == "_gateway/queue" && m["params"]["queue"].as_array().is_some_and(Vec::is_empty))
        .await;
    alice
        .send(json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}}))
        .await;
    assert_eq!(alice.answer(turn).await["result"]["stopReason"], "end_turn");
    assert!(!transcript_has(&gw, &s, "carol's words").await);
    gw.stop().await;
}

/// Waits until the audit log of `gw` holds a `share_refused` of `actor`'s whose detail names
/// `method`.
async fn refusal_audited(gw: &TestGateway, actor: &str, method: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let found = gw
            .gw
            .audit
            .page(&acp_gateway::audit::AuditFilter {
                limit: 500,
                ..Default::default()
            })
            .await
            .expect("audit")
            .into_iter()
            .any(|e| {
                e.actor == actor
                    && e.action == "share_refused"
                    && e.detail.as_deref().is_some_and(|d| d.contains(method))
            });
        if found {
            return;
        }
        assert!(Instant::now() < deadline, "{actor}'s {method} refusal not audited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The replica serving a session checks a teammate's share again for what another replica passes
/// on, and audits a refusal in the teammate's name: a prompt (it was refused, unaudited) and a
/// cancel (it went on as the owner's, unchecked). Sent here through the bus as another replica
/// would, for mallory, whom no share lets in: the prompt is refused, the owner's turn runs on.
#[tokio::test]
async fn the_serving_replica_checks_a_relayed_teammate_and_audits_them() {
    use acp_gateway::replica::Message;
    let gw = TestGateway::start(Db::Postgres, |_| {}).await;
    let replica = gw.gw.life.bus.clone().expect("a replica on Postgres");
    let mut alice = gw.client("alice").await;
    let s = alice.new_session().await;
    let turn = alice
        .start(
            "session/prompt",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": "hold [permission]"}]}),
        )
        .await;
    let ask = alice.wait_for(is_permission).await;

    let cancel = Message::Notify {
        session: s.clone(),
        user: "alice".into(),
        teammate: Some("mallory".into()),
        method: "session/cancel".into(),
        params: json!({"sessionId": s}).to_string(),
    };
    replica.send(&replica.id, &cancel).await.expect("send");
    refusal_audited(&gw, "mallory", "session/cancel").await;

    let (reply, answer) = replica.expect_answer();
    let prompt = Message::Request {
        from: replica.id.to_string(),
        reply,
        session: s.clone(),
        user: "alice".into(),
        teammate: Some("mallory".into()),
        method: "session/prompt".into(),
        params: json!({"sessionId": s, "prompt": [{"type": "text", "text": "mallory relayed"}]}).to_string(),
        client_id: "7".into(),
    };
    replica.send(&replica.id, &prompt).await.expect("send");
    let answered: Value = serde_json::from_str(&answer.await.expect("answered").frame).expect("json");
    assert_eq!(answered["error"]["code"], -32002, "{answered}");
    refusal_audited(&gw, "mallory", "session/prompt").await;

    alice
        .send(json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}}))
        .await;
    let done = alice.answer(turn).await;
    assert_eq!(
        done["result"]["stopReason"], "end_turn",
        "mallory's cancel stopped nothing: {done}"
    );
    assert!(!transcript_has(&gw, &s, "mallory relayed").await);
    gw.stop().await;
}
