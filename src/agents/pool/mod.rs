//! Agent processes, pooled per configured agent.
//!
//! Processes start on demand (or ahead of demand, `min_idle`), are initialized once by the
//! gateway, carry up to `max_sessions_per_process` sessions of one user (several users only when
//! `share_between_users`), are stopped when idle, and are replaced when they die: a dead process
//! is dropped from the pool and the next request starts a fresh one. A failed spawn fails only
//! the request that needed it.

mod caps;
mod child;
mod early;
mod info;
mod inventory;
pub mod process;
pub mod reaper;
pub mod route;
mod rpc;
pub mod signin_watch;
pub mod user_env;

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio_util::task::TaskTracker;

pub use caps::{ProcessCaps, ProcessSlot};
pub use child::GroupGuard;
pub use info::AgentInfo;
pub use process::{AgentProcess, Pending, PipeLimits};
pub use route::SessionRoute;
pub use user_env::{UserEnv, UserEnvError};

use crate::infra::config::{AgentConfig, Config};
use crate::protocol::RpcError;
use crate::tenancy::Tenancy;

/// The processes of one configured agent.
#[derive(Debug)]
pub struct AgentPool {
    /// The agent's configured name.
    pub name: Arc<str>,
    /// How to start it and pool it.
    cfg: AgentConfig,
    /// Live (or just-died, until the next sweep) processes.
    procs: Mutex<Vec<Arc<AgentProcess>>>,
    /// Serializes spawning so that a burst of requests does not start a burst of processes.
    spawn_gate: tokio::sync::Mutex<()>,
    /// The agent's `initialize` answer, from the first process that gave one.
    info: Mutex<Option<Arc<AgentInfo>>>,
    /// Processes started and not yet initialized (not in `procs` until they are).
    starting: AtomicUsize,
    /// What every agent's pool shares.
    common: Common,
}

/// Counts a process as starting while it lives.
struct Starting<'a>(&'a AtomicUsize);

impl<'a> Starting<'a> {
    fn new(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::Relaxed);
        Self(n)
    }
}

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What the pools of every agent share.
#[derive(Debug, Clone)]
struct Common {
    /// Source of process ids (shared across pools for readable logs).
    ids: Arc<AtomicU64>,
    /// Each user's home, workspaces and sandbox.
    tenancy: Arc<Tenancy>,
    /// Process groups of running agents, on disk for the next start's reaper.
    groups: Arc<reaper::GroupRecord>,
    /// Tracks every process task, so shutdown can wait for them.
    tracker: TaskTracker,
    /// Each user's agent process slots.
    caps: Arc<dyn ProcessCaps>,
    /// Bounds on every process's pipes.
    pipes: PipeLimits,
    /// Users' own variables (their keys), when the gateway keeps any.
    user_env: Option<Arc<dyn UserEnv>>,
}

impl AgentPool {
    fn new(name: &str, cfg: AgentConfig, common: Common) -> Self {
        Self {
            name: Arc::from(name),
            cfg,
            procs: Mutex::new(Vec::new()),
            spawn_gate: tokio::sync::Mutex::new(()),
            info: Mutex::new(None),
            starting: AtomicUsize::new(0),
            common,
        }
    }

    /// How this agent is configured.
    pub fn config(&self) -> &AgentConfig {
        &self.cfg
    }

    /// Whether one process may carry several users' sessions.
    pub fn is_shared(&self) -> bool {
        self.cfg.pool.share_between_users
    }

    /// How long a request to the agent may take.
    pub fn request_timeout(&self) -> Duration {
        self.timeout()
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(self.cfg.pool.request_timeout_secs)
    }

