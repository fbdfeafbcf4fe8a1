//! Terminal sign-ins (`GET /api/agents/{agent}/login/terminal?method=ID`): a `terminal` method's
//! login program runs for one user, in their sandbox with their `HOME`, in a pseudo-terminal
//! bridged over a WebSocket; bounded in time and bytes; killed with its process group however it
//! ends. Real gateway, real agent (tests/agents/terminal_login_agent.py), real bubblewrap.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use acp_gateway::infra::config::{AgentConfig, Config, NetworkMode, SandboxMode};
use common::{Db, TestGateway, WAIT, eventually, processes_matching};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

const AGENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/terminal_login_agent.py");

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A marker no other test's processes carry.
fn marker() -> String {
    format!("signin-mark-{}", uuid::Uuid::new_v4().simple())
}

/// A gateway whose agent `term` is the login agent (sandboxed) and whose agent `shared` is the
/// same agent shared between users.
async fn gateway(marker: &str, tweak: impl FnOnce(&mut Config)) -> (TestGateway, PathBuf) {
    let mut data = PathBuf::new();
    let gw = TestGateway::start(Db::Sqlite, |c| {
        data = c.data_dir.canonicalize().expect("data dir");
        std::fs::write(data.join("planted-secret"), "s3cret").expect("plant");
        let term = AgentConfig {
            command: "/usr/bin/python3".into(),
            args: vec![AGENT.into()],
            env: BTreeMap::from([
                ("MARKER".to_string(), marker.to_string()),
                (
                    "PROBE_PATH".to_string(),
                    data.join("planted-secret").display().to_string(),
                ),
            ]),
            sandbox: SandboxMode::Bwrap,
            ..Default::default()
        };
        let mut shared = term.clone();
        shared.pool.share_between_users = true;
        c.agents.insert("term".into(), term);
        c.agents.insert("shared".into(), shared);
        tweak(c);
    })
    .await;
    (gw, data)
}

fn url(gw: &TestGateway, agent: &str, method: &str) -> String {
    format!("ws://{}/api/agents/{agent}/login/terminal?method={method}", gw.addr)
}

