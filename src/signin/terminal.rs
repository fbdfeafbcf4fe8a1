//! A `terminal` sign-in method's login program, run for one user in a pseudo-terminal.
//!
//! The program is what the method names (the Terminal Authentication RFD): `_meta.terminal-auth`'s
//! `command` and `args` when given, else the agent's own command line followed by the method's
//! `args`. It is launched exactly as that user's agent processes are ([`Tenancy::launch`]: the
//! same sandbox, `HOME` and environment rules), with `TERM=xterm-256color`, as the leader of a
//! session and process group of its own; the whole group is killed (SIGKILL) when the
//! [`Terminal`] is dropped, whatever path drops it.
//!
//! The PTY comes from `portable-pty`; its reader and writer block, so the master is read and
//! written here through a non-blocking duplicate of its descriptor under tokio's `AsyncFd`, and
//! the only blocking call, waiting for the leader's exit, runs on the gateway's task tracker.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use portable_pty::{CommandBuilder, MasterPty, PtySize};
use serde_json::Value;
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;

use crate::config::AgentConfig;
use crate::pool::GroupGuard;
use crate::tenancy::Tenancy;

/// The terminal type the browser's terminal emulates.
const TERM: &str = "xterm-256color";
/// Runs the program with `SHELL` removed: `portable-pty` always sets it (to the gateway user's
/// login shell), and an agent's environment has no `SHELL`.
const ENV: &str = "/usr/bin/env";
/// Largest terminal a client may ask for, either way.
const MAX_CELLS: u16 = 1000;

/// A `terminal` method of an agent's `authMethods`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminalMethod {
    /// Its `id`.
    pub id: String,
    /// `_meta.terminal-auth.command`, when given.
    meta_command: Option<String>,
    /// `_meta.terminal-auth.args` (with `meta_command`).
    meta_args: Vec<String>,
    /// The method's own `args` (with the agent's command).
    args: Vec<String>,
    /// The method's `env`: set on the program, over the agent's own (the schema's words).
    env: Vec<(String, String)>,
}

impl TerminalMethod {
    /// The method `id` of `auth_methods` if it is of type `terminal`; `None` for anything else
    /// (unknown, another type, malformed): the caller answers all of them alike.
    pub fn find(auth_methods: Option<&Value>, id: &str) -> Option<Self> {
        let method = auth_methods?
            .as_array()?
            .iter()
            .find(|m| m.get("id").and_then(Value::as_str) == Some(id))?;
        if method.get("type").and_then(Value::as_str) != Some("terminal") {
            return None;
        }
        let strings = |v: Option<&Value>| -> Option<Vec<String>> {
            match v {
                None | Some(Value::Null) => Some(Vec::new()),
                Some(v) => v.as_array()?.iter().map(|a| a.as_str().map(str::to_string)).collect(),
            }
        };
        let meta = method.get("_meta").and_then(|m| m.get("terminal-auth"));
        let meta_command = match meta.and_then(|m| m.get("command")) {
            None | Some(Value::Null) => None,
            Some(c) => Some(c.as_str().filter(|c| !c.is_empty())?.to_string()),
        };
        let env = match method.get("env") {
            None | Some(Value::Null) => Vec::new(),
            Some(env) => env
                .as_object()?
                .iter()
                .map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect::<Option<Vec<_>>>()?,
        };
        Some(Self {
            id: id.to_string(),
            meta_command,
            meta_args: strings(meta.and_then(|m| m.get("args")))?,
            args: strings(method.get("args"))?,
            env,
        })
    }

    /// `agent` with its command line replaced by this method's and the method's `env` over its
    /// own: everything else (sandbox, the rest of the environment, working directory) stays the
    /// agent's.
    pub fn agent_config(&self, agent: &AgentConfig) -> AgentConfig {
        let mut cfg = agent.clone();
        cfg.env.extend(self.env.iter().cloned());
        match &self.meta_command {
            Some(command) => {
                cfg.command = command.clone();
                cfg.args = self.meta_args.clone();
            }
            // As the agent is started, with the method's arguments after its own (what
            // claude-agent-acp's `_meta` spells out: `node …/claude-agent-acp --cli`).
            None => cfg.args.extend(self.args.iter().cloned()),
        }
        cfg
    }
}

/// A terminal size, clamped to what a real terminal could be.
pub fn size(cols: u64, rows: u64) -> PtySize {
    let clamp = |n: u64| u16::try_from(n).unwrap_or(MAX_CELLS).clamp(1, MAX_CELLS);
    PtySize {
        cols: clamp(cols),
        rows: clamp(rows),
        pixel_width: 0,
        pixel_height: 0,
    }
}