    /// The agent's capabilities, starting a process to learn them if needed: a warm one for a
    /// shared agent; for a per-user agent a probe with no user's environment, stopped once it
    /// has answered `initialize` (a process is only ever handed to the user it was started for).
    pub async fn info(&self) -> Result<Arc<AgentInfo>, RpcError> {
        if let Some(info) = self.cached_info() {
            return Ok(info);
        }
        let _gate = self.spawn_gate.lock().await;
        if let Some(info) = self.cached_info() {
            return Ok(info);
        }
        let probe = self.spawn_locked(None).await?;
        if !self.is_shared() {
            self.forget(&probe);
            probe.stop();
        }
        self.cached_info()
            .ok_or_else(|| RpcError::internal("agent did not initialize"))
    }

    /// The agent's capabilities for `user`'s connection: what their own process said, if they
    /// have one (a per-user agent); else what a process no user shaped said; else `user`'s own
    /// process is started to learn them, and serves their first session.
    pub async fn info_for(&self, user: &Arc<str>) -> Result<Arc<AgentInfo>, RpcError> {
        self.known_or_spawned(user, || self.own_cached_info(user).or_else(|| self.cached_info()))
            .await
    }

    /// Refuses `user` where this agent may serve only one user and that is someone else
    /// (`sandbox = "auto"` without a working bubblewrap: `Tenancy::admit`).
    fn admit(&self, user: &str) -> Result<(), RpcError> {
        self.common
            .tenancy
            .admit(&self.name, self.cfg.sandbox, user)
            .map_err(|e| RpcError::internal(format!("cannot start agent {}: {e}", self.name)))
    }

    /// With `min_idle` on a per-user agent: when `user` connects and has no process of this
    /// agent, start one in the background, so that their `session/new` finds it warm.
    pub fn prewarm(self: &Arc<Self>, user: &Arc<str>) {
        if self.is_shared() || self.cfg.pool.min_idle == 0 || self.has_process_of(user) || self.admit(user).is_err() {
            return;
        }
        let pool = self.clone();
        let user = user.clone();
        self.common.tracker.spawn(async move {
            let _gate = pool.spawn_gate.lock().await;
            if pool.has_process_of(&user) {
                return;
            }
            if let Err(e) = pool.spawn_locked(Some(&user)).await {
                tracing::warn!(agent = %pool.name, user = %user, error = %e, "cannot start a warm process");
            }
        });
    }

    /// A live process of `user` (without taking a session slot), started if they have none:
    /// where requests about the user rather than a session (`authenticate`) go.
    pub async fn process_for(&self, user: &Arc<str>) -> Result<Arc<AgentProcess>, RpcError> {
        self.admit(user)?;
        if let Some(p) = self.live_process_of(user) {
            return Ok(p);
        }
        let _gate = self.spawn_gate.lock().await;
        if let Some(p) = self.live_process_of(user) {
            return Ok(p);
        }
        self.spawn_locked(Some(user)).await
    }

    fn live_process_of(&self, user: &Arc<str>) -> Option<Arc<AgentProcess>> {
        self.procs
            .lock()
            .iter()
            .find(|p| !p.is_dead() && p.owner().as_ref() == Some(user))
            .cloned()
    }

    fn has_process_of(&self, user: &Arc<str>) -> bool {
        self.live_process_of(user).is_some()
    }

    fn forget(&self, process: &Arc<AgentProcess>) {
        self.procs.lock().retain(|p| !Arc::ptr_eq(p, process));
    }

    /// The capabilities, if a process has reported them.
    pub fn cached_info(&self) -> Option<Arc<AgentInfo>> {
        self.info.lock().clone()
    }

    /// A process for a new (or restored) session of `user`, with a session slot reserved.
    /// Call [`AgentProcess::release`] if the session is not bound after all.
    pub async fn acquire(&self, user: &Arc<str>) -> Result<Arc<AgentProcess>, RpcError> {
        self.admit(user)?;
        if let Some(p) = self.pick(user) {
            return Ok(p);
        }
        let _gate = self.spawn_gate.lock().await;
        if let Some(p) = self.pick(user) {
            return Ok(p);
        }
        let p = self.spawn_locked(Some(user)).await?;
        if p.claim(user) && p.try_reserve(self.cfg.pool.max_sessions_per_process) {
            Ok(p)
        } else {
            Err(RpcError::internal("agent pool is busy; try again"))
        }
    }

