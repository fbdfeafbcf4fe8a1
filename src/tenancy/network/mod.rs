//! `network = "egress-only"`: a sandbox in a network namespace of its own, whose only way out is
//! a user-mode network stack, with the host's loopback services, link-local addresses (the cloud
//! metadata endpoint), the shared-address and private ranges and the host's own addresses routed
//! nowhere (the review's F10: an agent runs whatever shell commands it likes).
//!
//! The stack is slirp4netns: maintained (rootless Podman, Buildah and RootlessKit run on it;
//! Debian 12 ships its 1.2.0 release), and it has what this needs as plain flags:
//! `--disable-host-loopback` (its `10.0.2.2` alias of the host's `127.0.0.1` is refused),
//! `--enable-seccomp` and `--enable-sandbox` (it confines itself: a system call filter, and when
//! the gateway is root a mount namespace with no file system and no capabilities), `--exit-fd` (it ends when the gateway's end of a
//! pipe closes, so a SIGKILLed gateway leaves none behind) and `--ready-fd`. pasta (passt) is the
//! newer design, but Debian 12's package is a 2023 snapshot with no release, and pasta copies the
//! host's own addresses and routes into the namespace by default, which is the opposite of what
//! this wants.
//!
//! How a sandbox gets its network (bubblewrap's side is [`prepare`]):
//! 1. bubblewrap runs with `--unshare-net --info-fd A --block-fd B`: it writes the sandbox's pid
//!    on `A`, then holds the program back until something is written on `B`;
//! 2. the gateway starts slirp4netns for that pid, in a process group of its own, and waits for
//!    its ready fd. It makes the namespace's `tap0` and nothing else: not `--configure`, which
//!    also brings up `lo` and so races bubblewrap's own set-up of `lo` (bubblewrap then fails
//!    with "loopback: Failed RTM_NEWADDR", seen here about one start in 30);
//! 3. the gateway configures the namespace in one `ip -batch` (through `nsenter`, also into the
//!    user namespace that owns it when bubblewrap made one, [`Namespaces`]): first `prohibit`
//!    routes for [`BLOCKED`] and for every IPv4 address of the host's interfaces at this launch,
//!    then `tap0`'s address and the default route through slirp4netns, then its host alias
//!    `10.0.2.2` routed nowhere too (only after the default route: the kernel refuses a gateway
//!    that is already routed nowhere). Until then `tap0` is down, so nothing leaves early;
//! 4. writes on `B`: the program starts, with `/etc/resolv.conf` naming slirp4netns's resolver.
//!
//! Every step is bounded ([`SET_UP_LIMIT`]); a failure, or the program's end first, kills the
//! sandbox's process group before `B` is closed ([`Gate`]: bubblewrap would run the program on
//! `B`'s end of file). slirp4netns is killed with the program (its whole group) and its exit is
//! logged. It runs without `--enable-ipv6`: the namespace has IPv6 loopback only.
//!
//! What stays reachable: addresses outside those ranges (the internet), and the host's DNS
//! resolvers through slirp4netns's `10.0.2.3` (DNS only). Routes are set at launch: an address
//! the host gains later is not in them until the agent's next process.

use std::ffi::OsString;
use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio_util::sync::CancellationToken;

pub use tools::Tools;
pub(super) use tools::{probe, tools_for};

mod tools;

/// The setting, for messages.
pub(super) const SETTING: &str = "network = \"egress-only\"";

/// Ranges an egress-only sandbox never reaches (its `127.0.0.1` is the namespace's own loopback,
/// and slirp4netns's alias of the host's is routed nowhere apart, [`SLIRP_HOST`]): "this network", the private ranges (slirp4netns's own `10.0.2.0/24` is routed on its
/// device, a longer prefix), shared address space (carrier-grade NAT; Alibaba Cloud's metadata
/// service is `100.100.100.200`), link-local (AWS, GCP and Azure metadata at `169.254.169.254`),
/// the IETF block (Oracle Cloud's legacy `192.0.0.192`).
pub(super) const BLOCKED: [&str; 7] = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
];

