//! What `network = "egress-only"` needs on the host (slirp4netns, nsenter, ip), found at start,
//! and the start-up check that a sandbox's network really comes up here.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use tokio::io::AsyncReadExt;

use super::{READ_CAP, SET_UP_LIMIT, SETTING};
use crate::infra::config::{Config, NetworkMode, SandboxMode};
use crate::tenancy::launch::{Launch, Purpose, Ready};

/// The programs egress-only needs, found at start.
#[derive(Debug)]
pub struct Tools {
    /// The user-mode network stack.
    pub(super) slirp4netns: PathBuf,
    /// To run `ip` in the sandbox's network namespace.
    pub(super) nsenter: PathBuf,
    /// To add the routes.
    pub(super) ip: PathBuf,
}

impl Tools {
    /// Finds them on `PATH` (and in `/usr/sbin` and `/sbin`, where Debian keeps `ip`); else what
    /// to install.
    fn find() -> Result<Self, NotInstalled> {
        let find = |name: &'static str, package: &'static str| which(name).ok_or(NotInstalled { name, package });
        Ok(Self {
            slirp4netns: find("slirp4netns", "slirp4netns")?,
            nsenter: find("nsenter", "util-linux")?,
            ip: find("ip", "iproute2")?,
        })
    }
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// The tools of `network = "egress-only"`, when an agent asks for it; an error naming the agent
/// and the setting when it cannot have it here (no sandbox: fails closed).
pub(in crate::tenancy) fn tools_for(config: &Config, bwrap_works: bool) -> io::Result<Option<Arc<Tools>>> {
    let mut tools = None;
    for (name, agent) in config
        .agents
        .iter()
        .filter(|(_, a)| a.network == NetworkMode::EgressOnly)
    {
        let setting = format!("agents.{name}.{}", SETTING);
        if agent.sandbox == SandboxMode::None || !bwrap_works {
            return Err(io::Error::other(format!(
                "{setting} needs the bubblewrap sandbox, and {}; install bubblewrap, or set agents.{name}.network = \"open\"",
                if agent.sandbox == SandboxMode::None {
                    format!("agents.{name}.sandbox = \"none\"")
                } else {
                    String::from("bubblewrap does not work on this host")
                }
            )));
        }
        if tools.is_none() {
            tools = Some(Arc::new(
                Tools::find().map_err(|why| io::Error::other(format!("{setting}: {why}")))?,
            ));
        }
    }
    Ok(tools)
}

/// Starts one sandbox with the egress-only network around `true` (the start-up check behind
/// [`Tenancy::check_network`](crate::tenancy::Tenancy::check_network)); the error names the agents that
/// asked for it.
pub(in crate::tenancy) async fn probe(bwrap: &Path, tools: &Arc<Tools>, config: &Config) -> io::Result<()> {
    let names: Vec<String> = config
        .agents
        .iter()
        .filter(|(_, a)| a.network == NetworkMode::EgressOnly)
        .map(|(n, _)| format!("agents.{n}.{SETTING}"))
        .collect();
    let failed = |why: String| {
        io::Error::other(format!(
            "{}: a sandbox's network cannot be set up on this host: {why} (slirp4netns needs /dev/net/tun, and bubblewrap needs to make a network namespace)",
            names.join(", ")
        ))
    };
    let env = std::env::var_os("PATH")
        .map(|p| (OsString::from("PATH"), p))
        .into_iter()
        .collect();
    let launch = Launch::sandboxed(
        bwrap.to_path_buf(),
        crate::tenancy::sandbox::probe_args(),
        vec!["true".into()],
        env,
        Purpose::Agent,
    )
    .with_egress(tools.clone());
    let Ready {
        mut command,
        child_fds,
        network,
    } = launch.into_tokio().map_err(|e| failed(e.to_string()))?;
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let spawned = command.spawn();
    drop(child_fds);
    let mut child = spawned.map_err(|e| failed(format!("cannot run bubblewrap: {e}")))?;
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .ok_or_else(|| failed("bubblewrap exited at once".into()))?;
    let started = match network {
        Some(network) => network.start(group).await,
        None => Err(io::Error::other("no network was set up")),
    };
    // The sandbox runs `true` (when its network came up) and ends; its network goes after.
    let ended = tokio::time::timeout(SET_UP_LIMIT, async {
        let mut errors = Vec::new();
        if let Some(stderr) = child.stderr.take() {
            let _ = stderr.take(READ_CAP).read_to_end(&mut errors).await;
        }
        (child.wait().await, errors)
    })
    .await;
    let (status, errors) = ended.map_err(|_| failed("the sandbox did not end".into()))?;
    let errors = String::from_utf8_lossy(&errors).trim().to_string();
    let _egress = started.map_err(|e| failed(format!("{e} {errors}")))?;
    match status {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(failed(format!("the sandbox ended with {s}: {errors}"))),
        Err(e) => Err(failed(e.to_string())),
    }
}

/// A program egress-only needs that is not on this host.
#[derive(Debug, thiserror::Error)]
#[error("`{name}` is not installed (Debian package `{package}`)")]
pub struct NotInstalled {
    /// The program.
    name: &'static str,
    /// What installs it.
    package: &'static str,
}