    /// An existing process that can take a session of `user`: one of theirs (or, for a shared
    /// agent, any assigned one) with room, else (shared agents only) a warm unassigned one.
    fn pick(&self, user: &Arc<str>) -> Option<Arc<AgentProcess>> {
        let max = self.cfg.pool.max_sessions_per_process;
        let share = self.cfg.pool.share_between_users;
        let procs = self.procs.lock();
        // The user's own processes (any assigned process when sharing), least loaded first.
        let mut usable: Vec<&Arc<AgentProcess>> = procs
            .iter()
            .filter(|p| !p.is_dead())
            .filter(|p| match p.owner() {
                Some(owner) => share || owner == *user,
                None => false,
            })
            .collect();
        usable.sort_by_key(|p| p.reserved());
        if let Some(p) = usable.into_iter().find(|p| p.try_reserve(max)) {
            return Some(p.clone());
        }
        // Else a warm, unassigned one: only shared agents have them, since a per-user process
        // runs with its user's home and workspaces from the start.
        if !share {
            return None;
        }
        procs
            .iter()
            .filter(|p| !p.is_dead())
            .find(|p| p.claim(user) && p.try_reserve(max))
            .cloned()
    }

    /// Starts and initializes one process for `user` (`None`: no user's environment; such a
    /// process is kept only by a shared agent). Caller holds `spawn_gate`.
    async fn spawn_locked(&self, user: Option<&Arc<str>>) -> Result<Arc<AgentProcess>, RpcError> {
        self.sweep();
        let count = self.procs.lock().len();
        if count >= self.cfg.pool.max_processes {
            return Err(RpcError::internal(format!(
                "agent {} has reached max_processes ({}); try again later",
                self.name, self.cfg.pool.max_processes
            )));
        }
        let id = self.common.ids.fetch_add(1, Ordering::Relaxed);
        // A shared agent's processes carry no user's environment; the first user to need one
        // claims it (for routing and accounting) without changing what it can reach.
        let user = user.filter(|_| !self.is_shared());
        let failed =
            || metrics::counter!(crate::infra::metrics::AGENT_SPAWN_FAILURES, "agent" => self.name.to_string());
        let cannot_start = |e: std::io::Error| {
            failed().increment(1);
            tracing::error!(agent = %self.name, command = %self.cfg.command, error = %e, "cannot start agent");
            // The error names the path, the operation and the setting (never a secret).
            RpcError::internal(format!("cannot start agent {}: {e}", self.name))
        };
        let slot = match user {
            Some(user) => Some(self.common.caps.agent_process(user)?),
            None => None,
        };
        let _starting = Starting::new(&self.starting);
        let mut launch = self
            .common
            .tenancy
            .launch(&self.cfg, user.map(|u| &**u))
            .map_err(cannot_start)?;
        // The user's own keys, on top of the operator's `env`, set inside the sandbox only
        // (never on bubblewrap: see `tenancy::Launch`), names a user may not set dropped.
        if let (Some(user), Some(user_env), true) = (user, &self.common.user_env, self.cfg.user_keys) {
            let vars = user_env.env(user, &self.name).await.map_err(|e| {
                failed().increment(1);
                RpcError::internal(format!("cannot start agent {}: {e}", self.name))
            })?;
            for (name, value) in &vars {
                launch.set_user_env(name, secrecy::ExposeSecret::expose_secret(value));
            }
        }
        let p = AgentProcess::spawn(
            id,
            self.name.clone(),
            slot,
            launch,
            self.common.pipes,
            &self.common.groups,
            &self.common.tracker,
        )
        .map_err(|e| {
            let setting = if &*self.name == crate::infra::config::DEFAULT_AGENT {
                " or ACP_GATEWAY_AGENT"
            } else {
                ""
            };
            cannot_start(std::io::Error::new(
                e.kind(),
                format!("{e} (agents.{}.command{setting})", self.name),
            ))
        })?;
        metrics::counter!(crate::infra::metrics::AGENT_SPAWNS, "agent" => self.name.to_string()).increment(1);
        let client_caps = info::client_capabilities(self.cfg.client_capabilities.as_ref());
        let params = serde_json::json!({
            "protocolVersion": 1,
            "clientCapabilities": client_caps,
            "clientInfo": { "name": "acp-gateway", "version": env!("CARGO_PKG_VERSION") },
        });
        let result = match p.request("initialize", &params.to_string(), self.timeout()).await {
            Ok(r) => r,
            Err(e) => {
                p.stop();
                failed().increment(1);
                tracing::warn!(agent = %self.name, process = p.id, error = %e.message, "agent failed to initialize");
                // A timeout is reported as the contract words it; anything else names the step.
                if e.message == rpc::TIMED_OUT {
                    return Err(e);
                }
                // Its data (the agent, the error id of the log line with its stderr) stays.
                return Err(RpcError {
                    message: format!("agent {} failed to initialize: {}", self.name, e.message).into(),
                    ..e
                });
            }
        };
        let info = match AgentInfo::parse(result) {
            Ok(info) => info,
            Err(e) => {
                p.stop();
                failed().increment(1);
                return Err(e);
            }
        };
        let info = Arc::new(info);
        let _ = p.info.set(info.clone());
        // What every user is shown comes from a process no user shaped: one started for no
        // user (the probe, a shared agent's). A user's own process answers for that user only
        // ([`Self::info_for`], [`Self::own_info`]): its `HOME` (an `npx` cache, site-packages)
        // is theirs to change.
        if user.is_none() {
            *self.info.lock() = Some(info);
        }
        self.procs.lock().push(p.clone());
        Ok(p)
    }