/// slirp4netns's alias of the host's loopback (`--disable-host-loopback` refuses it too).
const SLIRP_HOST: &str = "10.0.2.2";
/// slirp4netns's DNS forwarder, which the sandbox's `/etc/resolv.conf` names.
const SLIRP_DNS: &str = "10.0.2.3";
/// The sandbox's address on slirp4netns's network (what its `--configure` would give).
const SANDBOX_ADDRESS: &str = "10.0.2.100/24";
/// The variable on slirp4netns naming the pid of the sandbox it serves.
const SANDBOX_PID_VAR: &str = "SANDBOX_PID";
/// The sandbox's network device.
const TAP: &str = "tap0";
/// The MTU slirp4netns's own `--configure` recommends: fewer, larger packets through it.
const MTU: &str = "65520";
/// How long setting up a sandbox's network may take before the sandbox is killed (it takes
/// tens of milliseconds).
pub(super) const SET_UP_LIMIT: Duration = Duration::from_secs(10);
/// Most bytes read of bubblewrap's info (a few namespace ids) and of a helper's error output.
const READ_CAP: u64 = 16 * 1024;

/// bubblewrap's arguments for an egress-only sandbox, the descriptors they name (for the child
/// only), and the gateway's side of the set-up.
pub(super) fn prepare(tools: Arc<Tools>) -> io::Result<(Vec<OsString>, Vec<OwnedFd>, Pending)> {
    let (info, info_child) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    let (block_child, block) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    let resolv = super::launch::memory_file(
        c"acp-gateway-resolv.conf",
        format!("nameserver {SLIRP_DNS}\n").as_bytes(),
    )?;
    let fd = |f: &OwnedFd| OsString::from(f.as_raw_fd().to_string());
    let args = vec![
        "--unshare-net".into(),
        "--info-fd".into(),
        fd(&info_child),
        "--block-fd".into(),
        fd(&block_child),
        // Last of the mounts: over whatever was bound at /etc before.
        "--ro-bind-data".into(),
        fd(&resolv),
        "/etc/resolv.conf".into(),
    ];
    Ok((
        args,
        vec![info_child, block_child, resolv],
        Pending { tools, info, block },
    ))
}

/// The gateway's side of a spawned egress-only sandbox whose program bubblewrap holds back.
#[derive(Debug)]
pub struct Pending {
    /// The tools.
    tools: Arc<Tools>,
    /// Where bubblewrap writes the sandbox's pid.
    info: OwnedFd,
    /// What lets the program start.
    block: OwnedFd,
}

impl Pending {
    /// Sets the sandbox's network up and lets its program start. On any failure the sandbox's
    /// process group `group` (bubblewrap's pid: it leads its own) is killed first.
    pub async fn start(self, group: i32) -> io::Result<Egress> {
        let Self { tools, info, block } = self;
        let gate = Gate {
            block: Some(block),
            group,
        };
        let egress = tokio::time::timeout(SET_UP_LIMIT, set_up(&tools, info))
            .await
            .unwrap_or_else(|_| {
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("setting up the network took over {} s", SET_UP_LIMIT.as_secs()),
                ))
            })?;
        gate.open()?;
        Ok(egress)
    }

    /// [`start`](Self::start), then keeps the network until `ended` fires (the program is gone),
    /// and kills slirp4netns. A failure is logged and ends the program (killed, never run
    /// without its routes).
    pub async fn run(self, group: i32, ended: CancellationToken) {
        let started = tokio::select! {
            started = self.start(group) => started,
            // Ended before its network was up: the gate kills what is left of it.
            () = ended.cancelled() => return,
        };
        match started {
            Ok(egress) => egress.hold(ended).await,
            Err(e) if !ended.is_cancelled() => {
                tracing::error!(pgid = group, error = %e, "cannot set up an egress-only sandbox's network ({SETTING}); its program was killed");
            }
            Err(_) => {}
        }
    }
}

