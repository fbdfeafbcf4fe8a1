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
//!   roots read-write, a private `/tmp`, its own PID namespace and session, no capabilities, and
//!   nothing of the gateway's data directory, database, configuration file or other users'
//!   homes ([`Sight`], the rule the workspace file routes apply too);
//! - without a working sandbox, `sandbox = "auto"` fails closed: its agents serve one user
//!   ([`single_user`]); several users share an unsandboxed host only when the operator says so
//!   (`sandbox = "none"`);
//! - the network stays on (`network = "open"`), unless the operator asks for `"egress-only"`
//!   ([`network`]): then a sandbox reaches the internet but not the host's loopback services,
//!   the cloud metadata endpoint, private ranges or the host's own addresses; that needs the
//!   sandbox and its tools, or the gateway does not start.

mod client_path;
mod config_file;
mod env;
mod launch;
mod mcp;
mod network;
mod paths;
mod sandbox;
mod sight;
mod single_user;
mod start;

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use client_path::{PathRefused, check_length, resolve_within};
pub use env::user_may_set;
pub use launch::{Launch, Purpose, Ready};
pub use mcp::{McpRefused, McpTransports, carry_secrets, check_mcp_servers};
pub use network::Pending;
pub use paths::escape_user;
use paths::{checked_user, fill, resolve_existing, user_base};
pub use sight::Sight;
use single_user::SingleUser;

use crate::infra::config::{Config, SandboxMode};
use crate::infra::files::{named, private_dir};

/// The home of processes that serve several users (`share_between_users`).
pub const SHARED_HOME: &str = "_shared";
/// The home of a per-user agent's probe (a process started for nobody, to learn what the agent
/// says in `initialize`): apart from `_shared`, which users of a shared agent can write, and a
/// name no user's escaped name can be (`%` is always followed by two hex digits there).
pub const PROBE_HOME: &str = "%probe";

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
    /// What sets up `network = "egress-only"` sandboxes, when an agent asks for it.
    egress: Option<Arc<network::Tools>>,
    /// What a sandbox never sees: the data directory, the SQLite file's directory, and the
    /// directories that hold every user's homes and workspaces (a user's own are bound back in),
    /// resolved.
    hidden: Vec<PathBuf>,
    /// Files a sandbox never sees: the configuration file, resolved.
    hidden_files: Vec<PathBuf>,
    /// What no command line may name: the data directory, the SQLite file, the config file.
    secret: Vec<PathBuf>,
    /// The one user that agents with `sandbox = "auto"` serve while no sandbox works here.
    single_user: SingleUser,
    /// Why the configuration file is a risk, for `/readyz` (it holds secrets and an agent can
    /// read it).
    config_warning: Option<String>,
    /// Roots that cannot be used now, by template, with why: logged once when found, listed in
    /// `/readyz`'s warnings, forgotten when the root works again. Bounded by the configured roots.
    unusable: Mutex<BTreeMap<String, String>>,
}

/// A program that a sign-in method runs in place of the agent, in the agent's sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    /// The program.
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Variables it adds (filtered like a user's keys: they came from an agent's answer).
    pub env: Vec<(String, String)>,
}

