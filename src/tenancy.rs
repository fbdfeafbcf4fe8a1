//! What a user's agent process can reach (the contract's "Tenancy").
//!
//! Coding agents run shell commands on this host, so whatever the gateway keeps from a user it
//! must keep from that user's agent processes too:
//! - a clean environment: `PATH`, `LANG`, `LC_ALL`, `TERM`, `TZ` from the gateway's, `HOME`,
//!   `USER`, `TMPDIR` set per user, the agent's `env` and `pass_env`; nothing else;
//! - the user's own `HOME` (agent logins belong to one user) and workspace roots, created `0700`;
//! - working directories resolved (`..`, symlinks) and kept inside the user's roots;
//! - with bubblewrap, a sandbox that sees the system read-only, its user's home and roots
//!   read-write, a private `/tmp`, its own PID namespace, no capabilities, and nothing of the
//!   gateway's data directory, database or other users' homes.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::io;

use std::path::{Component, Path, PathBuf};

use agent_client_protocol_schema::v1::McpServer;

use crate::config::{AgentConfig, Config, SandboxMode};
use crate::files::private_dir;

/// The home of processes that serve several users (`share_between_users`).
pub const SHARED_HOME: &str = "_shared";

/// The sandbox every agent process gets (before its own binds): the system read-only, a private
/// `/tmp`, `/dev` and `/proc` of its own PID and IPC namespaces, no capabilities (the gateway may
/// run as root, and bubblewrap keeps a root caller's capabilities unless told), and death with
/// the gateway.
const SANDBOX: [&str; 14] = [
    "--die-with-parent",
    "--unshare-pid",
    "--unshare-ipc",
    "--cap-drop",
    "ALL",
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "--tmpfs",
    "/tmp",
];

/// Variables an agent inherits from the gateway's environment, when set.
const INHERITED_ENV: [&str; 5] = ["PATH", "LANG", "LC_ALL", "TERM", "TZ"];