/// bubblewrap's `--block-fd`: closed without a write (on every path but [`Gate::open`]), it
/// kills the sandbox's process group first, since bubblewrap runs the program on end of file.
struct Gate {
    /// The write end.
    block: Option<OwnedFd>,
    /// The sandbox's process group.
    group: i32,
}

impl Gate {
    /// Lets the program start.
    fn open(mut self) -> io::Result<()> {
        let block = self.block.take().ok_or_else(|| io::Error::other("opened twice"))?;
        let written = std::fs::File::from(block).write_all(b"1");
        if written.is_err() {
            let _ = killpg(Pid::from_raw(self.group), Signal::SIGKILL);
        }
        written.map_err(|e| io::Error::other(format!("bubblewrap is gone: {e}")))
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        if self.block.is_some() {
            let _ = killpg(Pid::from_raw(self.group), Signal::SIGKILL);
        }
    }
}

/// The running network of one sandbox: slirp4netns, killed (its whole group) when dropped.
#[derive(Debug)]
pub struct Egress {
    /// slirp4netns.
    slirp: tokio::process::Child,
    /// Its process group (its pid).
    pgid: i32,
    /// The sandbox it serves, for logs.
    sandbox: i32,
    /// Its `--exit-fd`'s other end: it ends when this closes, the gateway's death included.
    _exit: OwnedFd,
    /// Its stderr, drained into the log.
    stderr: Option<tokio::process::ChildStderr>,
}

impl Egress {
    /// Keeps the network until `ended` fires; logs slirp4netns's own lines, and its end if it
    /// comes first (the program keeps running, with no way out).
    pub async fn hold(mut self, ended: CancellationToken) {
        let mut stderr = self.stderr.take();
        let mut buf = vec![0u8; 2048];
        loop {
            let line = async {
                match stderr.as_mut() {
                    Some(s) => s.read(&mut buf).await.ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = ended.cancelled() => return,
                status = self.slirp.wait() => {
                    tracing::warn!(sandbox = self.sandbox, status = ?status, "slirp4netns ended before the sandbox it served: that sandbox has no network now");
                    ended.cancelled().await;
                    return;
                }
                read = line => match read {
                    Some(n) if n > 0 => {
                        let text = String::from_utf8_lossy(&buf[..n]);
                        tracing::debug!(target: "agent_network", sandbox = self.sandbox, "slirp4netns: {}", text.trim_end());
                    }
                    _ => stderr = None,
                },
            }
        }
    }
}

impl Drop for Egress {
    fn drop(&mut self) {
        let _ = killpg(Pid::from_raw(self.pgid), Signal::SIGKILL);
    }
}

/// Steps 2 and 3 of the module's doc.
async fn set_up(tools: &Tools, info: OwnedFd) -> io::Result<Egress> {
    let pid = sandbox_pid(info).await?;
    let ns = Namespaces::of(pid)?;
    let egress = start_slirp(tools, pid, &ns).await?;
    in_namespace(tools, &ns, &configuration(&host_addresses())).await?;
    Ok(egress)
}

/// The `ip -batch` that configures a sandbox's namespace (step 3), `host` being the host's own
/// addresses.
fn configuration(host: &[Ipv4Addr]) -> String {
    let mut batch: String = BLOCKED
        .iter()
        .map(|r| format!("route replace prohibit {r}\n"))
        .collect();
    for address in host {
        batch.push_str(&format!("route replace prohibit {address}/32\n"));
    }
    batch.push_str(&format!(
        "address add {SANDBOX_ADDRESS} dev {TAP}\n\
         link set {TAP} mtu {MTU} up\n\
         route add default via {SLIRP_HOST} dev {TAP}\n\
         route replace prohibit {SLIRP_HOST}/32\n"
    ));
    batch
}

/// The sandbox's pid, from bubblewrap's `--info-fd` (`{"child-pid": N, …}`).
async fn sandbox_pid(info: OwnedFd) -> io::Result<i32> {
    let mut text = Vec::new();
    pipe::Receiver::from_owned_fd(info)?
        .take(READ_CAP)
        .read_to_end(&mut text)
        .await?;
    serde_json::from_slice::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v.get("child-pid")?.as_i64())
        .and_then(|pid| i32::try_from(pid).ok())
        .ok_or_else(|| io::Error::other("bubblewrap ended before it made the sandbox (its error is in the log)"))
}