/// How the login program ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    /// Its exit code (1 when a signal ended it).
    pub code: u32,
    /// The signal that ended it, if one did.
    pub signal: Option<String>,
}

/// A login program running in a pseudo-terminal.
pub struct Terminal {
    /// Its process group, killed on drop (declared first: dropped before the master closes).
    group: GroupGuard,
    /// The master side, for resizing (and kept open while the program runs); behind a lock
    /// only because `portable-pty`'s master is not `Sync`.
    master: std::sync::Mutex<Box<dyn MasterPty + Send>>,
    /// A non-blocking duplicate of the master's descriptor, for reading and writing.
    io: AsyncFd<OwnedFd>,
    /// The leader's exit, from the task that waits for it.
    exit: Option<oneshot::Receiver<Exit>>,
}

impl std::fmt::Debug for Terminal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Terminal")
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl Terminal {
    /// Starts `method`'s program for `user` as `agent`'s processes start, in a terminal of `size`.
    /// The task waiting for its exit is tracked by `tracker`.
    pub fn spawn(
        tenancy: &Tenancy,
        agent: &AgentConfig,
        method: &TerminalMethod,
        user: &str,
        size: PtySize,
        tracker: &TaskTracker,
    ) -> io::Result<Self> {
        let launch = tenancy.launch(&method.agent_config(agent), Some(user))?;
        let builder = builder(launch.command.as_std());
        let pair = portable_pty::native_pty_system()
            .openpty(size)
            .map_err(|e| io::Error::other(format!("cannot open a pseudo-terminal: {e}")))?;
        let mut child = pair
            .slave
            .spawn_command(builder)
            .map_err(|e| io::Error::other(format!("cannot run the login program: {e}")))?;
        // Only the program holds the slave now: its end is the master's end of input.
        drop(pair.slave);
        let pid = child
            .process_id()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| io::Error::other("the login program has no process id"))?;
        // The child called setsid(): its pid is its session's and process group's id.
        let group = GroupGuard::new(pid);
        let io = nonblocking_io(&*pair.master)?;
        let (tx, rx) = oneshot::channel();
        tracker.spawn_blocking(move || {
            let exit = match child.wait() {
                Ok(status) => Exit {
                    code: status.exit_code(),
                    signal: status.signal().map(str::to_string),
                },
                Err(_) => Exit { code: 1, signal: None },
            };
            let _ = tx.send(exit);
        });
        Ok(Self {
            group,
            master: std::sync::Mutex::new(pair.master),
            io,
            exit: Some(rx),
        })
    }

    /// The program's process group id (for logs and tests).
    pub fn pgid(&self) -> i32 {
        self.group.pgid()
    }

    /// Reads what the program wrote; `Ok(0)` once no process holds the terminal any more.
    /// Cancel-safe.
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut ready = self.io.readable().await?;
            match ready.try_io(|fd| nix::unistd::read(fd.get_ref(), buf).map_err(io::Error::from)) {
                // Linux answers EIO on a master whose slave every process has closed.
                Ok(Err(e)) if e.raw_os_error() == Some(Errno::EIO as i32) => return Ok(0),
                Ok(result) => return result,
                Err(_would_block) => {}
            }
        }
    }

    /// Writes some of `data` as input, waiting until the terminal takes at least a byte;
    /// returns how many it took. Cancel-safe.
    pub async fn write(&self, data: &[u8]) -> io::Result<usize> {
        loop {
            let mut ready = self.io.writable().await?;
            match ready.try_io(|fd| nix::unistd::write(fd.get_ref(), data).map_err(io::Error::from)) {
                Ok(result) => return result,
                Err(_would_block) => {}
            }
        }
    }

    /// Tells the program its terminal's new size.
    pub fn resize(&self, size: PtySize) -> io::Result<()> {
        self.master
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .resize(size)
            .map_err(io::Error::other)
    }

    /// The leader's exit, once: it resolves when the program has ended (to an error only if
    /// the task waiting for it is gone, which shutdown does).
    pub fn take_exit(&mut self) -> Option<oneshot::Receiver<Exit>> {
        self.exit.take()
    }

    /// Kills the whole process group now (dropping the terminal does too).
    pub fn kill(&self) {
        self.group.kill();
    }
}

