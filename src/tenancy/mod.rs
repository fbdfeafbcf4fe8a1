//! What a user's agent process can reach (the contract's "Tenancy").
//!
//! Coding agents run shell commands on this host, so whatever the gateway keeps from a user it
//! must keep from that user's agent processes too:
//! - a clean environment: `PATH`, `LANG`, `LC_ALL`, `TERM`, `TZ` from the gateway's, `HOME`,
//!   `USER`, `TMPDIR` set per user, the agent's `env` and `pass_env`; nothing else;
//! - the user's own `HOME` (agent logins belong to one user) and `{user}` workspace roots,
//!   created `0700`; roots without `{user}` are the operator's shared directories, used as they
//!   are (never chmod'ed, chown'ed or written), and skipped, named, when they cannot be used;
//! - working directories resolved (`..`, symlinks) and kept inside the user's roots;
//! - with bubblewrap ([`sandbox`]), a sandbox that sees the system read-only, its user's home and
//!   roots read-write, a private `/tmp`, its own PID namespace, no capabilities, and nothing of
//!   the gateway's data directory, database or other users' homes.

mod mcp;
mod paths;
mod sandbox;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub use mcp::{McpTransports, check_mcp_servers};
pub use paths::escape_user;
use paths::{checked_user, fill, resolve_existing, user_base};

use crate::config::{AgentConfig, Config, SandboxMode};
use crate::files::{named, private_dir};

/// The home of processes that serve several users (`share_between_users`).
pub const SHARED_HOME: &str = "_shared";

/// Variables an agent inherits from the gateway's environment, when set.
const INHERITED_ENV: [&str; 5] = ["PATH", "LANG", "LC_ALL", "TERM", "TZ"];

/// The setting that names the workspace roots, for messages.
const ROOTS_SETTING: &str = "setting: ACP_GATEWAY_WORKSPACE_ROOTS, workspace_roots";
/// The setting that names the homes, for messages.
const HOMES_SETTING: &str = "setting: ACP_GATEWAY_USER_HOMES, user_homes";
/// The setting that names the data directory, for messages.
const DATA_DIR_SETTING: &str = "setting: ACP_GATEWAY_DATA_DIR, data_dir";
/// The setting of an agent's working directory, for messages.
const CWD_SETTING: &str = "setting: the agent's cwd";

