//! Configuration: built-in defaults, then a TOML file, then the environment, then CLI flags.
//!
//! The environment variables are the ones the contract names (`ACP_GATEWAY_LISTEN`,
//! `DATABASE_URL`, `ACP_GATEWAY_JWT_*`, `ACP_GATEWAY_AGENT`); everything else lives in the file.
//! Layering and error reporting come from `figment`, so a bad file is reported with the file
//! name, the key path and what was expected.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

mod limits;
mod listen;
mod mcp;
mod oidc;
mod push;
mod retention;
mod team;

pub use limits::Limits;
pub use mcp::McpConfig;
pub use oidc::OidcConfig;
pub use push::PushConfig;
pub use retention::RetentionConfig;
pub use team::{AdminConfig, AuditConfig, DeviceConfig, UsageConfig};

use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use secrecy::SecretString;
use serde::{Deserialize, Serialize};

/// The name of the agent used when a client does not pick one.
pub const DEFAULT_AGENT: &str = "default";

/// The whole gateway configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address the HTTP server binds (a host name is resolved at start: [`listen::parse`]).
    #[serde(deserialize_with = "listen::deserialize")]
    pub listen: SocketAddr,
    /// `sqlite://PATH` or `postgres://...`.
    pub database_url: String,
    /// Postgres only: a second login for request work (docs/operations.md "Postgres roles and row-level
    /// security"), a member of `acp_gateway_request` and nothing more, so that a request
    /// transaction that reset its role would have no privileges of the tables' owner. Unset:
    /// request work logs in as `database_url`'s role, with a warning at start-up.
    pub request_database_url: Option<String>,
    /// Where the generated JWT secret and the default SQLite file live.
    pub data_dir: PathBuf,
    /// The file this configuration was read from (`--config`): hidden from agents like the data
    /// directory. Not a setting.
    #[serde(skip)]
    pub config_file: Option<PathBuf>,
    /// Token verification.
    pub jwt: JwtConfig,
    /// Command line of the default agent (`ACP_GATEWAY_AGENT`), split like a shell would.
    /// Overrides `agents.default.command`/`args`; `None` means this binary's `demo-agent --showcase`.
    pub agent: Option<String>,
    /// Named agents. `default` always exists after [`Config::finish`].
    pub agents: BTreeMap<String, AgentConfig>,
    /// Caps on connections, frames and queues.
    pub limits: Limits,
    /// Directory the web UI is served from.
    pub static_dir: PathBuf,
    /// Identifies this replica in logs and in the `Acp-Connection-Id` prefix.
    pub replica_id: Option<String>,
    /// Where each user's agent `HOME` is (`ACP_GATEWAY_USER_HOMES`); `{data_dir}` and `{user}`
    /// are filled in, `{user}` made filesystem-safe.
    pub user_homes: String,
    /// Directories a user's sessions may work in (`ACP_GATEWAY_WORKSPACE_ROOTS`, comma-separated
    /// in the environment); the same templates as `user_homes`.
    pub workspace_roots: Vec<String>,
    /// The key users' agent keys are sealed with at rest (`ACP_GATEWAY_SECRETS_KEY`: 32 bytes,
    /// base64); generated once into the data directory when unset. Replicas must share it.
    #[serde(serialize_with = "never_serialize_secret")]
    pub secrets_key: Option<SecretString>,
    /// Signing users in to agents.
    pub signin: SigninConfig,
    /// Signing people in through the team's identity provider (OpenID Connect).
    pub oidc: OidcConfig,
    /// Who administers the gateway.
    pub admin: AdminConfig,
    /// The audit log.
    pub audit: AuditConfig,
    /// Device sign-in.
    pub device: DeviceConfig,
    /// What each person spends, and caps on it.
    pub usage: UsageConfig,
    /// Users' own MCP servers.
    pub mcp: McpConfig,
    /// Web Push to users' devices.
    pub push: PushConfig,
    /// Deleting sessions not updated for a while.
    pub retention: RetentionConfig,
    /// When set, `/metrics` answers only requests with `Authorization: Bearer <token>`
    /// (`ACP_GATEWAY_METRICS_TOKEN`); unset, it answers anyone who can reach it.
    #[serde(serialize_with = "never_serialize_secret")]
    pub metrics_token: Option<SecretString>,
}

