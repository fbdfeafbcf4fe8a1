//! The real `acp-gateway serve` binary as a child process (for tests that SIGKILL it), with a
//! demo agent that can be told apart in `/proc` from every other process.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::AsyncBufReadExt;

use super::{WAIT, gateway_bin};

/// A running `acp-gateway serve`; killed (SIGKILL) when dropped.
pub struct ServeProcess {
    child: tokio::process::Child,
    /// `host:port` it printed.
    pub addr: String,
    secret: String,
    /// Keeps reading its stdout so that a late `println!` never hits a closed pipe.
    _stdout: tokio::task::JoinHandle<()>,
    /// Keeps reading its stderr (without `TEST_LOG`), for the same reason.
    _stderr: Option<tokio::task::JoinHandle<Vec<String>>>,
}

/// How many of its last stderr lines a gateway that exits at start is shown with.
const STDERR_TAIL: usize = 40;

/// Reads `stderr` to its end; its last [`STDERR_TAIL`] lines.
async fn last_lines(stderr: tokio::process::ChildStderr) -> Vec<String> {
    let mut tail = std::collections::VecDeque::with_capacity(STDERR_TAIL);
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if tail.len() == STDERR_TAIL {
            tail.pop_front();
        }
        tail.push_back(line);
    }
    tail.into()
}

/// Environment a developer's shell may carry that would change the gateway under test.
const GATEWAY_ENV: [&str; 11] = [
    "ACP_GATEWAY_LISTEN",
    "DATABASE_URL",
    "ACP_GATEWAY_JWT_SECRET",
    "ACP_GATEWAY_JWT_PUBLIC_KEY",
    "ACP_GATEWAY_JWT_ISSUER",
    "ACP_GATEWAY_JWT_AUDIENCE",
    "ACP_GATEWAY_AGENT",
    "ACP_GATEWAY_DATA_DIR",
    "ACP_GATEWAY_USER_HOMES",
    "ACP_GATEWAY_WORKSPACE_ROOTS",
    "ACP_GATEWAY_REPLICA_ID",
];

impl ServeProcess {
    /// Runs `acp-gateway serve --listen 127.0.0.1:0 --config config` on `db_url` with the HS256
    /// `secret`, and waits for it to print its address. Its stderr goes to ours with `TEST_LOG`;
    /// without, a gateway that exits first panics with the last lines it wrote there.
    pub async fn start(config: &Path, db_url: &str, secret: &str) -> Self {
        Self::start_with_env(config, db_url, secret, &[]).await
    }

    /// [`ServeProcess::start`] with `env` set for the gateway too.
    pub async fn start_with_env(config: &Path, db_url: &str, secret: &str, env: &[(&str, &str)]) -> Self {
        Self::start_via(&[], config, db_url, secret, env).await
    }

    /// [`ServeProcess::start_with_env`] run through `prefix` (a command that runs the rest, such
    /// as `setpriv --reuid …` to run the gateway as another OS user).
    pub async fn start_via(prefix: &[&str], config: &Path, db_url: &str, secret: &str, env: &[(&str, &str)]) -> Self {
        let mut cmd = match prefix.split_first() {
            Some((program, args)) => {
                let mut c = tokio::process::Command::new(program);
                c.args(args).arg(gateway_bin());
                c
            }
            None => tokio::process::Command::new(gateway_bin()),
        };
        for var in GATEWAY_ENV {
            cmd.env_remove(var);
        }
        cmd.envs(env.iter().copied());
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(config)
            .env("ACP_GATEWAY_JWT_SECRET", secret)
            .env("DATABASE_URL", db_url)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true);
        if std::env::var_os("TEST_LOG").is_some() {
            cmd.env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()));
        } else {
            cmd.stderr(std::process::Stdio::piped());
        }
        let mut child = cmd.spawn().expect("gateway starts");
        let stdout = child.stdout.take().expect("stdout");
        let mut stderr = child.stderr.take().map(|e| tokio::spawn(last_lines(e)));
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let addr = tokio::time::timeout(WAIT, async {
            while let Some(line) = lines.next_line().await.expect("read stdout") {
                if let Some(rest) = line.split("http://").nth(1) {
                    return Some(rest.split('/').next().expect("addr").to_string());
                }
            }
            None
        })
        .await
        .expect("the gateway prints its address in time");
        let Some(addr) = addr else {
            let said = match stderr.take() {
                Some(tail) => match tokio::time::timeout(WAIT, tail).await {
                    Ok(Ok(lines)) => lines.join("\n"),
                    _ => "(its stderr did not end)".to_string(),
                },
                None => "(its stderr went to the test's: TEST_LOG is set)".to_string(),
            };
            panic!("the gateway exited without printing its address; its stderr ended with:\n{said}");
        };
        let drain = tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self {
            child,
            addr,
            secret: secret.to_string(),
            _stdout: drain,
            _stderr: stderr,
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// `ws://…/acp`.
    pub fn ws_url(&self) -> String {
        format!("ws://{}/acp", self.addr)
    }

    /// A token for `user`, minted with the gateway's secret.
    pub fn token(&self, user: &str) -> String {
        let auth = acp_gateway::identity::auth::Authenticator::from_config(
            &acp_gateway::infra::config::JwtConfig {
                secret: Some(self.secret.clone().into()),
                ..Default::default()
            },
            Path::new("/nonexistent"),
        )
        .expect("authenticator");
        auth.mint(user, 3600).expect("mint")
    }

    /// A connected, initialized client for `user`.
    pub async fn client(&self, user: &str) -> super::Client {
        let mut c = super::Client::connect(&self.ws_url(), &self.token(user))
            .await
            .expect("connects");
        c.initialize().await;
        c
    }

    /// SIGKILL (no shutdown of any kind) and reap.
    pub async fn kill(mut self) {
        self.child.start_kill().expect("SIGKILL the gateway");
        self.child.wait().await.expect("reaped");
    }

    /// Sends SIGTERM (graceful shutdown) and returns at once.
    pub fn terminate(&self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("SIGTERM");
    }

    /// Waits for the process to exit (at most `within`) and returns how it ended.
    pub async fn wait_exit(&mut self, within: std::time::Duration) -> std::process::ExitStatus {
        tokio::time::timeout(within, self.child.wait())
            .await
            .expect("the gateway exits in time")
            .expect("reaped")
    }

    /// SIGTERM (graceful shutdown) and wait for the exit.
    pub async fn stop(mut self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("SIGTERM");
        tokio::time::timeout(std::time::Duration::from_secs(30), self.child.wait())
            .await
            .expect("the gateway stops in time")
            .expect("reaped");
    }
}

static MARKERS: AtomicU64 = AtomicU64::new(0);

/// A name for the gateway binary that no other process has: a symlink to it in the cargo target's
/// temp dir (visible inside the agent sandbox, which hides `/tmp`). Every process started with it
/// as `argv[0]` (and the `bwrap` in front of it) shows this path in `/proc/PID/cmdline`, so
/// `processes_matching(path)` finds exactly the agents started with it.
pub fn marked_gateway_bin(label: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&dir).expect("target tmp dir");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let n = MARKERS.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!("agent-{label}-{}-{nanos}-{n}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    std::os::unix::fs::symlink(gateway_bin(), &path).expect("symlink");
    path
}