/// `e` (which names the path and the operation already) saying what it was for and which
/// setting to change.
fn for_setting(what: &'static str, setting: &'static str) -> impl Fn(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}{e} ({setting})"))
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
    /// Roots that cannot be used now, by template, with why: logged once when found, listed in
    /// `/readyz`'s warnings, forgotten when the root works again. Bounded by the configured roots.
    unusable: Mutex<BTreeMap<String, String>>,
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
    /// Resolves the data directory (created `0700` when missing) and the templates, checks the
    /// agents' command lines and probes bubblewrap. Fails when an agent requires
    /// `sandbox = "bwrap"` and bubblewrap does not work here, or when an agent's command line
    /// names something inside the data directory.
    pub fn new(config: &Config) -> io::Result<Self> {
        let setting = for_setting("", DATA_DIR_SETTING);
        private_dir(&config.data_dir).map_err(&setting)?;
        let data_dir = config
            .data_dir
            .canonicalize()
            .map_err(|e| setting(named(e, "cannot resolve", &config.data_dir)))?;
        if crate::files::is_open_to_others(&data_dir) {
            tracing::warn!(
                data_dir = %data_dir.display(),
                "the data directory can be entered by other users of this host (it was not created by the gateway, so its mode is left as it is); `chmod 700` it"
            );
        }
        let data = data_dir.to_string_lossy();
        let homes = config.user_homes.replace("{data_dir}", &data);
        let roots: Vec<String> = config
            .workspace_roots
            .iter()
            .map(|r| r.replace("{data_dir}", &data))
            .collect();
        let mut secret = vec![data_dir.clone()];
        let mut hidden = vec![data_dir.clone()];
        if let Some(db) = config.database_url.strip_prefix("sqlite://") {
            let db = Path::new(db.split('?').next().unwrap_or(db));
            let db = resolve_existing(db)
                .or_else(|_| std::path::absolute(db))
                .unwrap_or_else(|_| db.to_path_buf());
            if let Some(dir) = db.parent() {
                hidden.push(dir.to_path_buf());
            }
            secret.push(db);
        }
        for (name, agent) in &config.agents {
            sandbox::refuse_secret_paths(name, agent, &secret)?;
        }
        let wants_bwrap = config.agents.values().any(|a| a.sandbox != SandboxMode::None);
        let bwrap = if wants_bwrap { sandbox::probe_bwrap() } else { None };
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
        hidden.extend(std::iter::once(&homes).chain(&roots).filter_map(|t| user_base(t)));
        hidden.retain(|p| p != Path::new("/"));
        hidden.sort();
        hidden.dedup();
        let tenancy = Self {
            data_dir,
            homes,
            roots,
            bwrap,
            hidden,
            unusable: Mutex::default(),
        };
        let _ = tenancy.shared_roots();
        Ok(tenancy)
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

    /// The workspace roots that cannot be used now, each with why, for `/readyz`'s warnings
    /// (after checking the roots that do not depend on a user again).
    pub fn unusable_roots(&self) -> Vec<String> {
        let _ = self.shared_roots();
        self.unusable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(template, why)| format!("workspace root {template} is skipped: {why} ({ROOTS_SETTING})"))
            .collect()
    }

    /// The user's agent `HOME` (or the shared one), created `0700` on first use.
    pub fn home(&self, user: Option<&str>) -> io::Result<PathBuf> {
        let dir = match user {
            Some(user) => fill(&self.homes, &checked_user(user)?),
            None => fill(&self.homes, SHARED_HOME),
        };
        private_dir(&dir).map_err(for_setting("agent home: ", HOMES_SETTING))?;
        Ok(dir)
    }

    /// The user's workspace roots that can be used, resolved (symlinks), in configured order:
    /// those with `{user}` created `0700` on first use, the others used as they are. A root that
    /// cannot be used is skipped and named (log, `/readyz`); none at all is an error naming each.
    pub fn roots(&self, user: &str) -> io::Result<Vec<PathBuf>> {
        let user = checked_user(user)?;
        let mut out = Vec::with_capacity(self.roots.len());
        let mut why = Vec::new();
        for template in &self.roots {
            let dir = fill(template, &user);
            let usable = if template.contains("{user}") {
                private_dir(&dir).and_then(|()| usable_dir(&dir))
            } else {
                usable_dir(&dir)
            };
            match self.noted(template, usable) {
                Ok(dir) => out.push(dir),
                Err(e) => why.push(e.to_string()),
            }
        }
        if out.is_empty() {
            return Err(io::Error::other(format!(
                "no workspace root can be used: {} ({ROOTS_SETTING})",
                why.join("; ")
            )));
        }
        Ok(out)
    }

    /// Records whether the root of `template` can be used, logging a change once.
    fn noted(&self, template: &str, usable: io::Result<PathBuf>) -> io::Result<PathBuf> {
        let mut unusable = self.unusable.lock().unwrap_or_else(|e| e.into_inner());
        match &usable {
            Ok(_) => {
                if unusable.remove(template).is_some() {
                    tracing::info!(root = %template, "workspace root can be used again");
                }
            }
            Err(e) => {
                let why = e.to_string();
                if unusable.get(template) != Some(&why) {
                    tracing::warn!(root = %template, problem = %why, "workspace root cannot be used; skipped");
                    unusable.insert(template.to_string(), why);
                }
            }
        }
        usable
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
        check_length(path).map_err(|e| format!("{e}; allowed roots: {}", allowed()))?;
        if !requested.is_absolute() {
            return Err(format!(
                "{path:?} is not an absolute path; allowed roots: {}",
                allowed()
            ));
        }
        let resolved = resolve_existing(requested)
            .map_err(|e| format!("cannot resolve {path:?}: {e}; allowed roots: {}", allowed()))?;
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
    /// Every error names the path, the operation and the setting to change.
    pub fn launch(&self, agent: &AgentConfig, user: Option<&str>) -> io::Result<Launch> {
        let home = self.home(user)?;
        let roots = match user {
            Some(user) => self.roots(user)?,
            None => self.shared_roots(),
        };
        let sandboxed = self.sandboxed(agent.sandbox);
        let tmpdir = if sandboxed {
            PathBuf::from("/tmp")
        } else {
            let tmp = home.join(".tmp");
            private_dir(&tmp).map_err(for_setting("agent TMPDIR: ", HOMES_SETTING))?;
            tmp
        };
        let cwd = agent
            .cwd
            .clone()
            .or_else(|| user.and(roots.first().cloned()))
            .unwrap_or_else(|| home.clone());
        if agent.cwd.is_some() {
            usable_dir(&cwd).map_err(for_setting("agent working directory: ", CWD_SETTING))?;
        }
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
                let places = sandbox::Places {
                    hidden: &self.hidden,
                    home: &home,
                    roots: &roots,
                    cwd: &cwd,
                };
                let mut c = tokio::process::Command::new(bwrap);
                c.args(sandbox::bwrap_args(&places, agent));
                c.arg("--").arg(&agent.command).args(&agent.args);
                c
            }
            _ => {
                let mut c = tokio::process::Command::new(&agent.command);
                c.args(&agent.args).current_dir(&cwd);
                sandbox::die_with_gateway(&mut c);
                c
            }
        };
        command.env_clear().envs(env);
        Ok(Launch { command, sandboxed })
    }

    /// For a shared process: the directories holding every user's workspaces (it serves them
    /// all; created `0700` when missing), and the roots without `{user}`, as they are. Those that
    /// cannot be used are skipped (and named).
    fn shared_roots(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for template in &self.roots {
            let usable = match user_base(template) {
                Some(base) => private_dir(&base).and_then(|()| usable_dir(&base)),
                None => usable_dir(Path::new(template)),
            };
            if let Ok(dir) = self.noted(template, usable) {
                out.push(dir);
            }
        }
        out
    }

    /// The gateway's data directory (absolute).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }
}