/// Signing users in to agents (`authMethods`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SigninConfig {
    /// How long a `terminal` sign-in may run, start to end, before its process group is killed
    /// (`ACP_GATEWAY_SIGNIN_TERMINAL_TIMEOUT_SECS`).
    pub terminal_timeout_secs: u64,
}

impl Default for SigninConfig {
    fn default() -> Self {
        Self {
            terminal_timeout_secs: 600,
        }
    }
}

/// JWT settings. Either `secret` (HS256) or `public_key` (RS256/ES256/EdDSA) is used; with neither,
/// a secret is generated once and kept in `data_dir`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JwtConfig {
    /// HS256 shared secret.
    #[serde(serialize_with = "never_serialize_secret")]
    pub secret: Option<SecretString>,
    /// PEM public key file for asymmetric tokens.
    pub public_key: Option<PathBuf>,
    /// Required `iss`, when set.
    pub issuer: Option<String>,
    /// Required `aud`, when set.
    pub audience: Option<String>,
    /// The JWKS of an identity provider whose tokens are accepted too (default with `[oidc]`:
    /// the provider's own, from discovery).
    pub jwks_url: Option<String>,
    /// Lifetime of tokens printed by `serve` and `token` when no `--ttl` is given.
    pub default_ttl_secs: u64,
}

fn never_serialize_secret<S: serde::Serializer>(secret: &Option<SecretString>, s: S) -> Result<S::Ok, S::Error> {
    // Secrets are only ever layered in from the file or the environment; the serialized defaults
    // never carry one, so there is nothing to write here.
    let _ = secret;
    s.serialize_none()
}

/// One agent the gateway can start.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// Program to run (looked up on `PATH`).
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment for it.
    pub env: BTreeMap<String, String>,
    /// Its working directory (the gateway's own when unset).
    pub cwd: Option<PathBuf>,
    /// How its processes are pooled.
    pub pool: PoolConfig,
    /// Client capabilities the gateway declares when it initializes this agent. The gateway
    /// forwards `fs/*` and `terminal/*` requests to the session's client, so only declare what
    /// your clients implement. Default: none (the agent uses its own tools on the server).
    pub client_capabilities: Option<serde_json::Value>,
    /// Names of the gateway's environment variables copied into the agent's environment (API
    /// keys, proxies). Nothing else of the gateway's environment reaches an agent but `PATH`,
    /// `LANG`, `LC_ALL`, `TERM` and `TZ`.
    pub pass_env: Vec<String>,
    /// `command`s a client may name in a `stdio` entry of `mcpServers`; every other stdio MCP
    /// server is refused (it would be a command run on this host of the client's choosing).
    pub allowed_stdio_mcp: Vec<String>,
    /// Keys of a client's `_meta` that reach the agent; the rest is dropped (some agents read
    /// options from `_meta`).
    pub forward_meta: Vec<String>,
    /// Extension methods (`_…`) a client may call on this agent; others get `-32601`.
    pub allowed_ext_methods: Vec<String>,
    /// How the agent's processes are confined.
    pub sandbox: SandboxMode,
    /// Whether users may give this agent their own keys (its `env_var` sign-in methods). Off,
    /// only the operator's `env` and `pass_env` reach it.
    pub user_keys: bool,
    /// What its processes (and its sign-ins' login programs) can reach on the network (the
    /// contract also spells it `agent_network`). Default `open`: the network stays on.
    #[serde(alias = "agent_network")]
    pub network: NetworkMode,
}

/// What an agent's processes can reach on the network (see docs/security.md, "Tenancy").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NetworkMode {
    /// The host's network as it is, the host's loopback services and the cloud metadata
    /// endpoint included (the contract's default: the network stays on).
    #[default]
    Open,
    /// A network namespace of its own, whose only way out is a user-mode network stack
    /// (slirp4netns): the internet, but not the host's loopback, link-local (cloud metadata),
    /// shared-address or private ranges, nor the host's own addresses. Needs the bubblewrap
    /// sandbox: without it the gateway refuses to start.
    EgressOnly,
}

impl NetworkMode {
    /// How the setting is written.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::EgressOnly => "egress-only",
        }
    }
}