/// Opens the sign-in socket, or the HTTP status it was refused with.
async fn open(gw: &TestGateway, user: Option<&str>, agent: &str, method: &str) -> Result<Ws, u16> {
    let mut req = url(gw, agent, method).into_client_request().expect("request");
    if let Some(user) = user {
        let value = format!("Bearer {}", gw.token(user)).parse().expect("header");
        req.headers_mut().insert("authorization", value);
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => Err(resp.status().as_u16()),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

/// The terminal's bytes until they contain `needle`.
async fn read_until(ws: &mut Ws, needle: &str) -> String {
    let mut seen = String::new();
    while !seen.contains(needle) {
        let next = tokio::time::timeout(WAIT, ws.next()).await;
        let Ok(Some(Ok(msg))) = next else {
            panic!("no more terminal bytes before {needle:?} ({next:?}); saw {seen:?}");
        };
        match msg {
            Message::Binary(b) => seen.push_str(&String::from_utf8_lossy(&b)),
            Message::Text(t) => panic!("control message before {needle:?}: {t}; saw {seen:?}"),
            _ => {}
        }
    }
    seen
}

/// The last word (a text frame), skipping terminal bytes; and how many bytes came before it.
async fn last_word(ws: &mut Ws) -> (Value, usize) {
    let mut bytes = 0;
    loop {
        let msg = tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("a frame in time")
            .expect("a last word before the end")
            .expect("frame");
        match msg {
            Message::Binary(b) => bytes += b.len(),
            Message::Text(t) => return (serde_json::from_str(&t).expect("json"), bytes),
            Message::Close(_) => panic!("closed without a last word"),
            _ => {}
        }
    }
}

/// Waits for the socket to end (a close frame or EOF).
async fn closed(ws: &mut Ws) {
    loop {
        match tokio::time::timeout(WAIT, ws.next()).await.expect("ends in time") {
            None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
            Some(Ok(_)) => {}
        }
    }
}

fn home(data: &Path, user: &str) -> PathBuf {
    data.join("homes").join(user)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signs_in_one_user_in_their_sandbox_and_recycles_their_processes() {
    let mark = marker();
    let (gw, data) = gateway(&mark, |_| {}).await;
    let pool = gw.gw.agents.pools.get("term").expect("term").clone();
    let alice: std::sync::Arc<str> = "alice".into();
    let bob: std::sync::Arc<str> = "bob".into();
    let alice_before = pool.process_for(&alice).await.expect("alice's process").pid;
    let bob_before = pool.process_for(&bob).await.expect("bob's process").pid;

    let started = std::time::Instant::now();
    let mut ws = open(&gw, Some("alice"), "term", "login").await.expect("upgrades");
    ws.send(Message::text(
        json!({"type": "resize", "cols": 100, "rows": 30}).to_string(),
    ))
    .await
    .expect("resize");
    let shown = read_until(&mut ws, "Paste code:").await;
    // In the sandbox, with alice's HOME, the browser's TERM, no SHELL, no gateway data.
    assert!(
        shown.contains(&format!("HOME={}", home(&data, "alice").display())),
        "{shown}"
    );
    assert!(shown.contains("TERM=xterm-256color"), "{shown}");
    assert!(shown.contains("SHELL-SET=False"), "{shown}");
    assert!(
        shown.contains("PROBE-READABLE=False"),
        "the gateway's data is hidden: {shown}"
    );
    ws.send(Message::binary(b"code-123\r".to_vec())).await.expect("code");
    let (word, _) = last_word(&mut ws).await;
    assert_eq!(word, json!({"type": "exit", "code": 0}));
    closed(&mut ws).await;
    eprintln!("sign-in end to end: {:?}", started.elapsed());

    let written = std::fs::read_to_string(home(&data, "alice").join(".login-ok")).expect("alice's credentials");
    assert_eq!(written.trim(), "code-123");
    assert!(
        !home(&data, "bob").join(".login-ok").exists(),
        "not in another user's home"
    );
    // Alice's process was recycled so new ones read the new credentials; Bob's is untouched.
    eventually("alice's process recycled", || !pool.pids().contains(&alice_before)).await;
    assert!(pool.pids().contains(&bob_before), "bob's process stays");
    let alice_after = pool.process_for(&alice).await.expect("a fresh process").pid;
    assert_ne!(alice_after, alice_before);
    eventually("nothing of the login left", || processes_matching(&mark).is_empty()).await;
    gw.stop().await;
}

/// The slirp4netns processes serving the sandboxes of `pids` (named by its `SANDBOX_PID`),
/// zombies left out.
fn slirps_serving(pids: &[u32]) -> Vec<u32> {
    processes_matching("slirp4netns")
        .into_iter()
        .filter(|s| {
            let stat = std::fs::read_to_string(format!("/proc/{s}/stat")).unwrap_or_default();
            let env = std::fs::read(format!("/proc/{s}/environ")).unwrap_or_default();
            let target = String::from_utf8_lossy(&env)
                .split('\0')
                .find_map(|v| v.strip_prefix("SANDBOX_PID=")?.parse::<u32>().ok());
            !stat
                .rsplit(')')
                .next()
                .unwrap_or_default()
                .trim_start()
                .starts_with('Z')
                && target.is_some_and(|t| pids.contains(&t))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_egress_only_agents_login_program_gets_the_same_network_and_it_ends_with_it() {
    let mark = marker();
    let (gw, _) = gateway(&mark, |c| {
        c.agents.get_mut("term").expect("term").network = NetworkMode::EgressOnly;
    })
    .await;
    let mut ws = open(&gw, Some("alice"), "term", "login").await.expect("upgrades");
    let shown = read_until(&mut ws, "Paste code:").await;
    // Its own namespace: loopback and slirp4netns's device, the way out through it.
    assert!(shown.contains("NET-DEVICES=lo,tap0\r"), "{shown}");
    assert!(shown.contains("DEFAULT-ROUTE=tap0\r"), "{shown}");
    // bubblewrap's processes carry the login program's command line.
    let login = processes_matching(&format!("login {mark}"));
    let slirps = slirps_serving(&login);
    assert_eq!(slirps.len(), 1, "one slirp4netns for the login's sandbox: {login:?}");
    ws.send(Message::binary(b"code-net\r".to_vec())).await.expect("code");
    assert_eq!(last_word(&mut ws).await.0, json!({"type": "exit", "code": 0}));
    eventually("the login's slirp4netns to end with it", || {
        slirps_serving(&login).is_empty()
    })
    .await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_without_meta_runs_the_agents_own_command() {
    let mark = marker();
    let (gw, data) = gateway(&mark, |_| {}).await;
    let mut ws = open(&gw, Some("carol"), "term", "plain").await.expect("upgrades");
    let shown = read_until(&mut ws, "Paste code:").await;
    assert!(
        shown.contains(&format!("HOME={}", home(&data, "carol").display())),
        "{shown}"
    );
    assert!(shown.contains("LOGIN-FLAVOUR=plain-env"), "the method's env: {shown}");
    ws.send(Message::binary(b"plain-code\n".to_vec())).await.expect("code");
    assert_eq!(last_word(&mut ws).await.0, json!({"type": "exit", "code": 0}));
    let written = std::fs::read_to_string(home(&data, "carol").join(".login-ok")).expect("credentials");
    assert_eq!(written.trim(), "plain-code");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_time_limit_kills_the_process_group() {
    let mark = marker();
    let (gw, _) = gateway(&mark, |c| c.signin.terminal_timeout_secs = 1).await;
    let started = std::time::Instant::now();
    let mut ws = open(&gw, Some("alice"), "term", "sleep").await.expect("upgrades");
    read_until(&mut ws, "sleeping").await;
    assert!(processes_matching(&mark).len() >= 2, "the program and its child run");
    let (word, _) = last_word(&mut ws).await;
    assert_eq!(word["type"], "error", "{word}");
    assert!(
        word["message"].as_str().expect("message").contains("longer than 1 s"),
        "{word}"
    );
    eventually("the whole group killed", || processes_matching(&mark).is_empty()).await;
    eprintln!("time limit (1 s) to a clean end: {:?}", started.elapsed());
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_over_the_cap_ends_it() {
    let mark = marker();
    let (gw, _) = gateway(&mark, |_| {}).await;
    let started = std::time::Instant::now();
    let mut ws = open(&gw, Some("alice"), "term", "flood").await.expect("upgrades");
    let (word, bytes) = last_word(&mut ws).await;
    assert_eq!(word["type"], "error", "{word}");
    assert!(word["message"].as_str().expect("message").contains("4 MiB"), "{word}");
    assert!(bytes <= 4 << 20, "no more than the cap reached the client: {bytes}");
    eventually("the flood killed", || processes_matching(&mark).is_empty()).await;
    eprintln!("output cap (4 MiB) to a clean end: {:?}", started.elapsed());
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_socket_or_cancelling_kills_the_process_group() {
    let mark = marker();
    let (gw, _) = gateway(&mark, |_| {}).await;
    let mut ws = open(&gw, Some("alice"), "term", "sleep").await.expect("upgrades");
    read_until(&mut ws, "sleeping").await;
    let started = std::time::Instant::now();
    drop(ws);
    eventually("the group killed when the socket went", || {
        processes_matching(&mark).is_empty()
    })
    .await;
    eprintln!("socket dropped to no process left: {:?}", started.elapsed());

    let mut ws = open(&gw, Some("alice"), "term", "sleep").await.expect("free again");
    read_until(&mut ws, "sleeping").await;
    ws.send(Message::text(r#"{"type":"cancel"}"#)).await.expect("cancel");
    let (word, _) = last_word(&mut ws).await;
    assert_eq!(word, json!({"type": "error", "message": "sign-in cancelled"}));
    eventually("the group killed on cancel", || processes_matching(&mark).is_empty()).await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_kills_the_process_group() {
    let mark = marker();
    let (gw, _) = gateway(&mark, |_| {}).await;
    let mut ws = open(&gw, Some("alice"), "term", "sleep").await.expect("upgrades");
    read_until(&mut ws, "sleeping").await;
    let stopping = tokio::spawn(gw.stop());
    let (word, _) = last_word(&mut ws).await;
    assert_eq!(word["message"], "the gateway is shutting down", "{word}");
    stopping.await.expect("stops");
    // Killed, not waited for: the sandbox's PID namespace ends a moment after its first process.
    eventually("nothing outlives the gateway", || processes_matching(&mark).is_empty()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_terminal_methods_of_known_agents_for_signed_in_users() {
    let mark = marker();
    let (gw, _) = gateway(&mark, |_| {}).await;
    assert_eq!(open(&gw, None, "term", "login").await.err(), Some(401), "no token");
    for (agent, method) in [
        ("nope", "login"),
        ("term", "forged"),
        ("term", "agent-login"),
        ("term", ""),
    ] {
        assert_eq!(
            open(&gw, Some("alice"), agent, method).await.err(),
            Some(404),
            "{agent} {method}"
        );
    }
    // A shared agent's processes carry the operator's credentials.
    assert_eq!(open(&gw, Some("alice"), "shared", "login").await.err(), Some(403));
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sign_in_at_a_time_per_user_and_agent() {
    let mark = marker();
    let (gw, _) = gateway(&mark, |_| {}).await;
    let mut first = open(&gw, Some("alice"), "term", "sleep").await.expect("upgrades");
    read_until(&mut first, "sleeping").await;
    assert_eq!(open(&gw, Some("alice"), "term", "login").await.err(), Some(409));
    let mut bob = open(&gw, Some("bob"), "term", "login").await.expect("another user may");
    read_until(&mut bob, "Paste code:").await;
    first.send(Message::text(r#"{"type":"cancel"}"#)).await.expect("cancel");
    last_word(&mut first).await;
    closed(&mut first).await;
    // Given back before the last word: free at once.
    let mut again = open(&gw, Some("alice"), "term", "login").await.expect("free again");
    read_until(&mut again, "Paste code:").await;
    gw.stop().await;
}

/// What a sign-in runs comes from a process no user shaped, never from the caller's own: a user
/// who shapes what their agent answers in `initialize` (here through a file in their HOME, as a
/// patched `npx` cache would) chooses nothing a sign-in runs, not even their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_user_chooses_what_a_sign_in_runs() {
    let mark = marker();
    let (gw, data) = gateway(&mark, |_| {}).await;
    let pool = gw.gw.agents.pools.get("term").expect("term").clone();
    let mallory: std::sync::Arc<str> = "mallory".into();
    std::fs::create_dir_all(home(&data, "mallory")).expect("home");
    std::fs::write(home(&data, "mallory").join("login-mode"), "sleep").expect("shape her agent");
    pool.process_for(&mallory)
        .await
        .expect("mallory's process, initialized last");
    for user in ["bob", "mallory"] {
        let mut ws = open(&gw, Some(user), "term", "login").await.expect("upgrades");
        let shown = read_until(&mut ws, "Paste code:").await;
        assert!(!shown.contains("sleeping"), "{user}: {shown}");
        ws.send(Message::binary(b"a-code\r".to_vec())).await.expect("code");
        assert_eq!(last_word(&mut ws).await.0, json!({"type": "exit", "code": 0}));
    }
    eventually("nothing of the logins left", || processes_matching(&mark).is_empty()).await;
    gw.stop().await;
}

/// An agent that offers what the security review's patched agent offered (a login program naming
/// the gateway's secret file, and `env` with `LD_PRELOAD` and `GCONV_PATH` aimed at the programs
/// that build the sandbox) gets neither: the command line is refused, naming the path; the
/// loader's variables reach no program, outside the sandbox or in it; the method's other
/// variables reach the login program.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_method_reads_nothing_and_runs_nothing_outside_the_sandbox() {
    let mark = marker();
    let mut secret = PathBuf::new();
    let (gw, _data) = gateway(&mark, |c| {
        secret = c.data_dir.canonicalize().expect("data").join("planted-secret");
        let term = c.agents.get_mut("term").expect("term");
        term.env.insert("HOSTILE_SECRET".into(), secret.display().to_string());
    })
    .await;
    let mut ws = open(&gw, Some("alice"), "term", "read").await.expect("upgrades");
    let (word, bytes) = last_word(&mut ws).await;
    assert_eq!(word["type"], "error", "{word}");
    let message = word["message"].as_str().expect("a message");
    assert!(
        message.contains(&secret.display().to_string()) && message.contains("never see"),
        "{message}"
    );
    assert_eq!(bytes, 0, "nothing ran");

    let mut ws = open(&gw, Some("alice"), "term", "preload").await.expect("upgrades");
    let shown = read_until(&mut ws, "TOKEN=method-env").await;
    let (word, _) = last_word(&mut ws).await;
    assert_eq!(word, json!({"type": "exit", "code": 0}), "{shown}");
    assert!(shown.contains("PRELOAD-SET=False"), "{shown}");
    // Where the loader had it (bubblewrap, or the program), it would have said so.
    assert!(!shown.contains("cannot be preloaded"), "{shown}");
    gw.stop().await;
}