/// Longest path a client may name, in bytes (Linux's `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;
/// Most components a client's path may have.
pub const MAX_PATH_DEPTH: usize = 256;

/// Refuses a path longer or deeper than any the kernel would take: resolving it costs the
/// gateway work for each component, and nothing real is that long.
pub fn check_length(path: &str) -> Result<(), String> {
    if path.len() > MAX_PATH_BYTES || Path::new(path).components().nth(MAX_PATH_DEPTH).is_some() {
        return Err(format!(
            "the path is longer than {MAX_PATH_BYTES} bytes or {MAX_PATH_DEPTH} components"
        ));
    }
    Ok(())
}

/// `dir` resolved, if it is a directory the gateway can enter (an agent started there needs to);
/// else an error naming the directory, the operation and the reason. Only looks.
fn usable_dir(dir: &Path) -> io::Result<PathBuf> {
    let resolved = dir.canonicalize().map_err(|e| named(e, "cannot resolve", dir))?;
    let meta = std::fs::metadata(&resolved).map_err(|e| named(e, "cannot look up", &resolved))?;
    if !meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotADirectory,
            format!("{} is not a directory", resolved.display()),
        ));
    }
    nix::unistd::access(&resolved, nix::unistd::AccessFlags::X_OK)
        .map_err(|e| named(io::Error::from(e), "cannot enter", &resolved))?;
    Ok(resolved)
}
