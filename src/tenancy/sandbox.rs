//! The bubblewrap sandbox around an agent process, and the kernel's kill of an unsandboxed agent
//! when the gateway dies.
//!
//! What a sandboxed agent sees, in the order bubblewrap mounts it (a later mount covers an earlier
//! one): the system read-only; the workspace roots that lie in plain sight read-write (a root of
//! `/` included); its own `/dev`, `/proc` and, unless a root holds them, a private `/tmp` and an
//! empty `/run` (no host sockets); the
//! hidden directories (the data directory, the SQLite file's directory, the directories of every
//! user's homes and workspaces) as empty tmpfs; then its user's own home and roots inside them;
//! then the regular files the operator's command line for the agent names in hidden places,
//! read-only; last, the hidden files (the configuration file) covered by `/dev/null`, which cannot
//! be opened there (bubblewrap binds it `nodev`). An agent process
//! also gets a session of its own (`--new-session`): no terminal to push keystrokes into.
//!
//! The network stays on: the sandbox shares the host's network namespace, so an agent reaches
//! what the gateway's OS user reaches, the host's loopback services (the gateway's own port,
//! a local database) and the cloud metadata endpoint included. `network = "egress-only"` gives
//! it a network namespace of its own with a way out to the internet only ([`super::network`]).

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

use super::launch::Purpose;
use super::paths::resolve_existing;
use crate::infra::config::AgentConfig;

/// What every sandbox starts with: death with the gateway, its own PID and IPC namespaces, no
/// capabilities (the gateway may run as root, and bubblewrap keeps a root caller's capabilities
/// unless told), and the system read-only.
const BASE: [&str; 8] = [
    "--die-with-parent",
    "--unshare-pid",
    "--unshare-ipc",
    "--cap-drop",
    "ALL",
    "--ro-bind",
    "/",
    "/",
];

/// systemd-resolved's directory, where `/etc/resolv.conf` usually links: name lookups keep working
/// under an empty `/run`.
const RESOLVED: &str = "/run/systemd/resolve";

/// Its own `/dev` and `/proc` (after any root bound over `/`).
const PRIVATE: [&str; 4] = ["--dev", "/dev", "--proc", "/proc"];

/// The places an agent's sandbox is built from.
#[derive(Debug)]
pub(super) struct Places<'a> {
    /// Shown as empty directories: the data directory and the like.
    pub hidden: &'a [PathBuf],
    /// Covered by `/dev/null`: the configuration file.
    pub hidden_files: &'a [PathBuf],
    /// The agent's `HOME`.
    pub home: &'a Path,
    /// Its workspace roots, read-write.
    pub roots: &'a [PathBuf],
    /// Its working directory.
    pub cwd: &'a Path,
}

impl Places<'_> {
    /// Whether the sandbox gets a private `/tmp`: unless a root is `/tmp` or holds it (the
    /// operator shared it, so the agent works in the real one).
    fn private_tmp(&self) -> bool {
        !self.roots.iter().any(|r| Path::new("/tmp").starts_with(r))
    }

    /// Whether the sandbox gets an empty `/run`: unless a root is `/run` or holds it. `/run`
    /// holds the host's Unix sockets (the D-Bus buses, systemd's, Docker's and podman's, a local
    /// Postgres with `peer` authentication, ssh and gpg agents): a read-only bind does not stop a
    /// `connect()`, and the agent is the gateway's own OS user. Only systemd-resolved's directory
    /// comes back (read-only), for `/etc/resolv.conf`'s usual link.
    fn private_run(&self) -> bool {
        !self.roots.iter().any(|r| Path::new("/run").starts_with(r))
    }

    /// Whether `path` is out of sight before the user's own places are bound back in.
    fn hides(&self, path: &Path) -> bool {
        (self.private_tmp() && path.starts_with("/tmp"))
            || (self.private_run() && path.starts_with("/run"))
            || self.hidden.iter().any(|h| path.starts_with(h))
    }
}

