//! What a user's agent process can reach: environment, home, workspaces, MCP servers, `_meta`,
//! agent session ids, stderr, login, and the bubblewrap sandbox. Real gateway, real agent
//! processes (a probe agent that records what it sees), real WebSocket clients.

use crate::common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use acp_gateway::infra::config::{AgentConfig, Config, NetworkMode, SandboxMode};
use common::{Client, Db, TestGateway, eventually};
use serde_json::{Value, json};

const PROBE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/probe_agent.py");

/// The probe agent as the default agent, told to check `paths`.
fn use_probe(c: &mut Config, sandbox: SandboxMode, paths: &[PathBuf]) -> PathBuf {
    let dir = c.data_dir.canonicalize().expect("data dir");
    let joined: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    let probe = AgentConfig {
        // The interpreter itself, not a launcher script that adds variables of its own.
        command: "/usr/bin/python3".into(),
        args: vec![PROBE.into()],
        env: BTreeMap::from([("PROBE_PATHS".to_string(), joined.join(":"))]),
        pass_env: vec!["CARGO_PKG_NAME".into()],
        sandbox,
        ..Default::default()
    };
    c.agents.insert("default".into(), probe);
    dir
}

/// What the probe recorded at start in `user`'s home.
async fn probe_start(dir: &Path, user: &str) -> Value {
    let file = dir.join("homes").join(user).join("probe-start.json");
    eventually("the probe's report", || {
        std::fs::read_to_string(&file).is_ok_and(|t| serde_json::from_str::<Value>(&t).is_ok())
    })
    .await;
    serde_json::from_str(&std::fs::read_to_string(&file).expect("read")).expect("json")
}