/// How an agent's processes are confined (see docs/security.md, "Tenancy").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxMode {
    /// bubblewrap when it works on this host, else none (with a warning and a note in `/readyz`).
    #[default]
    Auto,
    /// Always bubblewrap; the gateway refuses to start if it does not work here.
    Bwrap,
    /// No confinement beyond the clean environment, own `HOME` and workspace checks.
    None,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            command: String::new(),
            args: Vec::new(),
            env: BTreeMap::new(),
            cwd: None,
            pool: PoolConfig::default(),
            client_capabilities: None,
            pass_env: Vec::new(),
            allowed_stdio_mcp: Vec::new(),
            forward_meta: ["traceparent", "tracestate", "baggage"].map(String::from).to_vec(),
            allowed_ext_methods: Vec::new(),
            sandbox: SandboxMode::Auto,
            user_keys: true,
            network: NetworkMode::Open,
        }
    }
}

/// Pool settings for one agent.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolConfig {
    /// Processes kept started and initialized, owned by no user yet.
    pub min_idle: usize,
    /// Most processes of this agent at once.
    pub max_processes: usize,
    /// Most live sessions one process carries.
    pub max_sessions_per_process: usize,
    /// A process with no attached client and nothing in flight for this long is stopped.
    pub idle_timeout_secs: u64,
    /// Whether sessions of different users may share one process.
    pub share_between_users: bool,
    /// How long any request the gateway itself sends the agent may take (`initialize`,
    /// `session/new`, `authenticate`, session restores, `session/close`); past it the request
    /// gets `-32603` "agent timed out".
    pub request_timeout_secs: u64,
    /// How long an agent may write nothing on stdout while a forwarded `session/prompt` waits
    /// for it (time it spends waiting for a client's answer, e.g. a permission, does not count).
    /// Past it every request waiting on that process gets `-32603` "agent timed out" and the
    /// process is stopped (its sessions are restored on a fresh one when next used). A prompt
    /// may run as long as the agent keeps writing. `0`: never.
    pub prompt_idle_timeout_secs: u64,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            min_idle: 0,
            max_processes: 64,
            max_sessions_per_process: 32,
            idle_timeout_secs: 600,
            share_between_users: false,
            request_timeout_secs: 60,
            prompt_idle_timeout_secs: 300,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            database_url: "sqlite://data/acp-gateway.db".into(),
            request_database_url: None,
            data_dir: PathBuf::from("data"),
            config_file: None,
            jwt: JwtConfig {
                default_ttl_secs: 30 * 24 * 3600,
                ..Default::default()
            },
            agent: None,
            agents: BTreeMap::new(),
            limits: Limits::default(),
            static_dir: PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/static")),
            replica_id: None,
            user_homes: String::from("{data_dir}/homes/{user}"),
            workspace_roots: vec![String::from("{data_dir}/workspaces/{user}")],
            secrets_key: None,
            signin: SigninConfig::default(),
            oidc: OidcConfig::default(),
            admin: AdminConfig::default(),
            audit: AuditConfig::default(),
            device: DeviceConfig::default(),
            usage: UsageConfig::default(),
            mcp: McpConfig::default(),
            push: PushConfig::default(),
            retention: RetentionConfig::default(),
            metrics_token: None,
        }
    }
}

/// Values given on the command line; they override everything else.
#[derive(Debug, Clone, Default)]
pub struct CliOverrides {
    /// `--config FILE`.
    pub config_file: Option<PathBuf>,
    /// `--listen ADDR`.
    pub listen: Option<String>,
    /// `--database-url URL`.
    pub database_url: Option<String>,
}

/// A configuration that could not be loaded; the message names the file, key and expectation.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file does not exist or cannot be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A key has the wrong type or value, or is unknown.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// Environment variables and the config keys they set.
const ENV_KEYS: &[(&str, &str)] = &[
    ("ACP_GATEWAY_LISTEN", "listen"),
    ("DATABASE_URL", "database_url"),
    ("ACP_GATEWAY_REQUEST_DATABASE_URL", "request_database_url"),
    ("ACP_GATEWAY_JWT_SECRET", "jwt.secret"),
    ("ACP_GATEWAY_JWT_PUBLIC_KEY", "jwt.public_key"),
    ("ACP_GATEWAY_JWT_ISSUER", "jwt.issuer"),
    ("ACP_GATEWAY_JWT_AUDIENCE", "jwt.audience"),
    ("ACP_GATEWAY_JWT_JWKS_URL", "jwt.jwks_url"),
    ("ACP_GATEWAY_AGENT", "agent"),
    ("ACP_GATEWAY_DATA_DIR", "data_dir"),
    ("ACP_GATEWAY_STATIC_DIR", "static_dir"),
    ("ACP_GATEWAY_REPLICA_ID", "replica_id"),
    ("ACP_GATEWAY_USER_HOMES", "user_homes"),
    ("ACP_GATEWAY_SECRETS_KEY", "secrets_key"),
    ("ACP_GATEWAY_METRICS_TOKEN", "metrics_token"),
];