    /// Drops dead processes from the pool.
    fn sweep(&self) {
        self.procs.lock().retain(|p| !p.is_dead());
    }

    /// Periodic upkeep: time out processes that went silent with a prompt waiting and clients'
    /// other requests the agent left unanswered, forget dead processes, stop idle ones, keep
    /// `min_idle` warm ones.
    pub async fn maintain(&self) {
        self.time_out_silent();
        self.time_out_requests().await;
        self.sweep();
        let idle_timeout = Duration::from_secs(self.cfg.pool.idle_timeout_secs);
        // Warm, unassigned processes exist only for shared agents (see `prewarm` for the rest).
        let min_idle = if self.is_shared() { self.cfg.pool.min_idle } else { 0 };
        let warm = {
            let procs = self.procs.lock();
            let mut warm = procs.iter().filter(|p| p.owner().is_none()).count();
            for p in procs.iter() {
                // Keep unassigned processes up to min_idle; stop everything else that is idle.
                let unassigned = p.owner().is_none();
                if p.is_idle(idle_timeout) && (!unassigned || warm > min_idle) {
                    tracing::info!(agent = %self.name, process = p.id, "stopping idle agent process");
                    p.stop();
                    if unassigned {
                        warm -= 1;
                    }
                }
            }
            warm
        };
        for _ in warm..min_idle {
            let _gate = self.spawn_gate.lock().await;
            if let Err(e) = self.spawn_locked(None).await {
                tracing::warn!(agent = %self.name, error = %e, "cannot keep a warm process");
                break;
            }
        }
    }

