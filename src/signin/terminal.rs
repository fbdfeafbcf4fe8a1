//! A `terminal` sign-in method's login program, run for one user in a pseudo-terminal.
//!
//! The program is what the method names (the Terminal Authentication RFD): `_meta.terminal-auth`'s
//! `command` and `args` when given, else the agent's own command line followed by the method's
//! `args`. The method comes from the agent's answer, so nothing of it is trusted: it is launched
//! as that user's agent processes are ([`Tenancy::launch_login`]: inside the same sandbox, with
//! the same `HOME`), its `env` filtered like a user's keys and set inside the sandbox, no file it
//! names brought in, and a command line naming the gateway's secret places refused. It runs with
//! `TERM=xterm-256color`, as the leader of a session and process group of its own with the
//! pseudo-terminal as its controlling terminal; the whole group is killed (SIGKILL) when the
//! [`Terminal`] is dropped, whatever path drops it.
//!
//! The pseudo-terminal is opened here (`posix_openpt`, close-on-exec, so no other child inherits
//! it); its master is read and written through a non-blocking duplicate of its descriptor under
//! tokio's `AsyncFd`, and the only blocking call, waiting for the leader's exit, runs on the
//! gateway's task tracker.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::pty::PtyMaster;
use serde_json::Value;
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

use crate::agents::pool::GroupGuard;
use crate::infra::config::AgentConfig;
use crate::tenancy::{Program, Ready, Tenancy};

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

    /// The program this method runs in place of `agent`, with the method's `env` (the agent's
    /// own sandbox, environment and working directory stay: see [`Tenancy::launch_login`]).
    pub fn program(&self, agent: &AgentConfig) -> Program {
        let (command, args) = match &self.meta_command {
            Some(command) => (command.clone(), self.meta_args.clone()),
            // As the agent is started, with the method's arguments after its own (what
            // claude-agent-acp's `_meta` spells out: `node …/claude-agent-acp --cli`).
            None => (
                agent.command.clone(),
                agent.args.iter().chain(&self.args).cloned().collect(),
            ),
        };
        Program {
            command,
            args,
            env: self.env.clone(),
        }
    }
}

/// A terminal's size in cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