/// A JWT `sub` made filesystem-safe: every byte outside `[A-Za-z0-9_-]` becomes `%XX`
/// (upper-case hex). One-to-one, and never `.`, `..` or a path with `/`.
pub fn escape_user(sub: &str) -> String {
    let mut out = String::with_capacity(sub.len());
    for b in sub.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The per-user places and the confinement of agent processes, set up once at start.
#[derive(Debug)]
pub struct Tenancy {
    /// The gateway's data directory, absolute.
    data_dir: PathBuf,
    /// `user_homes`, with `{data_dir}` filled in.
    homes: String,
    /// `workspace_roots`, with `{data_dir}` filled in.
    roots: Vec<String>,
    /// bubblewrap, when it works on this host.
    bwrap: Option<PathBuf>,
    /// What a sandbox never sees: the data directory, the SQLite file's directory, and the
    /// directories that hold every user's homes and workspaces (a user's own are bound back in).
    hidden: Vec<PathBuf>,
}

/// An agent process about to start: the command (bubblewrap around the agent when sandboxed).
#[derive(Debug)]
pub struct Launch {
    /// Ready to spawn: program, arguments, environment and working directory set.
    pub command: tokio::process::Command,
    /// Whether it runs in the bubblewrap sandbox.
    pub sandboxed: bool,
}

impl Tenancy {
    /// Resolves the data directory (created `0700`) and the templates, and probes bubblewrap.
    /// Fails when an agent requires `sandbox = "bwrap"` and bubblewrap does not work here.
    pub fn new(config: &Config) -> io::Result<Self> {
        private_dir(&config.data_dir)?;
        let data_dir = config.data_dir.canonicalize()?;
        let data = data_dir.to_string_lossy();
        let homes = config.user_homes.replace("{data_dir}", &data);
        let roots: Vec<String> = config
            .workspace_roots
            .iter()
            .map(|r| r.replace("{data_dir}", &data))
            .collect();
        let wants_bwrap = config.agents.values().any(|a| a.sandbox != SandboxMode::None);
        let bwrap = if wants_bwrap { probe_bwrap() } else { None };
        for (name, agent) in &config.agents {
            match (agent.sandbox, &bwrap) {
                (SandboxMode::Bwrap, None) => {
                    return Err(io::Error::other(format!(
                        "agents.{name}.sandbox = \"bwrap\", but bubblewrap does not work on this host (install the `bubblewrap` package; in a container it needs user namespaces or CAP_SYS_ADMIN)"
                    )));
                }
                (SandboxMode::Auto, None) => tracing::warn!(
                    agent = %name,
                    "bubblewrap does not work on this host: agent processes run unsandboxed (clean environment, own HOME and workspace checks only)"
                ),
                _ => {}
            }
        }
        let mut hidden = vec![data_dir.clone()];
        if let Some(db) = config.database_url.strip_prefix("sqlite://")
            && let Some(dir) = Path::new(db.split('?').next().unwrap_or(db)).parent()
            && let Ok(dir) = dir.canonicalize()
        {
            hidden.push(dir);
        }
        hidden.extend(std::iter::once(&homes).chain(&roots).filter_map(|t| user_base(t)));
        hidden.retain(|p| p != Path::new("/"));
        hidden.sort();
        hidden.dedup();
        Ok(Self {
            data_dir,
            homes,
            roots,
            bwrap,
            hidden,
        })
    }

    /// Whether an agent with `mode` runs sandboxed here.
    pub fn sandboxed(&self, mode: SandboxMode) -> bool {
        mode != SandboxMode::None && self.bwrap.is_some()
    }

    /// The agents that asked for a sandbox (`auto`) and run without one, for `/readyz`.
    pub fn unsandboxed<'a>(&self, config: &'a Config) -> Vec<&'a str> {
        config
            .agents
            .iter()
            .filter(|(_, a)| a.sandbox == SandboxMode::Auto && !self.sandboxed(a.sandbox))
            .map(|(n, _)| n.as_str())
            .collect()
    }

    /// The user's agent `HOME` (or the shared one), created `0700` on first use.
    pub fn home(&self, user: Option<&str>) -> io::Result<PathBuf> {
        let dir = match user {
            Some(user) => fill(&self.homes, &checked_user(user)?),
            None => fill(&self.homes, SHARED_HOME),
        };
        private_dir(&dir)?;
        Ok(dir)
    }

    /// The user's workspace roots, created `0700` on first use (those with `{user}` in them)
    /// and resolved (symlinks), in configured order.
    pub fn roots(&self, user: &str) -> io::Result<Vec<PathBuf>> {
        let user = checked_user(user)?;
        let mut out = Vec::with_capacity(self.roots.len());
        for template in &self.roots {
            let dir = fill(template, &user);
            if template.contains("{user}") {
                private_dir(&dir)?;
            }
            match dir.canonicalize() {
                Ok(dir) => out.push(dir),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    tracing::warn!(root = %dir.display(), "workspace root does not exist; skipped");
                }
                Err(e) => return Err(e),
            }
        }
        if out.is_empty() {
            return Err(io::Error::other("no workspace root of this user exists"));
        }
        Ok(out)
    }

    /// `path` resolved (`.`, `..`, symlinks) if it is absolute and inside one of `user`'s roots;
    /// else a message naming the roots. A path that does not exist yet is resolved as far as it
    /// exists, the rest taken as written (after `..` is folded).
    pub fn resolve(&self, user: &str, path: &str) -> Result<PathBuf, String> {
        let roots = self
            .roots(user)
            .map_err(|e| format!("your workspace roots are not available: {e}"))?;
        let allowed = || {
            roots
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let requested = Path::new(path);
        if !requested.is_absolute() {
            return Err(format!(
                "{path:?} is not an absolute path; allowed roots: {}",
                allowed()
            ));
        }
        let resolved = resolve_existing(requested).map_err(|e| format!("cannot resolve {path:?}: {e}"))?;
        if roots.iter().any(|r| resolved.starts_with(r)) {
            Ok(resolved)
        } else {
            Err(format!(
                "{path:?} is outside your workspace roots; allowed roots: {}",
                allowed()
            ))
        }
    }

    /// The command that starts one process of `agent` for `user` (`None`: a shared process).
    pub fn launch(&self, agent: &AgentConfig, user: Option<&str>) -> io::Result<Launch> {
        let home = self.home(user)?;
        let roots = match user {
            Some(user) => self.roots(user)?,
            None => self.shared_roots()?,
        };
        let sandboxed = self.sandboxed(agent.sandbox);
        let tmpdir = if sandboxed {
            PathBuf::from("/tmp")
        } else {
            let tmp = home.join(".tmp");
            private_dir(&tmp)?;
            tmp
        };
        let cwd = agent
            .cwd
            .clone()
            .or_else(|| user.and(roots.first().cloned()))
            .unwrap_or_else(|| home.clone());
        let mut env: BTreeMap<OsString, OsString> = BTreeMap::new();
        for name in INHERITED_ENV
            .iter()
            .copied()
            .chain(agent.pass_env.iter().map(String::as_str))
        {
            if let Some(value) = std::env::var_os(name) {
                env.insert(name.into(), value);
            }
        }
        for (k, v) in &agent.env {
            env.insert(k.into(), v.into());
        }
        env.insert("HOME".into(), home.clone().into_os_string());
        env.insert(
            "USER".into(),
            user.map_or_else(|| SHARED_HOME.to_string(), escape_user).into(),
        );
        env.insert("TMPDIR".into(), tmpdir.into_os_string());
        let mut command = match (&self.bwrap, sandboxed) {
            (Some(bwrap), true) => {
                let mut c = tokio::process::Command::new(bwrap);
                c.args(self.bwrap_args(&home, &roots, &cwd, agent));
                c.arg("--").arg(&agent.command).args(&agent.args);
                c
            }
            _ => {
                let mut c = tokio::process::Command::new(&agent.command);
                c.args(&agent.args).current_dir(&cwd);
                die_with_gateway(&mut c);
                c
            }
        };
        command.env_clear().envs(env);
        Ok(Launch { command, sandboxed })
    }

    /// bubblewrap's arguments: the system read-only, the hidden directories empty, the user's
    /// home and roots read-write, a private `/tmp`, `/dev` and `/proc` of its own PID namespace,
    /// no capabilities (the gateway may run as root), and death with the gateway. The agent's
    /// own program (and any file its arguments name) is bound back read-only when it lives in a
    /// place the sandbox hides, such as `/tmp`.
    fn bwrap_args(&self, home: &Path, roots: &[PathBuf], cwd: &Path, agent: &AgentConfig) -> Vec<OsString> {
        let mut args: Vec<OsString> = SANDBOX.iter().map(OsString::from).collect();
        for dir in &self.hidden {
            args.extend(["--tmpfs".into(), dir.clone().into_os_string()]);
        }
        for dir in std::iter::once(home).chain(roots.iter().map(PathBuf::as_path)) {
            args.extend(["--bind".into(), dir.as_os_str().to_owned(), dir.as_os_str().to_owned()]);
        }
        for file in self.named_files(agent) {
            args.extend([
                "--ro-bind".into(),
                file.as_os_str().to_owned(),
                file.as_os_str().to_owned(),
            ]);
        }
        args.extend(["--chdir".into(), cwd.as_os_str().to_owned()]);
        args
    }

    /// The files the agent's command line names (its program, its arguments, and absolute paths
    /// inside a `sh -c` script) that exist in places the sandbox hides (`/tmp`, the gateway's
    /// data): the operator named them, so the agent gets them, read-only.
    fn named_files(&self, agent: &AgentConfig) -> Vec<PathBuf> {
        let hidden = |p: &Path| p.starts_with("/tmp") || self.hidden.iter().any(|h| p.starts_with(h));
        let separators = |c: char| c.is_whitespace() || "'\";&|<>()=`".contains(c);
        let mut files: Vec<PathBuf> = std::iter::once(&agent.command)
            .chain(&agent.args)
            .flat_map(|arg| arg.split(separators))
            .filter(|token| token.starts_with('/'))
            .map(PathBuf::from)
            .filter(|p| hidden(p) && p.exists())
            .collect();
        files.sort();
        files.dedup();
        files
    }

    /// For a shared process: the directories holding every user's workspaces (it serves them
    /// all), and the roots without `{user}`.
    fn shared_roots(&self) -> io::Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        for template in &self.roots {
            let dir = user_base(template).unwrap_or_else(|| PathBuf::from(template));
            private_dir(&dir)?;
            out.push(dir.canonicalize()?);
        }
        Ok(out)
    }

    /// The gateway's data directory (absolute).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }
}