/// The sandbox's network namespace, and the user namespace that owns it when that is not the
/// gateway's own (bubblewrap makes one when the gateway is not root), held open: the helpers
/// enter them through `/proc/self/fd/N`. The owner is asked of the network namespace itself
/// (`NS_GET_USERNS`), not taken from the sandbox's process: with `--dev`, an unprivileged
/// bubblewrap moves that process into a second user namespace nested in the first, whose
/// capabilities do not reach a network namespace the first one owns.
struct Namespaces {
    /// `/proc/PID/ns/net`.
    net: OwnedFd,
    /// Its owning user namespace, when it is not the gateway's.
    owner: Option<OwnedFd>,
}

impl Namespaces {
    fn of(pid: i32) -> io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let path = format!("/proc/{pid}/ns/net");
        let net = OwnedFd::from(
            std::fs::File::open(&path).map_err(|e| crate::infra::files::named(e, "cannot open", Path::new(&path)))?,
        );
        let owner = owning_user_namespace(&net)?;
        let mine = std::fs::metadata("/proc/self/ns/user")?;
        let theirs = std::fs::File::from(owner.try_clone()?).metadata()?;
        let same = (mine.dev(), mine.ino()) == (theirs.dev(), theirs.ino());
        Ok(Self {
            net,
            owner: (!same).then_some(owner),
        })
    }

    /// The descriptors a helper keeps across exec.
    fn fds(&self) -> Vec<i32> {
        std::iter::once(&self.net)
            .chain(&self.owner)
            .map(AsRawFd::as_raw_fd)
            .collect()
    }
}

/// `/proc/self/fd/N` for `fd`.
fn fd_path(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// The user namespace that owns the namespace `ns` (a new descriptor, close-on-exec).
#[allow(
    unsafe_code,
    reason = "NS_GET_USERNS has no safe wrapper; it takes no argument and returns a new descriptor that is owned here at once"
)]
fn owning_user_namespace(ns: &OwnedFd) -> io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    /// `_IO(0xb7, 0x1)` from `<linux/nsfs.h>`.
    const NS_GET_USERNS: nix::libc::Ioctl = 0xb701;
    // SAFETY: the ioctl reads nothing from memory; `ns` is open for the call.
    let fd = unsafe { nix::libc::ioctl(ns.as_raw_fd(), NS_GET_USERNS) };
    if fd < 0 {
        return Err(io::Error::other(format!(
            "cannot find the user namespace that owns the sandbox's network namespace: {}",
            io::Error::last_os_error()
        )));
    }
    // SAFETY: a descriptor the kernel just returned to us, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Every IPv4 address of the host's interfaces but loopback's (those are [`BLOCKED`]).
fn host_addresses() -> Vec<Ipv4Addr> {
    let mut out: Vec<Ipv4Addr> = nix::ifaddrs::getifaddrs()
        .map(|all| {
            all.filter_map(|ifa| Some(ifa.address?.as_sockaddr_in()?.ip()))
                .filter(|ip| !ip.is_loopback())
                .collect()
        })
        .unwrap_or_default();
    out.sort_unstable();
    out.dedup();
    out
}

