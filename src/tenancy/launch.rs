//! A program about to start for a user (an agent process or a terminal sign-in's login program),
//! and how it is started.
//!
//! What the programs outside the sandbox see is only what the gateway decided: bubblewrap runs
//! with `PATH` alone, and the agent's environment (the operator's `env`, the user's own keys, a
//! sign-in method's `env`) is handed to bubblewrap through a descriptor (`--args FD` with
//! `--clearenv` and `--setenv`), which it sets for the sandboxed program only. Nothing that came
//! from a user ever lands on a program that runs outside the sandbox, on a command line (where
//! every user of the host could read it), or in bubblewrap's own environment (where the dynamic
//! loader would act on an `LD_PRELOAD`).
//!
//! Every program starts as the leader of a session of its own (`setsid`), so none shares the
//! gateway's controlling terminal (no `TIOCSTI` into the operator's shell); its pid is its
//! process group's, which the pool kills as one.
//!
//! With `network = "egress-only"` bubblewrap also gets a network namespace and the descriptors
//! the gateway sets that namespace up through before the program runs ([`super::network`]).

use std::collections::BTreeMap;
use std::ffi::{CStr, OsString};
use std::io::{self, Seek, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::Arc;

use super::network::{self, Pending, Tools};

/// What a started program is for: it decides who owns the terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// An agent process on pipes: a session of its own with no terminal at all.
    Agent,
    /// A login program in a pseudo-terminal on its stdin, which becomes its controlling
    /// terminal (the user's own terminal, in the browser).
    Login,
}

/// A program about to start: where, with what, and how it is confined.
pub struct Launch {
    /// What the gateway runs: bubblewrap, or the program itself when unsandboxed.
    program: PathBuf,
    /// bubblewrap's arguments before the program (none when unsandboxed).
    sandbox: Vec<OsString>,
    /// The program's own command line (after `--` under bubblewrap).
    command_line: Vec<OsString>,
    /// The program's environment: set inside the sandbox, or on the program when unsandboxed.
    env: BTreeMap<OsString, OsString>,
    /// The working directory, when unsandboxed (bubblewrap's `--chdir` otherwise).
    cwd: Option<PathBuf>,
    /// Who owns the terminal.
    purpose: Purpose,
    /// Whether it runs in the bubblewrap sandbox.
    pub sandboxed: bool,
    /// With `network = "egress-only"` (sandboxed only): the tools its network is set up with.
    egress: Option<Arc<Tools>>,
}

impl std::fmt::Debug for Launch {
    /// Names the environment's variables, never their values (users' keys are among them).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launch")
            .field("program", &self.program)
            .field("command_line", &self.command_line)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("cwd", &self.cwd)
            .field("purpose", &self.purpose)
            .field("sandboxed", &self.sandboxed)
            .finish_non_exhaustive()
    }
}

/// A launch ready to spawn: the command, the descriptors meant for bubblewrap, and the
/// gateway's side of an egress-only sandbox's network.
#[derive(Debug)]
pub struct Ready<C> {
    /// Program, arguments, working directory, environment and the steps before `exec` set.
    pub command: C,
    /// Descriptors for the child only (bubblewrap's `--args`, and with egress-only its
    /// `--info-fd`, `--block-fd` and resolv.conf): kept open until the spawn is done, then
    /// dropped.
    pub child_fds: Vec<OwnedFd>,
    /// With egress-only: what sets the sandbox's network up once it is spawned
    /// ([`Pending::run`]); until then bubblewrap holds the program back.
    pub network: Option<Pending>,
}

impl Launch {
    /// `program` run as it is, with `args`, in a clean environment but for `PATH`, as an agent:
    /// for tests of the pool's process handling.
    pub fn direct(program: impl Into<PathBuf>, args: &[&str]) -> Self {
        let command_line = std::iter::once(program.into().into_os_string())
            .chain(args.iter().map(OsString::from))
            .collect();
        let env = std::env::var_os("PATH")
            .map(|p| (OsString::from("PATH"), p))
            .into_iter()
            .collect();
        Self::unsandboxed(command_line, env, None, Purpose::Agent)
    }