/// What kinds of MCP server an agent said it can connect to (`mcpCapabilities`).
#[derive(Debug, Clone, Copy, Default)]
pub struct McpTransports {
    /// `mcpCapabilities.http`.
    pub http: bool,
    /// `mcpCapabilities.sse`.
    pub sse: bool,
}

/// Checks a client's `mcpServers` before they reach `agent`: a `stdio` entry is a command the
/// agent runs on this host, so only commands in `allowed_stdio_mcp` pass; `http`/`sse` entries
/// pass when the agent advertises that transport. The error names the refused entry.
pub fn check_mcp_servers(servers: &[McpServer], agent: &AgentConfig, can: McpTransports) -> Result<(), String> {
    for (i, server) in servers.iter().enumerate() {
        match server {
            McpServer::Stdio(stdio) => {
                let command = stdio.command.to_string_lossy();
                if !agent.allowed_stdio_mcp.iter().any(|c| *c == command) {
                    return Err(format!(
                        "mcpServers[{i}] ({:?}): stdio MCP server {command:?} is not allowed on this gateway (allowed: {:?})",
                        stdio.name, agent.allowed_stdio_mcp
                    ));
                }
            }
            McpServer::Http(_) if can.http => {}
            McpServer::Sse(_) if can.sse => {}
            McpServer::Http(http) => {
                return Err(format!(
                    "mcpServers[{i}] ({:?}): this agent does not support http MCP servers",
                    http.name
                ));
            }
            McpServer::Sse(sse) => {
                return Err(format!(
                    "mcpServers[{i}] ({:?}): this agent does not support sse MCP servers",
                    sse.name
                ));
            }
            _ => {
                return Err(format!(
                    "mcpServers[{i}]: an MCP transport this gateway does not pass on"
                ));
            }
        }
    }
    Ok(())
}