/// Environment variables that set a number, and their config keys.
const ENV_NUMBERS: &[(&str, &str)] = &[
    (
        "ACP_GATEWAY_SIGNIN_TERMINAL_TIMEOUT_SECS",
        "signin.terminal_timeout_secs",
    ),
    ("ACP_GATEWAY_RETENTION_DAYS", "retention.days"),
];

impl Config {
    /// Loads defaults → file → environment → CLI.
    pub fn load(cli: &CliOverrides) -> Result<Self, ConfigError> {
        Self::load_with_env(cli, |k| std::env::var(k).ok())
    }

    /// [`Config::load`] with an explicit environment (for tests).
    pub fn load_with_env(cli: &CliOverrides, env: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = &cli.config_file {
            // figment treats a missing file as empty; an operator who names one means it.
            std::fs::metadata(path).map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })?;
            figment = figment.merge(Toml::file_exact(path));
        }
        // Values are merged as strings, never guessed at: a numeric-looking secret stays a secret.
        for (var, key) in ENV_KEYS.iter().chain(oidc::ENV_KEYS) {
            if let Some(value) = env(var).filter(|v| !v.is_empty()) {
                figment = figment.merge((*key, value));
            }
        }
        for (var, key) in ENV_NUMBERS.iter().chain(oidc::ENV_NUMBERS).chain(team::ENV_NUMBERS) {
            if let Some(value) = env(var).filter(|v| !v.trim().is_empty()) {
                let n: u64 = value.trim().parse().map_err(|_| {
                    ConfigError::Invalid(format!("{var} ({key}): expected a whole number, found {value:?}"))
                })?;
                figment = figment.merge((*key, n));
            }
        }
        // A list in the environment: comma-separated.
        for (var, key) in oidc::ENV_LISTS.iter().chain(team::ENV_LISTS) {
            if let Some(value) = env(var).filter(|v| !v.trim().is_empty()) {
                let list: Vec<String> = value
                    .split(',')
                    .map(str::trim)
                    .filter(|v| !v.is_empty())
                    .map(String::from)
                    .collect();
                figment = figment.merge((*key, list));
            }
        }
        if let Some(roots) = env("ACP_GATEWAY_WORKSPACE_ROOTS").filter(|v| !v.trim().is_empty()) {
            let roots: Vec<String> = roots
                .split(',')
                .map(str::trim)
                .filter(|r| !r.is_empty())
                .map(String::from)
                .collect();
            figment = figment.merge(("workspace_roots", roots));
        }
        if let Some(listen) = &cli.listen {
            figment = figment.merge(("listen", listen));
        }
        if let Some(url) = &cli.database_url {
            figment = figment.merge(("database_url", url));
        }
        let mut config: Config = figment.extract().map_err(|e| ConfigError::Invalid(describe(e)))?;
        config.config_file = cli.config_file.clone();
        config.finish()
    }

    /// Fills in the default agent and checks what serde cannot.
    fn finish(mut self) -> Result<Self, ConfigError> {
        let default = self.agents.entry(DEFAULT_AGENT.to_string()).or_default();
        if let Some(line) = &self.agent {
            let mut words = shell_words::split(line)
                .map_err(|e| ConfigError::Invalid(format!("ACP_GATEWAY_AGENT / agent: cannot split {line:?}: {e}")))?;
            if words.is_empty() {
                return Err(ConfigError::Invalid(
                    "ACP_GATEWAY_AGENT / agent: empty command line".into(),
                ));
            }
            default.command = words.remove(0);
            default.args = words;
        }
        if default.command.is_empty() {
            let exe = std::env::current_exe()
                .map_err(|e| ConfigError::Invalid(format!("cannot locate this binary for the demo agent: {e}")))?;
            default.command = exe.to_string_lossy().into_owned();
            // The showcase: a new user sees every part of the web UI with no agent installed.
            default.args = vec!["demo-agent".into(), "--showcase".into()];
        }
        for (name, agent) in &self.agents {
            if name.starts_with('/') {
                // `/mcp` and `/push` key users' own MCP servers and push subscriptions among their sealed secrets.
                return Err(ConfigError::Invalid(format!(
                    "agents.{name}: an agent's name may not begin with '/'"
                )));
            }
            if agent.command.is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "agents.{name}.command: expected a program to run, found nothing"
                )));
            }
            let pool = &agent.pool;
            if pool.max_processes == 0 || pool.max_sessions_per_process == 0 {
                return Err(ConfigError::Invalid(format!(
                    "agents.{name}.pool: max_processes and max_sessions_per_process must be at least 1"
                )));
            }
            for name_ in agent.pass_env.iter().chain(agent.env.keys()) {
                if name_.starts_with("ACP_GATEWAY_") || name_ == "DATABASE_URL" {
                    return Err(ConfigError::Invalid(format!(
                        "agents.{name}: {name_} is the gateway's own setting and never reaches an agent"
                    )));
                }
                if ["HOME", "USER", "TMPDIR"].contains(&name_.as_str()) {
                    return Err(ConfigError::Invalid(format!(
                        "agents.{name}: {name_} is set by the gateway (each user's own) and cannot be configured"
                    )));
                }
            }
            if agent.network == NetworkMode::EgressOnly && agent.sandbox == SandboxMode::None {
                return Err(ConfigError::Invalid(format!(
                    "agents.{name}.network = \"egress-only\" needs the bubblewrap sandbox, and agents.{name}.sandbox is \"none\": set sandbox = \"bwrap\" (or \"auto\"), or network = \"open\""
                )));
            }
            if pool.min_idle > pool.max_processes {
                return Err(ConfigError::Invalid(format!(
                    "agents.{name}.pool.min_idle: must not exceed max_processes"
                )));
            }
        }
        if self.workspace_roots.is_empty() {
            return Err(ConfigError::Invalid(
                "workspace_roots (ACP_GATEWAY_WORKSPACE_ROOTS): at least one root is needed (`/` trusts every user with the whole host)".into(),
            ));
        }
        for template in self.workspace_roots.iter().chain([&self.user_homes]) {
            if !template.replace("{data_dir}", "/").starts_with('/') {
                return Err(ConfigError::Invalid(format!(
                    "{template:?}: user homes and workspace roots must be absolute paths (or start with {{data_dir}})"
                )));
            }
        }
        if self.jwt.secret.is_some() && self.jwt.public_key.is_some() {
            return Err(ConfigError::Invalid(
                "jwt: set either secret (ACP_GATEWAY_JWT_SECRET) or public_key (ACP_GATEWAY_JWT_PUBLIC_KEY), not both"
                    .into(),
            ));
        }
        if self
            .metrics_token
            .as_ref()
            .is_some_and(|t| secrecy::ExposeSecret::expose_secret(t).trim().is_empty())
        {
            return Err(ConfigError::Invalid(
                "metrics_token (ACP_GATEWAY_METRICS_TOKEN): empty; leave it unset for an open /metrics".into(),
            ));
        }
        self.oidc.validate()?;
        self.limits.validate()?;
        self.mcp.validate()?;
        self.push.validate()?;
        self.retention.validate()?;
        if let Some(url) = &self.jwt.jwks_url
            && (self.jwt.issuer.is_none() || self.jwt.audience.is_none())
            && !self.oidc.enabled()
        {
            return Err(ConfigError::Invalid(format!(
                "jwt.jwks_url (ACP_GATEWAY_JWT_JWKS_URL) {url:?}: tokens verified against it need an issuer (ACP_GATEWAY_JWT_ISSUER) and an audience (ACP_GATEWAY_JWT_AUDIENCE)"
            )));
        }
        // Key rules (secret length, audience with a public key) are checked where keys are set
        // up, `auth::Authenticator::from_config`, which every command that needs them runs first.
        Ok(self)
    }

    /// The SQLite path when `database_url` names one.
    pub fn sqlite_path(&self) -> Option<&Path> {
        self.database_url
            .strip_prefix("sqlite://")
            .or_else(|| self.database_url.strip_prefix("sqlite:"))
            .map(Path::new)
    }
}

/// Renders every figment error with its key path and source (file or environment).
fn describe(err: figment::Error) -> String {
    err.into_iter()
        .map(|e| {
            let key = if e.path.is_empty() {
                String::from("(top level)")
            } else {
                e.path.join(".")
            };
            let source = e
                .metadata
                .as_ref()
                .and_then(|m| m.source.as_ref())
                .map(|s| format!(" in {s}"))
                .unwrap_or_default();
            format!("key `{key}`{source}: {}", e.kind)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests;
