//! The gateway leaves the host as it found it: workspace roots without `{user}` (an operator's
//! shared directories, `/tmp`, `/`) keep their mode, owner and contents through start, `/readyz`,
//! `session/new` in them and shutdown, whether the gateway runs as root or as an unprivileged
//! user; a root it cannot use is named in `/readyz` and skipped while the others work; and the
//! data directory stays out of every sandbox whatever the agent's command line says.

use crate::common;

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use acp_gateway::infra::config::{AgentConfig, SandboxMode};
use common::serve_process::ServeProcess;
use common::{Client, Db, TestGateway};
use serde_json::{Value, json};

const PROBE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/probe_agent.py");

/// `nobody`: the unprivileged user the gateway runs as when the tests run as root.
const NOBODY: u32 = 65534;

/// What the gateway must not change about a directory it did not create.
#[derive(Debug, PartialEq, Eq)]
struct Untouched {
    mode: u32,
    uid: u32,
    gid: u32,
    entries: Vec<String>,
}

fn untouched(dir: &Path) -> Untouched {
    let meta = std::fs::metadata(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut entries: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    entries.sort();
    Untouched {
        mode: meta.permissions().mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        entries,
    }
}

/// Mode and owner only (for directories other tests write into, such as `/tmp`).
fn mode_and_owner(dir: &Path) -> (u32, u32, u32) {
    let meta = std::fs::metadata(dir).expect("metadata");
    (meta.permissions().mode() & 0o7777, meta.uid(), meta.gid())
}

/// The tests' own user id (the owner of `/proc/self`).
fn my_uid() -> u32 {
    std::fs::metadata("/proc/self").expect("/proc/self").uid()
}

fn is_root() -> bool {
    my_uid() == 0
}

/// A directory for this test under the target directory (every user can reach it; the system
/// temp directory may be `0700`).
fn test_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("host-safety-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("test dir")
}

fn mkdir(path: &Path, mode: u32, owner: Option<u32>) {
    std::fs::create_dir(path).expect("mkdir");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod our own dir");
    if let Some(uid) = owner {
        std::os::unix::fs::chown(path, Some(uid), Some(uid)).expect("chown our own dir");
    }
}

async fn readyz(addr: &str) -> (u16, Value) {
    let r = reqwest::get(format!("http://{addr}/readyz"))
        .await
        .expect("/readyz answers");
    (r.status().as_u16(), r.json().await.expect("json"))
}

/// `session/new` in `cwd`, then a prompt that must end its turn.
async fn session_in(client: &mut Client, cwd: &Path) -> String {
    let r = client
        .request("session/new", json!({"cwd": cwd, "mcpServers": []}))
        .await;
    let id = r["result"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("session/new in {}: {r}", cwd.display()))
        .to_string();
    let r = client.prompt(&id, "hello").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_roots_keep_their_mode_owner_and_contents() {
    let base = test_dir();
    let shared = base.path().join("shared");
    // Another user's directory, as a team's /srv/repos would be.
    mkdir(&shared, 0o755, is_root().then_some(NOBODY));
    std::fs::write(shared.join("README"), "the team's").expect("write");
    let before = untouched(&shared);
    let tmp_before = mode_and_owner(Path::new("/tmp"));
    let roots = vec![
        shared.display().to_string(),
        "/tmp".to_string(),
        "{data_dir}/workspaces/{user}".to_string(),
    ];
    let gw = TestGateway::start(Db::Sqlite, |c| c.workspace_roots = roots).await;
    assert!(
        gw.gw.agents.tenancy.sandboxed(SandboxMode::Auto),
        "bubblewrap must work on the test host"
    );
    let (status, body) = readyz(&gw.addr.to_string()).await;
    assert_eq!(status, 200, "{body}");
    // (As root, the one warning is that: agents are uid 0 in their sandbox.)
    let warnings: Vec<&Value> = body["warnings"]
        .as_array()
        .expect("warnings")
        .iter()
        .filter(|w| !w.as_str().is_some_and(|w| w.starts_with("the gateway runs as root")))
        .collect();
    assert!(warnings.is_empty(), "every root can be used: {body}");
    assert_eq!(untouched(&shared), before, "after start and /readyz");

    let mut alice = gw.client("alice").await;
    session_in(&mut alice, &shared).await;
    let scratch = tempfile::tempdir_in("/tmp").expect("a dir of ours in /tmp");
    session_in(&mut alice, scratch.path()).await;
    assert_eq!(untouched(&shared), before, "after sessions in it");
    assert_eq!(mode_and_owner(Path::new("/tmp")), tmp_before, "/tmp as a root");
    alice.close().await;
    gw.stop().await;
    assert_eq!(untouched(&shared), before, "after shutdown");
    assert_eq!(mode_and_owner(Path::new("/tmp")), tmp_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_an_unprivileged_user_a_root_it_cannot_enter_is_named_and_skipped() {
    let base = test_dir();
    // As root the gateway runs as `nobody`; otherwise it runs as us, already unprivileged.
    let (prefix, gateway_uid): (Vec<String>, u32) = if is_root() {
        let id = NOBODY.to_string();
        (
            ["setpriv", "--reuid", &id, "--regid", &id, "--clear-groups", "--"]
                .map(String::from)
                .to_vec(),
            NOBODY,
        )
    } else {
        (Vec::new(), my_uid())
    };
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod our dir");
    let home = base.path().join("gateway");
    mkdir(&home, 0o755, is_root().then_some(NOBODY));
    // Owned by someone else (root when we are root), readable by all: usable as it is.
    let shared = base.path().join("shared");
    mkdir(&shared, 0o755, None);
    // One the gateway's user cannot enter.
    let locked = base.path().join("locked");
    mkdir(&locked, if is_root() { 0o700 } else { 0o000 }, None);
    let data = home.join("data");
    let config = home.join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\nworkspace_roots = [{:?}, {:?}, \"{{data_dir}}/workspaces/{{user}}\"]\n",
            data.display().to_string(),
            shared.display().to_string(),
            locked.display().to_string(),
        ),
    )
    .expect("config");
    let (shared_before, locked_before) = (untouched(&shared), mode_and_owner(&locked));
    let db = format!("sqlite://{}/gw.db", data.display());
    let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
    let gw = ServeProcess::start_via(&prefix, &config, &db, common::SECRET, &[]).await;

    let (status, body) = readyz(&gw.addr).await;
    assert_eq!(
        status, 200,
        "a root that cannot be used does not stop the agents: {body}"
    );
    let warnings = body["warnings"].to_string();
    let locked_name = locked.display().to_string();
    assert!(
        warnings.contains(&locked_name) && warnings.contains("cannot enter") && warnings.contains("WORKSPACE_ROOTS"),
        "/readyz names the root, the operation and the setting: {body}"
    );
    assert!(
        !warnings.contains(&shared.display().to_string()),
        "the shared root is fine: {body}"
    );

    let mut alice = gw.client("alice").await;
    session_in(&mut alice, &shared).await;
    let r = alice
        .request("session/new", json!({"cwd": locked, "mcpServers": []}))
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let message = r["error"]["message"].as_str().unwrap_or_default();
    let allowed = message.split("allowed roots:").nth(1).unwrap_or_default();
    assert!(
        allowed.contains(&shared.display().to_string()) && !allowed.contains(&locked_name),
        "the allowed roots are the usable ones: {r}"
    );
    assert_eq!(untouched(&shared), shared_before);
    assert_eq!(mode_and_owner(&locked), locked_before);
    alice.close().await;
    gw.stop().await;
    assert_eq!(untouched(&shared), shared_before, "after shutdown");
    assert_eq!(mode_and_owner(&locked), locked_before, "after shutdown");
    let data_meta = std::fs::metadata(&data).expect("the gateway made its data dir");
    assert_eq!(
        (data_meta.permissions().mode() & 0o777, data_meta.uid()),
        (0o700, gateway_uid),
        "what the gateway creates is private to it"
    );
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).expect("let the temp dir go");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_command_line_naming_the_data_directory_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().canonicalize().expect("canon");
    let mut config = common::test_config(&data, &format!("sqlite://{}/gw.db", data.display()));
    let wrapper = format!(
        "cd {}/homes && exec {} demo-agent",
        data.display(),
        common::gateway_bin()
    );
    config.agents.insert(
        "default".into(),
        AgentConfig {
            command: "/bin/sh".into(),
            args: vec!["-c".into(), wrapper],
            ..Default::default()
        },
    );
    let err = match acp_gateway::app::Application::build(config).await {
        Ok(_) => panic!("a command line naming the data directory must be refused"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("agents.default") && err.contains(&format!("{}/homes", data.display())),
        "the error names the agent and the path: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_script_in_tmp_still_runs_in_the_sandbox() {
    let scripts = tempfile::tempdir_in("/tmp").expect("a dir of ours in /tmp");
    let script = scripts.path().join("agent.sh");
    // A wrapper as operators write them: it runs the command line it is given (the gateway's
    // binary, which may itself live under /tmp: both are named, so both are bound back).
    std::fs::write(&script, "#!/bin/sh\nexec \"$@\"\n").expect("script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod our script");
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.agents.insert(
            "default".into(),
            AgentConfig {
                command: script.display().to_string(),
                args: [
                    common::gateway_bin().as_str(),
                    "demo-agent",
                    "--delay-us",
                    "0",
                    "--chunks",
                    "3",
                ]
                .map(String::from)
                .to_vec(),
                sandbox: SandboxMode::Bwrap,
                ..Default::default()
            },
        );
    })
    .await;
    let mut alice = gw.client("alice").await;
    let root = PathBuf::from(&alice.root);
    session_in(&mut alice, &root).await;
    alice.close().await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_whole_host_as_a_root_the_data_directory_stays_hidden() {
    let slash_before = mode_and_owner(Path::new("/"));
    let mut data = PathBuf::new();
    let gw = TestGateway::start(Db::Sqlite, |c| {
        data = c.data_dir.canonicalize().expect("data dir");
        std::fs::write(data.join("planted-secret"), "s3cret").expect("plant");
        let paths = [data.join("gw.db"), data.join("planted-secret")];
        let joined: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        c.workspace_roots = vec!["/".into()];
        c.agents.insert(
            "default".into(),
            AgentConfig {
                command: "/usr/bin/python3".into(),
                args: vec![PROBE.into()],
                env: BTreeMap::from([("PROBE_PATHS".to_string(), joined.join(":"))]),
                sandbox: SandboxMode::Bwrap,
                ..Default::default()
            },
        );
    })
    .await;
    let mut alice = gw.client("alice").await;
    let r = alice
        .request("session/new", json!({"cwd": "/usr", "mcpServers": []}))
        .await;
    assert!(r["result"]["sessionId"].is_string(), "{r}");
    let report = data.join("homes/alice/probe-start.json");
    common::eventually("the probe's report", || {
        std::fs::read_to_string(&report).is_ok_and(|t| serde_json::from_str::<Value>(&t).is_ok())
    })
    .await;
    let seen: Value = serde_json::from_str(&std::fs::read_to_string(&report).expect("read")).expect("json");
    let readable = seen["readable"].as_object().expect("readable");
    assert_eq!(readable.len(), 2, "{seen}");
    assert!(
        readable.values().all(|r| r == false),
        "with `/` as a root the agent still reads nothing of the data directory: {readable:?}"
    );
    alice.close().await;
    gw.stop().await;
    assert_eq!(mode_and_owner(Path::new("/")), slash_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_cannot_start_is_named_with_the_path_and_the_setting() {
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.agents.insert(
            "default".into(),
            AgentConfig {
                command: "/nonexistent/acp-agent".into(),
                sandbox: SandboxMode::Bwrap,
                ..Default::default()
            },
        );
        c.agents.insert(
            "plain".into(),
            AgentConfig {
                command: "/nonexistent/acp-agent".into(),
                sandbox: SandboxMode::None,
                ..Default::default()
            },
        );
    })
    .await;
    // Sandboxed: bubblewrap's own words, which name the program.
    let (status, body) = readyz(&gw.addr.to_string()).await;
    assert_eq!(status, 503, "{body}");
    let agent = body["checks"]["defaultAgent"].as_str().unwrap_or_default();
    assert!(
        agent.contains("bwrap: ") && agent.contains("/nonexistent/acp-agent"),
        "{body}"
    );
    // Unsandboxed: the path, the operation and the setting.
    let mut c = Client::connect(&format!("{}?agent=plain", gw.ws_url()), &gw.token("alice"))
        .await
        .expect("connect");
    let r = c.request("initialize", json!({"protocolVersion": 1})).await;
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("cannot run /nonexistent/acp-agent") && message.contains("agents.plain.command"),
        "{r}"
    );
    gw.stop().await;
}

/// Where bubblewrap does not work (here a `bwrap` that fails, first on `PATH`, as in a container
/// without user namespaces), `sandbox = "auto"` fails closed: its agents serve the first user
/// only, remembered across a restart, and refuse everyone else by name; `/readyz` says so. Such
/// an agent could read every user's home and the gateway's secrets (the review's F9).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_without_a_working_sandbox_serves_one_user_only() {
    let base = tempfile::tempdir().expect("tempdir");
    let fake = base.path().join("bin");
    std::fs::create_dir(&fake).expect("mkdir");
    std::fs::write(
        fake.join("bwrap"),
        "#!/bin/sh\necho 'bwrap: No permission to create new namespace' >&2\nexit 1\n",
    )
    .expect("fake bwrap");
    std::fs::set_permissions(fake.join("bwrap"), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let path = format!("{}:{}", fake.display(), std::env::var("PATH").expect("PATH"));
    let data = base.path().join("data");
    let config = base.path().join("gateway.toml");
    std::fs::write(&config, format!("data_dir = {:?}\n", data.display().to_string())).expect("config");
    let db = format!("sqlite://{}/gw.db", data.display());
    let env = [("PATH", path.as_str())];
    for round in ["first start", "after a restart"] {
        let gw = ServeProcess::start_with_env(&config, &db, common::SECRET, &env).await;
        let mut alice = gw.client("alice").await;
        alice.new_session().await;
        // Bob is refused from his first request (`initialize` starts his agent).
        let mut bob = Client::connect(&gw.ws_url(), &gw.token("bob")).await.expect("connects");
        let r = bob.request("initialize", json!({"protocolVersion": 1})).await;
        let message = r["error"]["message"].as_str().unwrap_or_else(|| panic!("{round}: {r}"));
        assert!(
            message.contains("serves one user only")
                && message.contains("\"alice\"")
                && message.contains("sandbox = \"none\""),
            "{round}: {message}"
        );
        let (_, body) = readyz(&gw.addr).await;
        let mode = body["sandbox"]["default"].as_str().unwrap_or_default();
        assert!(mode.starts_with("single-user"), "{round}: {body}");
        assert!(
            !body.to_string().contains("alice"),
            "who it is stays off /readyz: {body}"
        );
        assert!(
            body["warnings"].to_string().contains("serves one user only"),
            "{round}: {body}"
        );
        gw.stop().await;
    }
}

/// `network = "egress-only"` fails closed: where bubblewrap does not work (a `bwrap` that fails,
/// first on `PATH`), or slirp4netns is missing (a `PATH` with bubblewrap and `true` alone), the gateway does
/// not start, and says which setting asked for what.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_only_without_its_sandbox_or_its_tools_refuses_to_start() {
    let base = tempfile::tempdir().expect("tempdir");
    let failing = base.path().join("failing");
    std::fs::create_dir(&failing).expect("mkdir");
    std::fs::write(
        failing.join("bwrap"),
        "#!/bin/sh\necho 'bwrap: No permission to create new namespace' >&2\nexit 1\n",
    )
    .expect("fake bwrap");
    std::fs::set_permissions(failing.join("bwrap"), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let bwrap_only = base.path().join("bwrap-only");
    std::fs::create_dir(&bwrap_only).expect("mkdir");
    let real = std::env::split_paths(&std::env::var_os("PATH").expect("PATH"))
        .map(|d| d.join("bwrap"))
        .find(|p| p.is_file())
        .expect("bubblewrap is installed");
    std::os::unix::fs::symlink(real, bwrap_only.join("bwrap")).expect("symlink");
    // What the gateway's probe of bubblewrap runs in it.
    std::os::unix::fs::symlink("/bin/true", bwrap_only.join("true")).expect("symlink");
    let data = base.path().join("data");
    let config = base.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\n[agents.default]\nnetwork = \"egress-only\"\n",
            data.display().to_string()
        ),
    )
    .expect("config");
    let with_failing = format!("{}:{}", failing.display(), std::env::var("PATH").expect("PATH"));
    let cases = [
        (with_failing, "bubblewrap does not work on this host"),
        (bwrap_only.display().to_string(), "`slirp4netns` is not installed"),
    ];
    for (path, why) in cases {
        let out = tokio::time::timeout(
            common::WAIT,
            tokio::process::Command::new(common::gateway_bin())
                .args(["serve", "--listen", "127.0.0.1:0", "--config"])
                .arg(&config)
                .env("PATH", &path)
                .env("ACP_GATEWAY_JWT_SECRET", common::SECRET)
                .env_remove("ACP_GATEWAY_AGENT")
                .env_remove("DATABASE_URL")
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("ends in time")
        .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{why}: {stderr}");
        assert!(
            stderr.contains("agents.default.network = \"egress-only\"") && stderr.contains(why),
            "{why}: {stderr}"
        );
    }
}

/// Egress-only where the gateway is not root: bubblewrap then makes a user namespace (two,
/// nested, with `--dev`), and the network is set up in the one that owns the sandbox's network
/// namespace. The probe agent, run as `nobody` when we are root, reaches neither the gateway's
/// port nor the metadata endpoint, and has its way out through slirp4netns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_only_works_for_an_unprivileged_gateway() {
    let base = test_dir();
    let prefix: Vec<String> = if is_root() {
        let id = NOBODY.to_string();
        ["setpriv", "--reuid", &id, "--regid", &id, "--clear-groups", "--"]
            .map(String::from)
            .to_vec()
    } else {
        Vec::new()
    };
    let owner = is_root().then_some(NOBODY);
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod our dir");
    let home = base.path().join("gateway");
    mkdir(&home, 0o755, owner);
    let data = home.join("data");
    mkdir(&data, 0o700, owner);
    mkdir(&data.join("homes"), 0o700, owner);
    let alice = data.join("homes/alice");
    mkdir(&alice, 0o700, owner);
    let probe = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/probe_agent.py");
    let config = home.join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\n[agents.default]\ncommand = \"/usr/bin/python3\"\nargs = [{probe:?}]\nsandbox = \"bwrap\"\nnetwork = \"egress-only\"\n[agents.default.env]\nPROBE_CONNECT = \"@probe-connect\"\n",
            data.display().to_string()
        ),
    )
    .expect("config");
    let db = format!("sqlite://{}/gw.db", data.display());
    let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
    let gw = ServeProcess::start_via(&prefix, &config, &db, common::SECRET, &[]).await;
    let port = gw.addr.rsplit(':').next().expect("a port");
    let targets = [format!("127.0.0.1:{port}"), "?169.254.169.254:80".to_string()];
    let file = alice.join("probe-connect");
    std::fs::write(&file, targets.join(",")).expect("targets");
    if let Some(uid) = owner {
        std::os::unix::fs::chown(&file, Some(uid), Some(uid)).expect("chown");
    }
    let mut client = gw.client("alice").await;
    client.new_session().await;
    let report = alice.join("probe-start.json");
    common::eventually("the probe's report", || {
        std::fs::read_to_string(&report).is_ok_and(|t| serde_json::from_str::<Value>(&t).is_ok())
    })
    .await;
    let seen: Value = serde_json::from_str(&std::fs::read_to_string(&report).expect("read")).expect("json");
    for target in &targets {
        let outcome = seen["connect"][target].as_str().unwrap_or_default();
        assert!(outcome.starts_with("error"), "{target}: {outcome}");
    }
    let routes = seen["routes"].as_array().expect("routes");
    assert!(
        routes.iter().any(|r| r["mask"] == "0.0.0.0" && r["iface"] == "tap0"),
        "a way out through slirp4netns: {routes:?}"
    );
    client.close().await;
    gw.stop().await;
}