/// The launch command as a `portable-pty` one: the same program, arguments, environment (only
/// what the launch set: it clears the rest) and working directory; `TERM` for the browser's
/// terminal; run through `env -u SHELL` (see [`ENV`]).
fn builder(command: &std::process::Command) -> CommandBuilder {
    let mut b = CommandBuilder::new(ENV);
    b.env_clear();
    b.args(["-u", "SHELL", "--"]);
    b.arg(command.get_program());
    b.args(command.get_args());
    for (key, value) in command.get_envs() {
        if let Some(value) = value {
            b.env(key, value);
        }
    }
    b.env("TERM", TERM);
    if let Some(dir) = command.get_current_dir() {
        b.cwd(dir);
    }
    b
}

/// A non-blocking duplicate of `master`'s descriptor, registered with tokio (the flag is the
/// open file's, which only this module reads and writes).
#[allow(
    unsafe_code,
    reason = "portable-pty only hands out the master's raw descriptor (borrowed for the dup while `master` holds it open), and tokio's registration asks its caller to vouch for the descriptor (an OwnedFd: open, and the same, until dropped)"
)]
fn nonblocking_io(master: &dyn MasterPty) -> io::Result<AsyncFd<OwnedFd>> {
    let raw = master
        .as_raw_fd()
        .ok_or_else(|| io::Error::other("the pseudo-terminal has no descriptor"))?;
    // SAFETY: `raw` is the master's open descriptor and `master` outlives this borrow.
    let borrowed = unsafe { BorrowedFd::borrow_raw(raw) };
    let fd = nix::unistd::dup(borrowed)?;
    let flags = OFlag::from_bits_truncate(fcntl(fd.as_fd(), FcntlArg::F_GETFL)?);
    fcntl(fd.as_fd(), FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    // SAFETY: an OwnedFd is open and names the same file description until it is dropped,
    // which only the AsyncFd that owns it does.
    unsafe { AsyncFd::register(fd) }.map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn methods() -> Value {
        json!([
            {"id": "agent-login", "type": "agent"},
            {"id": "plain", "type": "terminal", "args": ["--login"], "env": {"MODE": "login", "KEEP": "method"}},
            {"id": "claude-login", "type": "terminal", "args": ["--cli"],
             "_meta": {"terminal-auth": {"command": "/usr/bin/node", "args": ["/x/claude-agent-acp", "--cli"], "label": "Claude Login"}}},
            {"id": "bad", "type": "terminal", "args": [1]},
            {"id": "bad-env", "type": "terminal", "env": {"A": 1}},
        ])
    }

    #[test]
    fn only_terminal_methods_are_found() {
        let m = methods();
        assert!(TerminalMethod::find(Some(&m), "agent-login").is_none(), "another type");
        assert!(TerminalMethod::find(Some(&m), "nope").is_none(), "unknown");
        assert!(TerminalMethod::find(Some(&m), "bad").is_none(), "malformed");
        assert!(TerminalMethod::find(Some(&m), "bad-env").is_none(), "malformed env");
        assert!(TerminalMethod::find(None, "plain").is_none(), "no methods");
        assert!(TerminalMethod::find(Some(&json!({"plain": 1})), "plain").is_none());
    }

    #[test]
    fn the_meta_command_wins_else_the_agents_own() {
        let m = methods();
        let agent = AgentConfig {
            command: "/opt/agent".into(),
            args: vec!["--acp".into()],
            env: [("KEEP", "agent"), ("OTHER", "agent")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .into(),
            ..Default::default()
        };
        let claude = TerminalMethod::find(Some(&m), "claude-login").expect("found");
        let cfg = claude.agent_config(&agent);
        assert_eq!(cfg.command, "/usr/bin/node");
        assert_eq!(cfg.args, ["/x/claude-agent-acp", "--cli"]);
        let plain = TerminalMethod::find(Some(&m), "plain").expect("found");
        let cfg = plain.agent_config(&agent);
        assert_eq!(cfg.command, "/opt/agent");
        assert_eq!(cfg.args, ["--acp", "--login"]);
        let env: Vec<(&str, &str)> = cfg.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(
            env,
            [("KEEP", "method"), ("MODE", "login"), ("OTHER", "agent")],
            "the method's env over the agent's"
        );
    }

    #[test]
    fn sizes_are_clamped() {
        let s = size(0, 1 << 40);
        assert_eq!((s.cols, s.rows), (1, MAX_CELLS));
        let s = size(80, 24);
        assert_eq!((s.cols, s.rows), (80, 24));
    }
}