/// Runs `ip -batch -` with `batch` in the sandbox's network namespace.
async fn in_namespace(tools: &Tools, ns: &Namespaces, batch: &str) -> io::Result<()> {
    let mut command = std::process::Command::new(&tools.nsenter);
    if let Some(owner) = &ns.owner {
        command
            .arg(format!("--user={}", fd_path(owner)))
            .arg("--preserve-credentials");
    }
    super::launch::keep_in_child(&mut command, ns.fds());
    let mut command = tokio::process::Command::from(command);
    command
        .arg(format!("--net={}", fd_path(&ns.net)))
        .arg("--")
        .arg(&tools.ip)
        .args(["-batch", "-"])
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .map_err(|e| crate::infra::files::named(e, "cannot run", &tools.nsenter))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(batch.as_bytes()).await?;
    }
    let mut errors = Vec::new();
    if let Some(stderr) = child.stderr.take() {
        stderr.take(READ_CAP).read_to_end(&mut errors).await?;
    }
    let status = child.wait().await?;
    if !status.success() {
        return Err(io::Error::other(format!(
            "configuring the sandbox's network namespace failed ({status}): {}",
            String::from_utf8_lossy(&errors).trim()
        )));
    }
    Ok(())
}

/// Starts slirp4netns for `pid`'s namespace and waits until it serves the namespace's `tap0`.
async fn start_slirp(tools: &Tools, pid: i32, ns: &Namespaces) -> io::Result<Egress> {
    let (exit_child, exit) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    let (ready, ready_child) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    let mut command = std::process::Command::new(&tools.slirp4netns);
    command
        .args(["--disable-host-loopback", "--enable-seccomp"])
        .arg(format!("--mtu={MTU}"))
        .arg(format!("--exit-fd={}", exit_child.as_raw_fd()))
        .arg(format!("--ready-fd={}", ready_child.as_raw_fd()))
        .arg("--netns-type=path");
    match &ns.owner {
        Some(owner) => {
            // Its `--enable-sandbox` would need root in the sandbox's user namespace, which
            // slirp4netns 1.2.0 enters only through a pid (a nested one, here): it runs with its
            // system call filter alone when the gateway is not root.
            command.arg(format!("--userns-path={}", fd_path(owner)));
        }
        None => {
            command.arg("--enable-sandbox");
        }
    }
    command
        .arg(fd_path(&ns.net))
        .arg(TAP)
        .env_clear()
        // Which sandbox it serves, for whoever looks (`ps e`): its arguments name descriptors.
        .env(SANDBOX_PID_VAR, pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut keep = ns.fds();
    keep.extend([exit_child.as_raw_fd(), ready_child.as_raw_fd()]);
    super::launch::keep_in_child(&mut command, keep);
    let mut command = tokio::process::Command::from(command);
    command.kill_on_drop(true);
    let spawned = command.spawn();
    // Its copies only: the ready pipe's end of file is its death.
    drop((exit_child, ready_child));
    let mut slirp = spawned.map_err(|e| crate::infra::files::named(e, "cannot run", &tools.slirp4netns))?;
    let pgid = slirp
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .ok_or_else(|| io::Error::other("slirp4netns exited at once"))?;
    let stderr = slirp.stderr.take();
    let mut egress = Egress {
        slirp,
        pgid,
        sandbox: pid,
        _exit: exit,
        stderr,
    };
    let mut byte = [0u8; 1];
    let n = pipe::Receiver::from_owned_fd(ready)?.read(&mut byte).await?;
    if n == 1 {
        return Ok(egress);
    }
    let mut errors = Vec::new();
    if let Some(stderr) = egress.stderr.take() {
        let _ = tokio::time::timeout(Duration::from_secs(1), stderr.take(READ_CAP).read_to_end(&mut errors)).await;
    }
    Err(io::Error::other(format!(
        "slirp4netns ended before the network was up: {}",
        String::from_utf8_lossy(&errors).trim()
    )))
}

#[cfg(test)]
mod tests;