/// Asks the kernel to SIGKILL the agent when the gateway dies, however it dies (bubblewrap's
/// `--die-with-parent` does the same for sandboxed agents). The agent's own children are killed
/// with its process group on every orderly exit, and by the next start's reaper otherwise
/// (`pool::reaper`).
#[allow(
    unsafe_code,
    reason = "pre_exec runs between fork and exec; the closure only makes async-signal-safe system calls (prctl, getppid) and allocates nothing"
)]
fn die_with_gateway(command: &mut tokio::process::Command) {
    let gateway = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec; prctl(PR_SET_PDEATHSIG) and
    // getppid are async-signal-safe, and nothing here allocates or takes a lock.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
            // The gateway may have died between fork and prctl: then nothing would fire.
            if nix::unistd::getppid() != gateway {
                return Err(io::Error::other("the gateway is gone"));
            }
            Ok(())
        });
    }
}

/// `template` with `{user}` filled in.
fn fill(template: &str, user: &str) -> PathBuf {
    PathBuf::from(template.replace("{user}", user))
}

/// The escaped user, refused when it would be the shared home's name.
fn checked_user(user: &str) -> io::Result<String> {
    let escaped = escape_user(user);
    if escaped.is_empty() || escaped == SHARED_HOME {
        return Err(io::Error::other(format!("the user name {user:?} is reserved")));
    }
    Ok(escaped)
}

/// The directory above the first path component that holds `{user}`: where every user's
/// directories of that kind live. `None` when the template has no `{user}`.
fn user_base(template: &str) -> Option<PathBuf> {
    let path = Path::new(template);
    let mut base = PathBuf::new();
    for part in path.components() {
        if part.as_os_str().to_string_lossy().contains("{user}") {
            return Some(base);
        }
        base.push(part);
    }
    None
}