    /// bubblewrap at `bwrap` with `sandbox` arguments, around `command_line`.
    pub(super) fn sandboxed(
        bwrap: PathBuf,
        sandbox: Vec<OsString>,
        command_line: Vec<OsString>,
        env: BTreeMap<OsString, OsString>,
        purpose: Purpose,
    ) -> Self {
        Self {
            program: bwrap,
            sandbox,
            command_line,
            env,
            cwd: None,
            purpose,
            sandboxed: true,
            egress: None,
        }
    }

    /// `command_line` run as it is, in `cwd` (`None`: the gateway's).
    pub(super) fn unsandboxed(
        command_line: Vec<OsString>,
        env: BTreeMap<OsString, OsString>,
        cwd: Option<PathBuf>,
        purpose: Purpose,
    ) -> Self {
        Self {
            program: command_line.first().cloned().unwrap_or_default().into(),
            sandbox: Vec::new(),
            command_line,
            env,
            cwd,
            purpose,
            sandboxed: false,
            egress: None,
        }
    }

    /// In a network namespace of its own whose only way out is set up with `tools`
    /// (`network = "egress-only"`; only for a sandboxed launch).
    pub(super) fn with_egress(mut self, tools: Arc<Tools>) -> Self {
        debug_assert!(self.sandboxed, "egress-only needs the sandbox");
        self.egress = Some(tools);
        self
    }

    /// Whether it gets the egress-only network.
    pub fn egress_only(&self) -> bool {
        self.egress.is_some()
    }

    /// Adds a variable that did not come from the operator's configuration (a user's key, a
    /// sign-in method's `env`), if a user may set it ([`user_may_set`](super::user_may_set):
    /// not the loader's, not one the gateway sets). Whether it was taken.
    pub fn set_user_env(&mut self, name: &str, value: &str) -> bool {
        // A NUL would end the value early in bubblewrap's `--args` list and start an option of
        // the caller's choosing (a `--bind` of the data directory); no variable can hold one.
        let ok = super::user_may_set(name) && !value.contains('\0');
        if ok {
            self.env.insert(name.into(), value.into());
        }
        ok
    }

    /// The program's environment (for tests and logs of names).
    pub fn env(&self) -> &BTreeMap<OsString, OsString> {
        &self.env
    }

    /// The program's own command line.
    pub fn command_line(&self) -> &[OsString] {
        &self.command_line
    }

    /// As a `std` command (the terminal sign-in waits for it on a blocking thread).
    pub fn into_std(self) -> io::Result<Ready<std::process::Command>> {
        let mut command;
        let mut child_fds = Vec::new();
        let mut pending = None;
        if self.sandboxed {
            command = std::process::Command::new(&self.program);
            command.args(&self.sandbox);
            if let Some(tools) = &self.egress {
                let (args, fds, gateway_side) = network::prepare(tools.clone())?;
                command.args(args);
                child_fds.extend(fds);
                pending = Some(gateway_side);
            }
            let fd = env_descriptor(&self.env)?;
            command
                .arg("--args")
                .arg(fd.as_raw_fd().to_string())
                .arg("--")
                .args(&self.command_line);
            command.env_clear();
            if let Some(path) = std::env::var_os("PATH") {
                command.env("PATH", path);
            }
            child_fds.push(fd);
        } else {
            command = std::process::Command::new(&self.program);
            command
                .args(self.command_line.iter().skip(1))
                .env_clear()
                .envs(&self.env);
        }
        if let Some(cwd) = &self.cwd {
            command.current_dir(cwd);
        }
        let keep = child_fds.iter().map(AsRawFd::as_raw_fd).collect();
        before_exec(&mut command, self.purpose, self.sandboxed, keep);
        Ok(Ready {
            command,
            child_fds,
            network: pending,
        })
    }

    /// As a `tokio` command (agent processes on pipes).
    pub fn into_tokio(self) -> io::Result<Ready<tokio::process::Command>> {
        let Ready {
            command,
            child_fds,
            network,
        } = self.into_std()?;
        Ok(Ready {
            command: tokio::process::Command::from(command),
            child_fds,
            network,
        })
    }
}