/// bubblewrap's arguments for a program of `agent` (see the module's doc for what each layer
/// is); `agent` is the operator's configuration, whatever program runs.
pub(super) fn bwrap_args(places: &Places<'_>, agent: &AgentConfig, purpose: Purpose) -> Vec<OsString> {
    let bind = |args: &mut Vec<OsString>, flag: &str, dir: &Path| {
        args.extend([flag.into(), dir.as_os_str().to_owned(), dir.as_os_str().to_owned()]);
    };
    let mut args: Vec<OsString> = BASE.iter().map(OsString::from).collect();
    // A login program keeps the pseudo-terminal the gateway made its controlling one.
    if purpose == Purpose::Agent {
        args.push("--new-session".into());
    }
    let mut roots: Vec<&Path> = places.roots.iter().map(PathBuf::as_path).collect();
    // Outer before inner, so that a root inside another is not covered by it.
    roots.sort_by_key(|r| r.components().count());
    let (hidden_roots, open_roots): (Vec<&Path>, Vec<&Path>) = roots.into_iter().partition(|r| places.hides(r));
    for root in open_roots {
        bind(&mut args, "--bind", root);
    }
    args.extend(PRIVATE.iter().map(OsString::from));
    if places.private_tmp() {
        args.extend(["--tmpfs".into(), "/tmp".into()]);
    }
    if places.private_run() {
        args.extend(["--tmpfs".into(), "/run".into()]);
        if Path::new(RESOLVED).is_dir() {
            bind(&mut args, "--ro-bind", Path::new(RESOLVED));
        }
    }
    for dir in places.hidden {
        args.extend(["--tmpfs".into(), dir.clone().into_os_string()]);
    }
    for dir in std::iter::once(places.home).chain(hidden_roots) {
        bind(&mut args, "--bind", dir);
    }
    for file in named_files(places, agent) {
        bind(&mut args, "--ro-bind", &file);
    }
    for file in places.hidden_files.iter().filter(|f| !places.hides(f)) {
        args.extend(["--ro-bind".into(), "/dev/null".into(), file.clone().into_os_string()]);
    }
    args.extend(["--chdir".into(), places.cwd.as_os_str().to_owned()]);
    args
}

/// The absolute paths a command line names: its program, its arguments, and the paths inside a
/// `sh -c` script.
fn named_paths<'a>(command: &'a String, args: &'a [String]) -> impl Iterator<Item = PathBuf> + 'a {
    let separators = |c: char| c.is_whitespace() || "'\";&|<>()=`:".contains(c);
    std::iter::once(command)
        .chain(args)
        .flat_map(move |arg| arg.split(separators))
        .filter(|token| token.starts_with('/'))
        .map(PathBuf::from)
}

/// The regular files the agent's command line names (its program, a script) in places the
/// sandbox hides, such as `/tmp`: the operator named them, so the agent gets them, read-only.
/// Never a directory: a wrapper that `cd`s somewhere under a hidden directory must not open it.
fn named_files(places: &Places<'_>, agent: &AgentConfig) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = named_paths(&agent.command, &agent.args)
        .filter(|p| places.hides(p) && std::fs::metadata(p).is_ok_and(|m| m.is_file()))
        .collect();
    files.sort();
    files.dedup();
    files
}

/// Refuses a command line (of `what`: `agents.NAME`, a sign-in method) that names anything inside
/// `secret` (the data directory, the SQLite database, the configuration file): agents never see
/// them, whatever their command line says. The message names who, the path and what to change.
pub(super) fn refuse_secret_paths(what: &str, command: &String, args: &[String], secret: &[PathBuf]) -> io::Result<()> {
    for path in named_paths(command, args) {
        let resolved = resolve_existing(&path).unwrap_or_else(|_| path.clone());
        if let Some(inside) = secret.iter().find(|s| path.starts_with(s) || resolved.starts_with(s)) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{what}: its command line names {}, inside {}, which agent processes never see \
                     (it holds the gateway's secrets, configuration or database); move that file out of \
                     it and change {what}'s command line{}",
                    path.display(),
                    inside.display(),
                    if what.starts_with("agents.") {
                        " (command/args, or ACP_GATEWAY_AGENT)"
                    } else {
                        ""
                    }
                ),
            ));
        }
    }
    Ok(())
}

/// The arguments of a sandbox with nothing of anyone's in it (for the start-up probes).
pub(super) fn probe_args() -> Vec<OsString> {
    BASE.iter().chain(&PRIVATE).map(OsString::from).collect()
}