/// A terminal size, clamped to what a real terminal could be.
pub fn size(cols: u64, rows: u64) -> Size {
    let clamp = |n: u64| u16::try_from(n).unwrap_or(MAX_CELLS).clamp(1, MAX_CELLS);
    Size {
        cols: clamp(cols),
        rows: clamp(rows),
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
    /// The master side, for resizing (and kept open while the program runs).
    master: PtyMaster,
    /// A non-blocking duplicate of the master's descriptor, for reading and writing.
    io: AsyncFd<OwnedFd>,
    /// The leader's exit, from the task that waits for it.
    exit: Option<oneshot::Receiver<Exit>>,
    /// Ends an egress-only sandbox's network when the terminal goes.
    _network: DropGuard,
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
        size: Size,
        tracker: &TaskTracker,
    ) -> io::Result<Self> {
        let launch = tenancy.launch_login(agent, user, &method.program(agent))?;
        let (master, slave) = open_pty()?;
        set_size(&master, size)?;
        let Ready {
            mut command,
            child_fds,
            network,
        } = launch.into_std()?;
        command
            .stdin(Stdio::from(slave.try_clone()?))
            .stdout(Stdio::from(slave.try_clone()?))
            .stderr(Stdio::from(slave));
        let spawned = command.spawn();
        // The child has its copies (or failed): the gateway's go, so that the program's end is
        // the master's end of input.
        drop(command);
        drop(child_fds);
        let mut child = spawned.map_err(|e| io::Error::other(format!("cannot run the login program: {e}")))?;
        // The child called setsid(): its pid is its session's and process group's id.
        let pid = i32::try_from(child.id()).map_err(|_| io::Error::other("the login program has no process id"))?;
        let group = GroupGuard::new(pid);
        // With egress-only, the program starts once its network is up, and the network goes
        // when the program has ended (or the terminal is dropped).
        let ended = CancellationToken::new();
        let network_guard = ended.clone().drop_guard();
        if let Some(network) = network {
            tracker.spawn(network.run(pid, ended.clone()));
        }
        let io = nonblocking_io(&master)?;
        let (tx, rx) = oneshot::channel();
        let ended_on_exit = ended.clone();
        tracker.spawn_blocking(move || {
            let exit = match child.wait() {
                Ok(status) => Exit {
                    code: status.code().and_then(|c| u32::try_from(c).ok()).unwrap_or(1),
                    signal: status.signal().map(|n| {
                        nix::sys::signal::Signal::try_from(n).map_or_else(|_| n.to_string(), |s| s.as_str().to_string())
                    }),
                },
                Err(_) => Exit { code: 1, signal: None },
            };
            ended_on_exit.cancel();
            let _ = tx.send(exit);
        });
        Ok(Self {
            group,
            master,
            io,
            exit: Some(rx),
            _network: network_guard,
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
    pub fn resize(&self, size: Size) -> io::Result<()> {
        set_size(&self.master, size)
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

/// A new pseudo-terminal: its master and its slave, both close-on-exec (a child gets the slave
/// only as its stdio, and no other child of the gateway gets either).
fn open_pty() -> io::Result<(PtyMaster, OwnedFd)> {
    let cannot = |e: nix::Error| io::Error::other(format!("cannot open a pseudo-terminal: {e}"));
    let master = nix::pty::posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC).map_err(cannot)?;
    nix::pty::grantpt(&master).map_err(cannot)?;
    nix::pty::unlockpt(&master).map_err(cannot)?;
    let name = nix::pty::ptsname_r(&master).map_err(cannot)?;
    let slave = nix::fcntl::open(
        name.as_str(),
        OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(cannot)?;
    Ok((master, slave))
}

/// Sets the terminal's size (`TIOCSWINSZ` on the master: the program gets `SIGWINCH`).
#[allow(
    unsafe_code,
    reason = "TIOCSWINSZ has no safe wrapper; it reads one winsize the call borrows, on a descriptor the master holds open"
)]
fn set_size(master: &PtyMaster, size: Size) -> io::Result<()> {
    let ws = nix::libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: the descriptor is open while `master` is borrowed, and `ws` outlives the call.
    if unsafe { nix::libc::ioctl(master.as_raw_fd(), nix::libc::TIOCSWINSZ, &ws) } == -1 {
        return Err(io::Error::other(format!(
            "cannot resize the terminal: {}",
            io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// A non-blocking duplicate of `master`'s descriptor, registered with tokio (the flag is the
/// open file's, which only this module reads and writes).
#[allow(
    unsafe_code,
    reason = "tokio's registration asks its caller to vouch for the descriptor (an OwnedFd: open, and the same, until dropped)"
)]
fn nonblocking_io(master: &PtyMaster) -> io::Result<AsyncFd<OwnedFd>> {
    // Close-on-exec (`F_DUPFD_CLOEXEC`): a plain `dup` would hand the user's terminal to every
    // agent process started after it.
    let fd = master.as_fd().try_clone_to_owned()?;
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
    fn the_meta_command_wins_else_the_agents_own_and_the_env_is_the_methods() {
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
        let program = claude.program(&agent);
        assert_eq!(program.command, "/usr/bin/node");
        assert_eq!(program.args, ["/x/claude-agent-acp", "--cli"]);
        let plain = TerminalMethod::find(Some(&m), "plain").expect("found");
        let program = plain.program(&agent);
        assert_eq!(program.command, "/opt/agent");
        assert_eq!(program.args, ["--acp", "--login"]);
        let mut env: Vec<(&str, &str)> = program.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        env.sort_unstable();
        assert_eq!(env, [("KEEP", "method"), ("MODE", "login")], "the method's own");
    }

    #[test]
    fn sizes_are_clamped() {
        let s = size(0, 1 << 40);
        assert_eq!((s.cols, s.rows), (1, MAX_CELLS));
        let s = size(80, 24);
        assert_eq!((s.cols, s.rows), (80, 24));
    }
}