    /// With `prompt_idle_timeout_secs`: every process that has written nothing for that long
    /// while a forwarded prompt waits is given up on ([`AgentProcess::time_out`]).
    fn time_out_silent(&self) {
        let secs = self.cfg.pool.prompt_idle_timeout_secs;
        if secs == 0 {
            return;
        }
        let limit = Duration::from_secs(secs);
        let silent: Vec<(Arc<AgentProcess>, Duration)> = self
            .procs
            .lock()
            .iter()
            .filter(|p| !p.is_dead())
            .filter_map(|p| p.prompt_silence().filter(|s| *s >= limit).map(|s| (p.clone(), s)))
            .collect();
        for (p, silent_for) in silent {
            p.time_out(silent_for);
        }
    }

    /// The processes not known to be dead.
    fn live_processes(&self) -> Vec<Arc<AgentProcess>> {
        self.procs.lock().iter().filter(|p| !p.is_dead()).cloned().collect()
    }

    /// Every client request but a prompt that an agent has left unanswered for
    /// `request_timeout_secs` is answered `-32603` "agent timed out"
    /// ([`AgentProcess::time_out_requests`]).
    async fn time_out_requests(&self) {
        let procs = self.live_processes();
        for p in procs {
            p.time_out_requests(self.timeout()).await;
        }
    }

    /// Stops every process.
    pub fn stop_all(&self) {
        for p in self.procs.lock().iter() {
            p.stop();
        }
    }

    /// Cancels every forwarded prompt still running on its processes
    /// ([`AgentProcess::cancel_prompts`]); returns how many.
    pub async fn cancel_prompts(&self) -> usize {
        let procs = self.live_processes();
        let mut cancelled = 0;
        for p in procs {
            cancelled += p.cancel_prompts().await;
        }
        cancelled
    }
}

/// Every configured agent's pool.
#[derive(Debug)]
pub struct Pools {
    /// By agent name.
    pools: BTreeMap<String, Arc<AgentPool>>,
}

impl Pools {
    /// Pools for every agent in `config`.
    pub fn new(
        config: &Config,
        tenancy: Arc<Tenancy>,
        caps: Arc<dyn ProcessCaps>,
        tracker: TaskTracker,
        user_env: Option<Arc<dyn UserEnv>>,
    ) -> Self {
        let common = Common {
            ids: Arc::new(AtomicU64::new(1)),
            groups: Arc::new(reaper::GroupRecord::open(&tenancy.data_dir().join("agent-groups"))),
            tenancy,
            tracker,
            caps,
            pipes: PipeLimits {
                max_line_bytes: config.limits.max_line_bytes,
                input_queue_bytes: config.limits.agent_queue_bytes,
            },
            user_env,
        };
        let pools = config
            .agents
            .iter()
            .map(|(name, cfg)| {
                (
                    name.clone(),
                    Arc::new(AgentPool::new(name, cfg.clone(), common.clone())),
                )
            })
            .collect();
        Self { pools }
    }

    /// The pool of `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<AgentPool>> {
        self.pools.get(name)
    }

    /// Every pool, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Arc<AgentPool>)> {
        self.pools.iter()
    }

    /// Runs upkeep every `every` until `cancel` fires.
    pub async fn run_maintenance(self: Arc<Self>, every: Duration, cancel: tokio_util::sync::CancellationToken) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = cancel.cancelled() => return,
            }
            for pool in self.pools.values() {
                pool.maintain().await;
            }
        }
    }

    /// Live agent processes per owning user, over every agent (for admins).
    pub fn processes_by_owner(&self) -> std::collections::HashMap<Arc<str>, usize> {
        let mut by = std::collections::HashMap::new();
        for pool in self.pools.values() {
            for owner in pool.owners() {
                *by.entry(owner).or_insert(0) += 1;
            }
        }
        by
    }

    /// Stops every process of every agent.
    pub fn stop_all(&self) {
        for pool in self.pools.values() {
            pool.stop_all();
        }
    }

    /// Cancels every forwarded prompt still running, on every agent; returns how many.
    pub async fn cancel_prompts(&self) -> usize {
        let mut cancelled = 0;
        for pool in self.pools.values() {
            cancelled += pool.cancel_prompts().await;
        }
        cancelled
    }
}
