//! Starting a program for a user: an agent process, or a sign-in's login program in the agent's
//! sandbox ([`Tenancy::launch`], [`Tenancy::launch_login`]): its home, working directory and
//! environment, and the sandbox around it.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::path::PathBuf;

use super::paths::{checked_user, fill};
use super::{
    CWD_SETTING, HOMES_SETTING, INHERITED_ENV, Launch, Program, Purpose, SHARED_HOME, Tenancy, escape_user,
    for_setting, network, sandbox, usable_dir,
};
use crate::infra::config::{AgentConfig, NetworkMode};
use crate::infra::files::private_dir;

impl Tenancy {
    /// The command that starts one process of `agent` for `user` (`None`: a shared process).
    /// Every error names the path, the operation and the setting to change.
    pub fn launch(&self, agent: &AgentConfig, user: Option<&str>) -> io::Result<Launch> {
        self.start(agent, user, None, Purpose::Agent)
    }

    /// The command that starts a sign-in's login `program` for `user`, in a pseudo-terminal, in
    /// `agent`'s sandbox with `agent`'s environment, home and working directory. Nothing of
    /// `program` is trusted: it runs inside the sandbox only, its `env` is filtered like a
    /// user's keys, and no file it names is brought into the sandbox.
    pub fn launch_login(&self, agent: &AgentConfig, user: &str, program: &Program) -> io::Result<Launch> {
        self.start(agent, Some(user), Some(program), Purpose::Login)
    }

    fn start(
        &self,
        agent: &AgentConfig,
        user: Option<&str>,
        program: Option<&Program>,
        purpose: Purpose,
    ) -> io::Result<Launch> {
        let (command, args) = match program {
            Some(p) => (&p.command, &p.args),
            None => (&agent.command, &agent.args),
        };
        let label = if program.is_some() {
            "the sign-in method"
        } else {
            "the agent"
        };
        // Checked at every launch: a sign-in method's command line is an agent's answer.
        sandbox::refuse_secret_paths(label, command, args, &self.secret)?;
        // A per-user agent's process for nobody is a probe: it only ever answers `initialize`,
        // in a home of its own, with no workspace.
        let probe = user.is_none() && !agent.pool.share_between_users;
        let home = if probe { self.probe_home()? } else { self.home(user)? };
        let roots = match user {
            Some(user) => self.roots(user)?,
            None if probe => Vec::new(),
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
        // The user's own first root, never a shared one: a program started in a directory that
        // other users can write reads their `.npmrc`, `uv.toml` or `node_modules` as its own.
        let cwd = agent
            .cwd
            .clone()
            .or_else(|| user.and_then(|u| self.own_root(u)))
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
        if purpose == Purpose::Login {
            env.insert("TERM".into(), "xterm-256color".into());
        }
        let command_line: Vec<OsString> = std::iter::once(command).chain(args).map(OsString::from).collect();
        // Only the operator's command line brings files into the sandbox.
        let sandbox_args = || {
            let places = sandbox::Places {
                hidden: &self.hidden,
                hidden_files: &self.hidden_files,
                home: &home,
                roots: &roots,
                cwd: &cwd,
            };
            sandbox::bwrap_args(&places, agent, purpose)
        };
        let egress_only = agent.network == NetworkMode::EgressOnly;
        let mut launch = match (&self.bwrap, sandboxed) {
            (Some(bwrap), true) => {
                let launch = Launch::sandboxed(bwrap.clone(), sandbox_args(), command_line, env, purpose);
                if egress_only {
                    let tools = self.egress.clone().ok_or_else(|| {
                        io::Error::other(format!("{}: its tools were not found at start", network::SETTING))
                    })?;
                    launch.with_egress(tools)
                } else {
                    launch
                }
            }
            // Fails closed: never the open network for an agent that asked for egress-only.
            _ if egress_only => {
                return Err(io::Error::other(format!(
                    "{} needs the bubblewrap sandbox, and this agent runs without it",
                    network::SETTING
                )));
            }
            _ => Launch::unsandboxed(command_line, env, Some(cwd.clone()), purpose),
        };
        if let Some(program) = program {
            for (name, value) in &program.env {
                if !launch.set_user_env(name, value) {
                    tracing::warn!(variable = %name, "a sign-in method's variable was dropped: users may not set it");
                }
            }
        }
        Ok(launch)
    }

    /// `user`'s first `{user}` root, when it can be used.
    fn own_root(&self, user: &str) -> Option<PathBuf> {
        let name = checked_user(user).ok()?;
        self.roots
            .iter()
            .filter(|t| t.contains("{user}"))
            .find_map(|t| usable_dir(&fill(t, &name)).ok())
    }
}