/// `path` with `.` and `..` folded and the longest existing prefix resolved through symlinks.
fn resolve_existing(path: &Path) -> io::Result<PathBuf> {
    // Walk component by component, resolving symlinks as they are met, so that `link/..`
    // means what the kernel would make of it.
    let mut resolved = PathBuf::from("/");
    let mut rest: Vec<Component<'_>> = path.components().collect();
    rest.reverse();
    let mut missing = false;
    while let Some(part) = rest.pop() {
        match part {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            // The kernel refuses `missing/..` (ENOENT). Folding it by text instead would make
            // `root/nope/../link/x` the unresolved `root/link/x` when `link` leads out of the root.
            Component::ParentDir if missing => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "`..` after a directory that does not exist",
                ));
            }
            Component::ParentDir => {
                resolved.pop();
            }
            Component::Normal(name) => {
                resolved.push(name);
                if missing {
                    continue;
                }
                match std::fs::canonicalize(&resolved) {
                    Ok(real) => resolved = real,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        // A dangling symlink must not be taken as a plain name.
                        if std::fs::symlink_metadata(&resolved).is_ok() {
                            return Err(io::Error::other("a symlink points nowhere"));
                        }
                        missing = true;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(resolved)
}

/// bubblewrap's path, if it can build the sandbox the gateway uses on this host.
fn probe_bwrap() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    let bwrap = std::env::split_paths(&path)
        .map(|d| d.join("bwrap"))
        .find(|p| p.is_file())?;
    let ok = std::process::Command::new(&bwrap)
        .args(SANDBOX)
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

    #[test]
    fn escapes_users_one_to_one() {
        assert_eq!(escape_user("alice_B-9"), "alice_B-9");
        assert_eq!(escape_user("a.b@c/d"), "a%2Eb%40c%2Fd");
        assert_eq!(escape_user(".."), "%2E%2E");
        assert_eq!(escape_user("é"), "%C3%A9");
        assert_ne!(
            escape_user("a%2E"),
            escape_user("a."),
            "the escape character is escaped too"
        );
    }

    #[test]
    fn stdio_mcp_servers_need_the_allow_list() {
        let mut agent = AgentConfig::default();
        let stdio = serde_json::json!([{"name":"x","command":"/bin/sh","args":["-c","id"],"env":[]}]);
        let http = serde_json::json!([{"type":"http","name":"h","url":"http://127.0.0.1:1/","headers":[]}]);
        let servers = |v: &serde_json::Value| -> Vec<McpServer> { serde_json::from_value(v.clone()).expect("schema") };
        let none = McpTransports::default();
        assert!(check_mcp_servers(&servers(&stdio), &agent, none).is_err());
        assert!(check_mcp_servers(&servers(&http), &agent, none).is_err());
        assert!(check_mcp_servers(&servers(&http), &agent, McpTransports { http: true, sse: false }).is_ok());
        agent.allowed_stdio_mcp = vec!["/bin/sh".into()];
        assert!(check_mcp_servers(&servers(&stdio), &agent, none).is_ok());
        let typed = serde_json::json!([{"type":"stdio","name":"x","command":"/bin/bash","args":[],"env":[]}]);
        assert!(check_mcp_servers(&servers(&typed), &agent, none).is_err());
    }

    #[test]
    fn files_an_agents_command_line_names_in_hidden_places_are_found() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("agent-bin");
        std::fs::write(&bin, "").expect("write");
        let tenancy = Tenancy {
            data_dir: PathBuf::from("/nonexistent-data"),
            homes: String::new(),
            roots: Vec::new(),
            bwrap: None,
            hidden: Vec::new(),
        };
        let agent = AgentConfig {
            command: "sh".into(),
            args: vec![
                "-c".into(),
                format!("echo hi >&2; exec \"{}\" demo-agent", bin.display()),
            ],
            ..Default::default()
        };
        let expected = if bin.starts_with("/tmp") {
            vec![bin.clone()]
        } else {
            Vec::new()
        };
        assert_eq!(tenancy.named_files(&agent), expected);
    }

    #[test]
    fn finds_the_directory_of_every_user() {
        assert_eq!(user_base("/d/homes/{user}"), Some(PathBuf::from("/d/homes")));
        assert_eq!(user_base("/w/{user}/code"), Some(PathBuf::from("/w")));
        assert_eq!(user_base("/srv/x"), None);
    }

    #[test]
    fn resolves_dot_dot_and_symlinks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canon");
        std::fs::create_dir(root.join("a")).expect("mkdir");
        std::os::unix::fs::symlink("/etc", root.join("a/out")).expect("symlink");
        assert_eq!(
            resolve_existing(&root.join("a/../a/./b")).expect("ok"),
            root.join("a/b")
        );
        assert_eq!(
            resolve_existing(&root.join("a/out/x")).expect("ok"),
            PathBuf::from("/etc/x")
        );
        assert_eq!(
            resolve_existing(&root.join("a/out/..")).expect("ok"),
            PathBuf::from("/")
        );
        std::os::unix::fs::symlink(root.join("nowhere"), root.join("a/dangling")).expect("symlink");
        assert!(resolve_existing(&root.join("a/dangling/x")).is_err());
        // Past a missing directory `..` cannot be folded by text: `a/out` leads to /etc.
        assert!(resolve_existing(&root.join("nope/../a/out/passwd")).is_err());
        assert!(resolve_existing(&root.join("a/nope/x/../../out")).is_err());
        assert_eq!(
            resolve_existing(&root.join("a/nope/new")).expect("ok"),
            root.join("a/nope/new")
        );
    }
}