/// Every line the gateway sent `user`'s probe.
fn probe_stdin(dir: &Path, user: &str) -> Vec<Value> {
    std::fs::read_to_string(dir.join("homes").join(user).join("probe-stdin.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).expect("metadata").permissions().mode() & 0o777
}

async fn environment_and_home(sandbox: SandboxMode) {
    let mut dir = PathBuf::new();
    let gw = TestGateway::start(Db::Sqlite, |c| {
        let data = c.data_dir.canonicalize().expect("data dir");
        std::fs::write(data.join("planted-secret"), "s3cret").expect("plant");
        let paths = [
            data.join("gw.db"),
            data.join("planted-secret"),
            data.join("homes/bob/probe-start.json"),
            PathBuf::from(format!("/proc/{}/environ", std::process::id())),
        ];
        dir = use_probe(c, sandbox, &paths);
    })
    .await;
    let sandboxed = gw.gw.agents.tenancy.sandboxed(sandbox);
    assert_eq!(
        sandboxed,
        sandbox != SandboxMode::None,
        "bubblewrap must work on the test host"
    );
    let mut bob = gw.client("bob").await;
    bob.new_session().await;
    probe_start(&dir, "bob").await;
    let mut alice = gw.client("alice").await;
    alice.new_session().await;
    let seen = probe_start(&dir, "alice").await;

    // Environment: the short list, the agent's env and pass_env, nothing else of ours.
    let env = seen["env"].as_object().expect("env");
    let allowed = [
        "PATH",
        "LANG",
        "LC_ALL",
        "TERM",
        "TZ",
        "HOME",
        "USER",
        "TMPDIR",
        "PROBE_PATHS",
        "CARGO_PKG_NAME",
        // bubblewrap names the directory it starts the agent in; it is not ours.
        "PWD",
    ];
    let extra: Vec<&String> = env.keys().filter(|k| !allowed.contains(&k.as_str())).collect();
    assert!(
        extra.is_empty(),
        "the agent saw more of the gateway's environment: {extra:?}"
    );
    assert_eq!(env["CARGO_PKG_NAME"], "acp-gateway", "pass_env copies named variables");
    if let Some(pwd) = env.get("PWD") {
        assert_eq!(pwd, &seen["cwd"], "PWD only ever names the agent's own cwd");
    }
    assert!(
        std::env::var_os("CARGO_MANIFEST_DIR").is_some() && !env.contains_key("CARGO_MANIFEST_DIR"),
        "a variable the gateway has and did not pass stays out"
    );
    assert!(
        !env.values()
            .any(|v| v.as_str().is_some_and(|v| v.contains(common::SECRET)))
    );

    // Home: the user's own, 0700; USER is the user; the cwd is the user's workspace root.
    let home = dir.join("homes/alice");
    assert_eq!(env["HOME"], home.display().to_string());
    assert_eq!(env["USER"], "alice");
    assert_eq!(mode(&home), 0o700);
    let root = dir.join("workspaces/alice");
    assert_eq!(mode(&root), 0o700);
    assert_eq!(seen["cwd"], root.display().to_string());
    if sandboxed {
        assert_eq!(env["TMPDIR"], "/tmp");
    } else {
        assert_eq!(env["TMPDIR"], home.join(".tmp").display().to_string());
    }

    // Files: only a sandbox hides the gateway's data and other users' homes (same OS user).
    let readable = seen["readable"].as_object().expect("readable");
    if sandboxed {
        assert!(
            readable.values().all(|r| r == false),
            "a sandboxed agent reads nothing of the gateway's or other users': {readable:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxed_agent_sees_its_own_home_and_nothing_of_the_gateway() {
    environment_and_home(SandboxMode::Bwrap).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsandboxed_agent_still_gets_a_clean_environment_and_its_own_home() {
    environment_and_home(SandboxMode::None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn working_directories_outside_the_users_roots_are_refused() {
    let mut dir = PathBuf::new();
    let gw = TestGateway::start(Db::Sqlite, |c| dir = use_probe(c, SandboxMode::Auto, &[])).await;
    let mut alice = gw.client("alice").await;
    let bob = gw.client("bob").await;
    let root = PathBuf::from(&alice.root);
    assert_eq!(root, dir.join("workspaces/alice"));
    let me: Value = reqwest::Client::new()
        .get(gw.http_url("/api/me"))
        .bearer_auth(gw.token("alice"))
        .send()
        .await
        .expect("http")
        .json()
        .await
        .expect("json");
    assert_eq!(me["workspaceRoots"], json!([alice.root]), "the web UI's default cwd");
    std::fs::create_dir_all(root.join("proj/src")).expect("mkdir");
    std::os::unix::fs::symlink("/etc", root.join("escape")).expect("symlink");
    std::os::unix::fs::symlink(root.join("proj"), root.join("inside")).expect("symlink");
    let bob_root = bob.root.clone();

    let refused = [
        "/etc".to_string(),
        "/".to_string(),
        format!("{}/../bob", alice.root),
        format!("{}/proj/../../../..", alice.root),
        format!("{}/escape", alice.root),
        format!("{}/escape/passwd", alice.root),
        bob_root.clone(),
        "relative/path".to_string(),
        dir.display().to_string(),
        // Not resolvable, and too long: refused the same way, naming the roots too.
        "/etc/passwd/x".to_string(),
        format!("{}/{}", alice.root, "x".repeat(5000)),
    ];
    for cwd in &refused {
        let r = alice
            .request("session/new", json!({"cwd": cwd, "mcpServers": []}))
            .await;
        assert_eq!(r["error"]["code"], -32602, "cwd {cwd}: {r}");
        let msg = r["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(&alice.root), "the error names the allowed roots: {msg}");
        let r = alice
            .request(
                "session/new",
                json!({"cwd": alice.root, "additionalDirectories": [cwd], "mcpServers": []}),
            )
            .await;
        assert_eq!(r["error"]["code"], -32602, "additionalDirectories {cwd}: {r}");
    }
    // None of them reached the agent.
    let asked: Vec<Value> = probe_stdin(&dir, "alice")
        .into_iter()
        .filter(|m| m["method"] == "session/new")
        .collect();
    assert!(asked.is_empty(), "refused requests reached the agent: {asked:?}");

    // Inside the root, resolved: `..` folded, a symlink inside followed.
    let r = alice
        .request(
            "session/new",
            json!({"cwd": format!("{}/proj/src/..", alice.root), "additionalDirectories": [format!("{}/inside/src", alice.root)], "mcpServers": []}),
        )
        .await;
    let sid = r["result"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"))
        .to_string();
    let asked: Vec<Value> = probe_stdin(&dir, "alice")
        .into_iter()
        .filter(|m| m["method"] == "session/new")
        .collect();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0]["params"]["cwd"], root.join("proj").display().to_string());
    assert_eq!(
        asked[0]["params"]["additionalDirectories"],
        json!([root.join("proj/src").display().to_string()])
    );
    // session/load and session/resume check theirs too.
    for method in ["session/load", "session/resume"] {
        let r = alice
            .request(method, json!({"sessionId": sid, "cwd": "/etc", "mcpServers": []}))
            .await;
        assert_eq!(r["error"]["code"], -32602, "{method}: {r}");
        let r = alice
            .request(method, json!({"sessionId": sid, "cwd": alice.root, "mcpServers": []}))
            .await;
        assert!(r.get("result").is_some(), "{method}: {r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_mcp_servers_need_the_allow_list_and_client_meta_is_filtered() {
    let mut dir = PathBuf::new();
    let gw = TestGateway::start(Db::Sqlite, |c| {
        dir = use_probe(c, SandboxMode::Auto, &[]);
        let mut allowed = c.agents["default"].clone();
        allowed.allowed_stdio_mcp = vec!["/bin/sh".into()];
        c.agents.insert("allowed".into(), allowed);
    })
    .await;
    let mut alice = gw.client("alice").await;
    let marker = dir.join("homes/alice/pwned");
    let stdio = json!({"name": "x", "command": "/bin/sh", "args": ["-c", "touch \"$HOME/pwned\""], "env": []});
    let r = alice
        .request("session/new", json!({"cwd": alice.root, "mcpServers": [stdio]}))
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap_or_default().contains("/bin/sh"),
        "{r}"
    );
    let sse = json!({"type": "sse", "name": "s", "url": "http://127.0.0.1:9/sse", "headers": []});
    let r = alice
        .request("session/new", json!({"cwd": alice.root, "mcpServers": [sse]}))
        .await;
    assert_eq!(r["error"]["code"], -32602, "the agent does not advertise sse: {r}");
    let http = json!({"type": "http", "name": "h", "url": "http://127.0.0.1:9/mcp", "headers": []});
    let meta = json!({
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "claudeCode": {"options": {"resume": "victim", "env": {"NODE_OPTIONS": "--require /tmp/x.js"}}},
    });
    let r = alice
        .request(
            "session/new",
            json!({"cwd": alice.root, "mcpServers": [http], "_meta": meta, "unknownOption": true}),
        )
        .await;
    let sid = r["result"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"))
        .to_string();
    let r = alice
        .request(
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}], "_meta": meta}),
        )
        .await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let lines = probe_stdin(&dir, "alice");
    let text = serde_json::to_string(&lines).expect("json");
    assert!(!text.contains("claudeCode") && !text.contains("NODE_OPTIONS"), "{text}");
    assert!(!text.contains("unknownOption"), "{text}");
    let new = lines
        .iter()
        .find(|m| m["method"] == "session/new")
        .expect("session/new");
    assert_eq!(new["params"]["_meta"], json!({"traceparent": meta["traceparent"]}));
    assert_eq!(new["params"]["mcpServers"], json!([http]));
    let prompt = lines.iter().find(|m| m["method"] == "session/prompt").expect("prompt");
    assert_eq!(prompt["params"]["_meta"], json!({"traceparent": meta["traceparent"]}));
    // An extension method is not forwarded unless the agent allows it.
    let r = alice.request("_probe/inspect", json!({"sessionId": sid})).await;
    assert_eq!(r["error"]["code"], -32601, "{r}");
    assert!(!marker.exists(), "the refused command never ran");

    // The same stdio server on an agent that allows its command does run: the refusal above is
    // what kept it from running.
    let mut c = Client::connect(&format!("{}?agent=allowed", gw.ws_url()), &gw.token("alice"))
        .await
        .expect("connect");
    c.initialize().await;
    let r = c
        .request("session/new", json!({"cwd": c.root, "mcpServers": [stdio]}))
        .await;
    assert!(r.get("result").is_some(), "{r}");
    eventually("the allowed MCP server to run", || marker.exists()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_session_id_bound_to_another_session_is_refused() {
    let gw = TestGateway::start(Db::Sqlite, |c| {
        use_probe(c, SandboxMode::Auto, &[]);
        let probe = c.agents.get_mut("default").expect("probe");
        probe.pool.share_between_users = true;
        probe.env.insert("PROBE_FIXED_SESSION_ID".into(), "the-one-id".into());
    })
    .await;
    let mut bob = gw.client("bob").await;
    let mut alice = gw.client("alice").await;
    let b = bob.new_session().await;
    let r = alice
        .request("session/new", json!({"cwd": alice.root, "mcpServers": []}))
        .await;
    assert_eq!(r["error"]["code"], -32603, "{r}");
    assert_eq!(
        gw.gw.agents.pools.get("default").expect("pool").process_count(),
        1,
        "one shared process"
    );
    let r = alice.request("session/list", json!({})).await;
    assert_eq!(r["result"]["sessions"], json!([]), "the refused session is not kept");
    assert_eq!(bob.prompt(&b, "bob's secret").await["result"]["stopReason"], "end_turn");
    let updates = bob.take_updates(&b);
    assert!(updates.iter().any(|u| u.to_string().contains("probe: bob's secret")));
    assert!(
        !alice.inbox.iter().any(|m| m.to_string().contains("bob's secret")),
        "alice got bob's updates: {:?}",
        alice.inbox
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_stderr_stays_in_the_log() {
    let gw = TestGateway::start(Db::Sqlite, |c| {
        let demo = c.agents.get_mut("default").expect("default");
        demo.args = vec![
            "-c".into(),
            format!(
                "echo SECRET=abc >&2; exec {} demo-agent --delay-us 0",
                common::gateway_bin()
            ),
        ];
        demo.command = "sh".into();
    })
    .await;
    let mut c = gw.client("alice").await;
    let s = c.new_session().await;
    let r = c.prompt(&s, "[crash]").await;
    assert_eq!(r["error"]["code"], -32603, "{r}");
    assert!(!r.to_string().contains("SECRET"), "{r}");
    let id = r["error"]["data"]["errorId"].as_str().unwrap_or_default();
    assert!(
        r["error"]["message"].as_str().is_some_and(|m| m.contains(id)) && !id.is_empty(),
        "{r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authenticate_logs_in_the_users_own_agent_only() {
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.agents
            .get_mut("default")
            .expect("default")
            .args
            .push("--require-auth".into());
    })
    .await;
    let mut alice = gw.client("alice").await;
    let mut bob = gw.client("bob").await;
    let new = json!({"cwd": alice.root, "mcpServers": []});
    let r = alice.request("session/new", new.clone()).await;
    assert_eq!(r["error"]["code"], -32000, "login required first: {r}");
    let r = alice.request("authenticate", json!({"methodId": "nope"})).await;
    assert!(
        r.get("error").is_some(),
        "an unknown method is the agent's to refuse: {r}"
    );
    let r = alice.request("authenticate", json!({"methodId": "demo-login"})).await;
    assert!(r.get("result").is_some(), "{r}");
    alice.new_session().await;
    let r = bob
        .request("session/new", json!({"cwd": bob.root, "mcpServers": []}))
        .await;
    assert_eq!(r["error"]["code"], -32000, "alice's login is not bob's: {r}");
    assert!(gw.dir().path().join("homes/alice/.acp-demo-agent/login").exists());
    assert!(!gw.dir().path().join("homes/bob/.acp-demo-agent/login").exists());
    // Both sign-ins are counted, by outcome.
    let metrics = acp_gateway::infra::telemetry::render_metrics();
    for outcome in ["ok", "failed"] {
        let series =
            format!(r#"acp_gateway_agent_signins_total{{agent="default",method_type="agent",outcome="{outcome}"}} "#);
        let count = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        assert!(count >= 1.0, "{series}: {count}");
    }
}

/// The real binary, started as an operator would from a shell: in a terminal of its own (its
/// controlling terminal, as under ssh, tmux or `cargo run`), with its JWT secret written in its
/// `--config` file. Its agent (the probe, with `sandbox`) tries to read that file and the
/// database, and to type a command into the terminal (`TIOCSTI`, the review's F1); the gateway is
/// then SIGKILLed and its agent must die with it.
async fn agent_under_an_operators_terminal(sandbox: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().canonicalize().expect("canon").join("data");
    let secret = format!("tenancy-secret-{}-0123456789abcdef", std::process::id());
    let marker = format!("probe-marker-{}-{sandbox}", std::process::id());
    // Outside /tmp (which a sandbox replaces with its own): where an operator keeps it.
    let config_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let config = config_dir.path().canonicalize().expect("canon").join("gw.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {data:?}\n[jwt]\nsecret = {secret:?}\n[agents.default]\ncommand = \"/usr/bin/python3\"\nargs = [{PROBE:?}, {marker:?}]\nsandbox = {sandbox:?}\n[agents.default.env]\nPROBE_PATHS = \"{}:{}\"\nPROBE_TIOCSTI = \"1\"\n",
            data.join("acp-gateway.db").display(),
            config.display(),
        ),
    )
    .expect("config");
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    // A terminal: the gateway is its session's leader with it as controlling terminal
    // (util-linux `setsid --ctty`), as an operator's shell would have made it.
    let pty = nix::pty::openpty(None, None).expect("a pseudo-terminal");
    let db = format!("sqlite://{}", data.join("acp-gateway.db").display());
    let mut gateway = tokio::process::Command::new("setsid")
        .arg("--ctty")
        .arg(common::gateway_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .env("DATABASE_URL", &db)
        .env_remove("ACP_GATEWAY_JWT_SECRET")
        .env_remove("ACP_GATEWAY_AGENT")
        .stdin(std::process::Stdio::from(pty.slave.try_clone().expect("dup")))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("gateway starts");
    let stdout = gateway.stdout.take().expect("stdout");
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let addr = tokio::time::timeout(common::WAIT, async {
        while let Some(line) = lines.next_line().await.expect("read") {
            if let Some(rest) = line.split("http://").nth(1) {
                return rest.split('/').next().expect("addr").to_string();
            }
        }
        panic!("the gateway never printed its address");
    })
    .await
    .expect("address in time");
    let auth = acp_gateway::identity::auth::Authenticator::from_config(
        &acp_gateway::infra::config::JwtConfig {
            secret: Some(secret.clone().into()),
            ..Default::default()
        },
        dir.path(),
    )
    .expect("auth");
    let token = auth.mint("alice", 600).expect("mint");
    let mut alice = Client::connect(&format!("ws://{addr}/acp"), &token)
        .await
        .expect("connect");
    alice.initialize().await;
    alice.new_session().await;
    let seen = probe_start(&data, "alice").await;
    let env = serde_json::to_string(&seen["env"]).expect("json");
    assert!(!env.contains(&secret), "the JWT secret reached the agent: {env}");
    assert!(!env.contains("DATABASE_URL") && !env.contains(&db), "{env}");
    // No terminal to type into: the agent is in a session of its own.
    let tiocsti = seen["tiocsti"].as_str().expect("tried");
    assert!(tiocsti.starts_with("no terminal"), "{tiocsti}");
    nix::fcntl::fcntl(&pty.slave, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK)).expect("non-blocking");
    let mut typed = [0u8; 256];
    assert_eq!(
        nix::unistd::read(&pty.slave, &mut typed),
        Err(nix::errno::Errno::EAGAIN),
        "nothing waits in the operator's terminal"
    );
    if sandbox == "bwrap" {
        let config_key = config.display().to_string();
        // Covered by /dev/null, which a sandbox cannot open (bubblewrap binds it `nodev`).
        assert_eq!(seen["sizes"][&config_key], -1, "the config file cannot be read: {seen}");
        assert_eq!(
            seen["readable"][data.join("acp-gateway.db").display().to_string()],
            false
        );
    }

    let agents = common::processes_matching(&marker);
    assert!(!agents.is_empty(), "the probe runs");
    gateway.start_kill().expect("SIGKILL the gateway");
    gateway.wait().await.expect("reaped");
    eventually("no agent process to outlive the gateway", || {
        common::processes_matching(&marker).is_empty()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxed_agent_never_sees_the_gateways_secrets_or_its_terminal_and_dies_with_it() {
    agent_under_an_operators_terminal("bwrap").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsandboxed_agent_has_no_terminal_either_and_dies_with_the_gateway() {
    agent_under_an_operators_terminal("none").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pretty_printed_client_message_reaches_the_agent_as_one_line() {
    let mut dir = PathBuf::new();
    let gw = TestGateway::start(Db::Sqlite, |c| dir = use_probe(c, SandboxMode::None, &[])).await;
    let mut alice = gw.client("alice").await;
    let sid = alice.new_session().await;
    let marker = dir.join("homes/alice/pwned");
    // JSON allows line breaks between tokens: copied byte for byte, the middle line would reach
    // the agent as a session/new of the client's own, with a stdio MCP server no check saw.
    let injected = json!({"jsonrpc": "2.0", "id": "x", "method": "session/new", "params": {
        "cwd": "/", "mcpServers": [{"name": "p", "command": "/usr/bin/touch", "args": [marker], "env": []}]}});
    let frame = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":900,\"method\":\"session/prompt\",\"params\":{{\"sessionId\":\"{sid}\",\"prompt\":[\r\n{{\"type\":\"text\",\"text\":\"hi\",\"x\":\n{injected}\n}}]}}}}"
    );
    alice.send_text(&frame).await;
    let r = alice.answer(900).await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let lines = probe_stdin(&dir, "alice"); // every line parses as JSON
    assert!(
        !lines.iter().any(|m| m["id"] == "x"),
        "an injected line reached the agent: {lines:?}"
    );
    let prompt = lines.iter().find(|m| m["method"] == "session/prompt").expect("prompt");
    assert_eq!(
        prompt["params"]["prompt"][0]["x"]["id"], "x",
        "the message itself is intact"
    );
    assert!(!marker.exists());
}

/// The host's IPv4 addresses other than loopback (a gateway listening on every address answers
/// on each).
fn host_addresses() -> Vec<std::net::Ipv4Addr> {
    nix::ifaddrs::getifaddrs()
        .expect("interfaces")
        .filter_map(|ifa| Some(ifa.address?.as_sockaddr_in()?.ip()))
        .filter(|ip| !ip.is_loopback())
        .collect()
}

/// Live slirp4netns processes started by this test process (the gateways of these tests run in
/// it; the only egress-only agents of this binary are `network`'s).
fn our_slirps() -> Vec<u32> {
    common::processes_matching("slirp4netns")
        .into_iter()
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let mut fields = stat.rsplit(')').next().unwrap_or_default().split_whitespace();
            let (state, ppid) = (fields.next(), fields.next());
            state != Some("Z") && ppid == Some(&std::process::id().to_string())
        })
        .collect()
}

/// A gateway listening on every address with the sandboxed probe as its agent under `network`;
/// alice's probe tries the gateway's own port on loopback and on each of the host's addresses,
/// and each of `more`. Returns what it recorded, the targets, and the gateway.
async fn what_an_agent_reaches(network: NetworkMode, more: &[&str]) -> (Value, Vec<String>, TestGateway) {
    let mut dir = PathBuf::new();
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.listen = "0.0.0.0:0".parse().expect("addr");
        dir = use_probe(c, SandboxMode::Bwrap, &[]);
        let probe = c.agents.get_mut("default").expect("probe");
        probe.network = network;
        probe.env.insert("PROBE_CONNECT".into(), "@probe-connect".into());
    })
    .await;
    let port = gw.addr.port();
    let mut targets = vec![format!("127.0.0.1:{port}")];
    targets.extend(host_addresses().iter().map(|ip| format!("{ip}:{port}")));
    targets.extend(more.iter().map(|t| t.to_string()));
    // Written before alice's first process starts: the targets are known only now.
    let home = dir.join("homes/alice");
    std::fs::create_dir_all(&home).expect("home");
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    std::fs::write(home.join("probe-connect"), targets.join(",")).expect("targets");
    let mut alice = gw.client("alice").await;
    alice.new_session().await;
    let seen = probe_start(&dir, "alice").await;
    (seen, targets, gw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_egress_only_agent_reaches_neither_the_metadata_endpoint_nor_the_hosts_own_services() {
    // `?`: tried only behind a reject route, so this host never sends the metadata endpoint a
    // packet even if the routes were missing (the assertion below then fails on "skipped").
    let (seen, targets, gw) = what_an_agent_reaches(NetworkMode::EgressOnly, &["?169.254.169.254:80"]).await;
    assert!(
        targets.len() >= 3,
        "the host has an address besides loopback: {targets:?}"
    );
    for target in &targets {
        let outcome = seen["connect"][target].as_str().unwrap_or_default();
        assert!(outcome.starts_with("error"), "{target}: {outcome}");
    }
    // The host's own address and the metadata endpoint are routed nowhere (EACCES from a
    // prohibit route), loopback is the namespace's own (nothing listens there).
    let metadata = seen["connect"]["?169.254.169.254:80"].as_str().unwrap_or_default();
    assert!(metadata.contains("PermissionError"), "{metadata}");
    let routes = seen["routes"].as_array().expect("routes");
    assert!(
        routes.iter().any(|r| r["destination"] == "0.0.0.0"
            && r["mask"] == "0.0.0.0"
            && r["reject"] == false
            && r["iface"] == "tap0"),
        "egress is configured (a default route through slirp4netns): {routes:?}"
    );
    for range in ["169.254.0.0", "10.0.0.0", "172.16.0.0", "192.168.0.0", "100.64.0.0"] {
        assert!(
            routes.iter().any(|r| r["destination"] == range && r["reject"] == true),
            "{range} routed nowhere: {routes:?}"
        );
    }
    let (_, body) = gw.api(None, reqwest::Method::GET, "/readyz").await;
    assert_eq!(body["network"]["default"], "egress-only", "{body}");
    assert_eq!(body["sandbox"]["default"], "bwrap", "{body}");

    // slirp4netns runs while the agent does, and goes with it.
    assert!(!our_slirps().is_empty(), "slirp4netns serves the agent");
    gw.stop().await;
    eventually("slirp4netns to end with its agents", || our_slirps().is_empty()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_the_network_stays_on_and_an_agent_reaches_the_gateways_port() {
    let (seen, targets, gw) = what_an_agent_reaches(NetworkMode::default(), &[]).await;
    assert!(
        targets.len() >= 2,
        "the host has an address besides loopback: {targets:?}"
    );
    for target in &targets {
        assert_eq!(seen["connect"][target], "connected", "{target}: {seen}");
    }
    let routes = seen["routes"].as_array().expect("routes");
    assert!(
        !routes.iter().any(|r| r["iface"] == "tap0"),
        "the host's own network: {routes:?}"
    );
    let (_, body) = gw.api(None, reqwest::Method::GET, "/readyz").await;
    assert_eq!(body["network"]["default"], "open", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_answer_only_the_bearer_of_the_metrics_token_when_one_is_set() {
    let token = "metrics-token-0123456789";
    let gw = TestGateway::start(Db::Sqlite, |c| c.metrics_token = Some(token.to_string().into())).await;
    let http = reqwest::Client::new();
    let get = |auth: Option<String>| {
        let mut req = http.get(gw.http_url("/metrics"));
        if let Some(auth) = auth {
            req = req.header("authorization", auth);
        }
        req.send()
    };
    for auth in [
        None,
        Some("Bearer wrong".to_string()),
        Some(format!("Bearer {token}x")),
        Some(format!("Basic {token}")),
        Some(format!("Bearer {}", gw.token("alice"))),
    ] {
        let r = get(auth.clone()).await.expect("http");
        assert_eq!(r.status(), 401, "{auth:?}");
        assert!(r.headers().contains_key("www-authenticate"));
        assert!(!r.text().await.expect("body").contains("acp_gateway_"), "{auth:?}");
    }
    let r = get(Some(format!("Bearer {token}"))).await.expect("http");
    assert_eq!(r.status(), 200);
    assert!(r.text().await.expect("body").contains("acp_gateway_"));
    // The other probes stay open: orchestrators call them without credentials.
    let r = http.get(gw.http_url("/healthz")).send().await.expect("http");
    assert_eq!(r.status(), 200);
}