/// A memory file holding bubblewrap's `--clearenv` and a `--setenv NAME VALUE` for each of
/// `env`, NUL-separated, read from its start (close-on-exec: only the child it is meant for
/// keeps it, see [`before_exec`]).
fn env_descriptor(env: &BTreeMap<OsString, OsString>) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let mut buf = Vec::with_capacity(64 + env.iter().map(|(k, v)| k.len() + v.len() + 12).sum::<usize>());
    buf.extend_from_slice(b"--clearenv\0");
    for (name, value) in env {
        // The list is NUL-separated: a NUL inside would make the rest of it options.
        if name.as_bytes().contains(&0) || value.as_bytes().contains(&0) || name.as_bytes().contains(&b'=') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the agent's environment variable {:?} has a NUL or `=` in it",
                    name.to_string_lossy()
                ),
            ));
        }
        buf.extend_from_slice(b"--setenv\0");
        buf.extend_from_slice(name.as_bytes());
        buf.push(0);
        buf.extend_from_slice(value.as_bytes());
        buf.push(0);
    }
    memory_file(c"acp-gateway-agent-env", &buf)
}

/// A memory file (close-on-exec) holding `bytes`, read from its start.
pub(super) fn memory_file(name: &CStr, bytes: &[u8]) -> io::Result<OwnedFd> {
    let fd = nix::sys::memfd::memfd_create(name, nix::sys::memfd::MFdFlags::MFD_CLOEXEC).map_err(|e| {
        io::Error::other(format!(
            "cannot create a memory file for the sandbox ({}): {e}",
            name.to_string_lossy()
        ))
    })?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes)?;
    file.rewind()?;
    Ok(OwnedFd::from(file))
}

/// The steps between `fork` and `exec`: a session of its own (and, for a login program, its
/// terminal as the controlling one); for bubblewrap, the descriptors in `keep` kept open in the
/// child only; for an unsandboxed program, SIGKILL when the gateway dies (bubblewrap's
/// `--die-with-parent` does that inside the sandbox).
#[allow(
    unsafe_code,
    reason = "pre_exec runs between fork and exec; the closure only makes async-signal-safe system calls (setsid, ioctl, fcntl, prctl, getppid) and allocates nothing"
)]
fn before_exec(command: &mut std::process::Command, purpose: Purpose, sandboxed: bool, keep: Vec<RawFd>) {
    use std::os::unix::process::CommandExt;
    let gateway = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec; every call in it is
    // async-signal-safe, and nothing here allocates or takes a lock.
    unsafe {
        command.pre_exec(move || {
            nix::unistd::setsid()?;
            if purpose == Purpose::Login {
                // stdin is the pseudo-terminal: it becomes this session's controlling terminal.
                if nix::libc::ioctl(0, nix::libc::TIOCSCTTY, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
            }
            keep_open(&keep)?;
            if !sandboxed {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
                // The gateway may have died between fork and prctl: then nothing would fire.
                if nix::unistd::getppid() != gateway {
                    return Err(io::Error::other("the gateway is gone"));
                }
            }
            Ok(())
        });
    }
}

/// In the child only: its copies of `fds` survive exec (they are close-on-exec in the gateway,
/// so no other child gets them). Async-signal-safe: for a `pre_exec` closure.
#[allow(
    unsafe_code,
    reason = "fcntl(F_SETFD) on a raw descriptor number: a pre_exec closure has no owned descriptors to borrow"
)]
fn keep_open(fds: &[RawFd]) -> io::Result<()> {
    for &fd in fds {
        // SAFETY: F_SETFD on a descriptor number only changes that descriptor's flags.
        if unsafe { nix::libc::fcntl(fd, nix::libc::F_SETFD, 0) } == -1 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Makes `command` (a helper the gateway runs outside any sandbox, such as slirp4netns) keep
/// `fds` open across exec, in that child only.
#[allow(
    unsafe_code,
    reason = "pre_exec runs between fork and exec; the closure only calls fcntl on the listed descriptors and allocates nothing"
)]
pub(super) fn keep_in_child(command: &mut std::process::Command, fds: Vec<RawFd>) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only calls fcntl.
    unsafe {
        command.pre_exec(move || keep_open(&fds));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nul_never_reaches_bubblewraps_option_list() {
        let mut launch = Launch::direct("true", &[]);
        assert!(!launch.set_user_env("TOKEN", "x\0--bind\0/data\0/data"));
        assert!(launch.set_user_env("TOKEN", "fine"));
        let mut env = BTreeMap::new();
        env.insert(OsString::from("A"), OsString::from("x\0--bind\0/\0/"));
        assert!(env_descriptor(&env).is_err());
        assert!(format!("{launch:?}").contains("TOKEN") && !format!("{launch:?}").contains("fine"));
    }
}