/// bubblewrap's path, if it can build the sandbox the gateway uses on this host.
pub(super) fn probe_bwrap() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    let bwrap = std::env::split_paths(&path)
        .map(|d| d.join("bwrap"))
        .find(|p| p.is_file())?;
    let ok = std::process::Command::new(&bwrap)
        .args(BASE)
        .args(PRIVATE)
        .args(["--", "true"])
        .env_clear()
        .env("PATH", &path)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(bwrap)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(script: &str) -> AgentConfig {
        AgentConfig {
            command: "sh".into(),
            args: vec!["-c".into(), script.into()],
            ..Default::default()
        }
    }

    #[test]
    fn only_regular_files_in_hidden_places_are_bound_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let hidden_dir = dir.path().join("hidden");
        std::fs::create_dir_all(hidden_dir.join("sub")).expect("mkdir");
        let bin = hidden_dir.join("agent-bin");
        std::fs::write(&bin, "").expect("write");
        let hidden = [hidden_dir.clone()];
        let places = Places {
            hidden: &hidden,
            hidden_files: &[],
            home: Path::new("/nonexistent-home"),
            roots: &[],
            cwd: Path::new("/"),
        };
        let script = format!(
            "cd {}/sub && exec \"{}\" demo-agent; cat /etc/hostname",
            hidden_dir.display(),
            bin.display()
        );
        // The directory the wrapper enters is not bound; the program is; /etc is in plain sight.
        assert_eq!(named_files(&places, &agent(&script)), vec![bin]);
    }

    #[test]
    fn the_secret_places_are_refused_whatever_the_command_line_says() {
        let data = PathBuf::from("/srv/acp-data");
        let secret = [data.clone()];
        for script in [
            "cd /srv/acp-data/homes && exec agent",
            "exec /srv/acp-data/x",
            "X=/srv/acp-data exec a",
        ] {
            let a = agent(script);
            let err = refuse_secret_paths("agents.default", &a.command, &a.args, &secret).expect_err(script);
            let text = err.to_string();
            assert!(
                text.contains("agents.default") && text.contains("/srv/acp-data"),
                "{text}"
            );
        }
        let a = agent("exec /tmp/agent.sh /srv/acp-database");
        refuse_secret_paths("agents.default", &a.command, &a.args, &secret).expect("a neighbour");
    }

    #[test]
    fn roots_are_bound_where_nothing_covers_them_and_the_data_stays_hidden() {
        let hidden = [PathBuf::from("/d/data"), PathBuf::from("/d/data/workspaces")];
        let roots = [PathBuf::from("/"), PathBuf::from("/d/data/workspaces/alice")];
        let config = [PathBuf::from("/etc/acp/config.toml")];
        let places = Places {
            hidden: &hidden,
            hidden_files: &config,
            home: Path::new("/d/data/homes/alice"),
            roots: &roots,
            cwd: Path::new("/d/data/workspaces/alice"),
        };
        let args: Vec<String> = bwrap_args(&places, &AgentConfig::default(), Purpose::Agent)
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let at = |needle: &[&str]| {
            args.windows(needle.len())
                .position(|w| w == needle)
                .unwrap_or_else(|| panic!("{needle:?} not in {args:?}"))
        };
        let root = at(&["--bind", "/", "/"]);
        let proc = at(&["--proc", "/proc"]);
        let data = at(&["--tmpfs", "/d/data"]);
        let home = at(&["--bind", "/d/data/homes/alice", "/d/data/homes/alice"]);
        let own = at(&["--bind", "/d/data/workspaces/alice", "/d/data/workspaces/alice"]);
        assert!(root < proc && proc < data && data < home && data < own, "{args:?}");
        // The config file is covered, over everything bound before it.
        let config = at(&["--ro-bind", "/dev/null", "/etc/acp/config.toml"]);
        assert!(config > own && config > home, "{args:?}");
        assert!(args.iter().any(|a| a == "--new-session"), "{args:?}");
        // `/` holds /tmp: the agent works in the real one.
        assert!(!args.windows(2).any(|w| w == ["--tmpfs", "/tmp"]), "{args:?}");
    }
}