/// How agents of one configuration are confined here, for `/readyz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confinement {
    /// In bubblewrap.
    Sandboxed,
    /// Unsandboxed because the operator said so (`sandbox = "none"`): single-tenant by choice.
    NoneByChoice,
    /// `sandbox = "auto"` without a working bubblewrap: serves one user.
    SingleUser,
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
        if crate::infra::files::is_open_to_others(&data_dir) {
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
        if let Some(db) = config.sqlite_path().and_then(Path::to_str) {
            let db = Path::new(db.split('?').next().unwrap_or(db));
            let db = resolve_existing(db)
                .or_else(|_| std::path::absolute(db))
                .unwrap_or_else(|_| db.to_path_buf());
            if let Some(dir) = db.parent() {
                hidden.push(dir.to_path_buf());
            }
            secret.push(db);
        }
        let hidden_files: Vec<PathBuf> = config
            .config_file
            .iter()
            .map(|f| resolve_existing(f).unwrap_or_else(|_| f.clone()))
            .collect();
        secret.extend(hidden_files.iter().cloned());
        for (name, agent) in &config.agents {
            sandbox::refuse_secret_paths(&format!("agents.{name}"), &agent.command, &agent.args, &secret)?;
        }
        let wants_bwrap = config.agents.values().any(|a| a.sandbox != SandboxMode::None);
        let bwrap = if wants_bwrap { sandbox::probe_bwrap() } else { None };
        // Before the warnings below: an agent that asked for egress-only never runs without it.
        let egress = network::tools_for(config, bwrap.is_some())?;
        for (name, agent) in &config.agents {
            match (agent.sandbox, &bwrap) {
                (SandboxMode::Bwrap, None) => {
                    return Err(io::Error::other(format!(
                        "agents.{name}.sandbox = \"bwrap\", but bubblewrap does not work on this host (install the `bubblewrap` package; in a container it needs user namespaces or CAP_SYS_ADMIN)"
                    )));
                }
                (SandboxMode::Auto, None) => tracing::warn!(
                    agent = %name,
                    "bubblewrap does not work on this host: agent processes of agents.{name} (sandbox = \"auto\") serve one user only; install bubblewrap, or set agents.{name}.sandbox = \"none\" to let several users share an unsandboxed host"
                ),
                (SandboxMode::None, _) => tracing::warn!(
                    agent = %name,
                    "agents.{name}.sandbox = \"none\": its processes run as the gateway's own OS user and can read the gateway's secrets, its database and every user's home; only for a single tenant"
                ),
                _ => {}
            }
        }
        hidden.extend(std::iter::once(&homes).chain(&roots).filter_map(|t| user_base(t)));
        // Resolved, so that a path the file routes resolved compares with them.
        for dir in &mut hidden {
            if let Ok(real) = resolve_existing(dir) {
                *dir = real;
            }
        }
        hidden.retain(|p| p != Path::new("/"));
        hidden.sort();
        hidden.dedup();
        let unsandboxed: Vec<&str> = config
            .agents
            .iter()
            .filter(|(_, a)| a.sandbox == SandboxMode::None || bwrap.is_none())
            .map(|(n, _)| n.as_str())
            .collect();
        let mut config_warning = config_file::check(config.config_file.as_deref(), &unsandboxed);
        if bwrap.is_some() && nix::unistd::geteuid().is_root() {
            let warning = "the gateway runs as root: sandboxed agents run as uid 0 (without capabilities) and can read root-owned files such as /etc/shadow; run the gateway as a user of its own";
            tracing::warn!("{warning}");
            config_warning = Some(config_warning.map_or_else(|| warning.to_string(), |w| format!("{w}; {warning}")));
        }
        let tenancy = Self {
            single_user: SingleUser::new(&data_dir),
            data_dir,
            homes,
            roots,
            bwrap,
            egress,
            hidden,
            hidden_files,
            secret,
            config_warning,
            unusable: Mutex::default(),
        };
        let _ = tenancy.shared_roots();
        Ok(tenancy)
    }

    /// Starts one sandbox with the egress-only network (a program that does nothing), when an
    /// agent asks for it: so that a host where it cannot work (no `/dev/net/tun`, a container
    /// that forbids network namespaces) stops the gateway at start, naming the setting, rather
    /// than each agent process later.
    pub async fn check_network(&self, config: &Config) -> io::Result<()> {
        match (&self.bwrap, &self.egress) {
            (Some(bwrap), Some(tools)) => network::probe(bwrap, tools, config).await,
            _ => Ok(()),
        }
    }

    /// Whether an agent with `mode` runs sandboxed here.
    pub fn sandboxed(&self, mode: SandboxMode) -> bool {
        mode != SandboxMode::None && self.bwrap.is_some()
    }

    /// How an agent with `mode` is confined here.
    pub fn confinement(&self, mode: SandboxMode) -> Confinement {
        match mode {
            _ if self.sandboxed(mode) => Confinement::Sandboxed,
            SandboxMode::None => Confinement::NoneByChoice,
            _ => Confinement::SingleUser,
        }
    }

    /// Whether `user` may use an agent with `mode`: always, unless it runs without the sandbox
    /// it asked for (`auto` where bubblewrap does not work), where only one user ever may (the
    /// first, remembered in the data directory). The error says why and what to change.
    pub fn admit(&self, agent: &str, mode: SandboxMode, user: &str) -> io::Result<()> {
        if self.confinement(mode) != Confinement::SingleUser {
            return Ok(());
        }
        self.single_user.admit(user).map_err(|owner| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "agent {agent} runs without a sandbox here (bubblewrap does not work on this host), so it serves one user only, and that is {owner}; the operator can install bubblewrap, or set agents.{agent}.sandbox = \"none\" to let several users share an unsandboxed host"
                ),
            )
        })
    }

    /// Warnings for `/readyz`: agents without a sandbox, a configuration file that holds secrets
    /// an agent can read, roots that cannot be used.
    pub fn warnings(&self, config: &Config) -> Vec<String> {
        let mut out = Vec::new();
        for (name, agent) in &config.agents {
            match self.confinement(agent.sandbox) {
                Confinement::Sandboxed => {}
                Confinement::NoneByChoice => out.push(format!(
                    "agent {name} runs unsandboxed (sandbox = \"none\"): single-tenant only, its processes can read the gateway's secrets and every user's files"
                )),
                Confinement::SingleUser => out.push(format!(
                    "agent {name} runs unsandboxed: bubblewrap does not work on this host, so it serves one user only"
                )),
            }
        }
        out.extend(self.config_warning.clone());
        out.extend(self.unusable_roots());
        out
    }

    /// The workspace roots that cannot be used now, each with why, for `/readyz`'s warnings
    /// (after checking the roots that do not depend on a user again).
    pub fn unusable_roots(&self) -> Vec<String> {
        let _ = self.shared_roots();
        self.unusable
            .lock()
            .iter()
            .map(|(template, why)| format!("workspace root {template} is skipped: {why} ({ROOTS_SETTING})"))
            .collect()
    }

    /// The user's agent `HOME` (or the shared one), created `0700` on first use.
    pub fn home(&self, user: Option<&str>) -> io::Result<PathBuf> {
        let dir = self.home_path(user)?;
        private_dir(&dir).map_err(for_setting("agent home: ", HOMES_SETTING))?;
        Ok(dir)
    }

    /// The home of a per-user agent's probe, created `0700` on first use.
    fn probe_home(&self) -> io::Result<PathBuf> {
        let dir = fill(&self.homes, PROBE_HOME);
        private_dir(&dir).map_err(for_setting("agent home: ", HOMES_SETTING))?;
        Ok(dir)
    }

    fn home_path(&self, user: Option<&str>) -> io::Result<PathBuf> {
        Ok(match user {
            Some(user) => fill(&self.homes, &checked_user(user)?),
            None => fill(&self.homes, SHARED_HOME),
        })
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

    /// What `user`'s agents see of this host (`None`: a process shared between users): the rule
    /// their sandbox is built from, and the one the workspace file routes apply.
    pub fn sight(&self, user: Option<&str>) -> Sight {
        let mut own = Vec::new();
        if let Ok(home) = self.home_path(user) {
            own.push(resolve_existing(&home).unwrap_or(home));
        }
        let name = user.map(escape_user);
        for template in self.roots.iter().filter(|t| t.contains("{user}")) {
            let dir = match &name {
                Some(name) => fill(template, name),
                // A shared process serves every user: it sees every user's workspaces.
                None => match user_base(template) {
                    Some(base) => base,
                    None => continue,
                },
            };
            own.push(resolve_existing(&dir).unwrap_or(dir));
        }
        Sight::new(&self.hidden, &self.hidden_files, own)
    }

    /// Records whether the root of `template` can be used, logging a change once.
    fn noted(&self, template: &str, usable: io::Result<PathBuf>) -> io::Result<PathBuf> {
        let mut unusable = self.unusable.lock();
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

    /// `path` resolved (`.`, `..`, symlinks) if it is absolute, inside one of `user`'s roots and
    /// in sight of their agents ([`Sight`]); else a message naming the roots (the same for a
    /// path outside the roots and a hidden one). A path that does not exist yet is resolved as
    /// far as it exists, the rest taken as written (after `..` is folded).
    pub fn resolve(&self, user: &str, path: &str) -> Result<PathBuf, PathRefused> {
        let roots = self.roots(user).map_err(PathRefused::NoRoots)?;
        resolve_within(&roots, &self.sight(Some(user)), path)
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
