//! The gateway as a separate process: the open-file limit, its memory and CPU, started and stopped
//! on every way out.

use super::*;

/// (soft, hard) `Max open files` of this process.
fn nofile_limits() -> Option<(u64, u64)> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let mut words = line["Max open files".len()..].split_whitespace();
    let parse = |w: Option<&str>| {
        w.map(|w| {
            if w == "unlimited" {
                u64::MAX
            } else {
                w.parse().unwrap_or(0)
            }
        })
    };
    Some((parse(words.next())?, parse(words.next())?))
}

/// Makes sure the soft open-file limit is as high as the hard one, re-running this program
/// under `sh -c 'ulimit -n …'` when it is not (returns only if no re-run was needed).
pub(crate) fn raise_nofile() -> Result<(u64, u64)> {
    let (soft, hard) = nofile_limits().context("reading /proc/self/limits")?;
    if soft >= hard || std::env::var_os(REEXEC_MARK).is_some() {
        return Ok((soft, hard));
    }
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("locating this program")?;
    let err = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(r#"ulimit -S -n "$(ulimit -H -n)" && exec "$0" "$@""#)
        .arg(exe)
        .args(std::env::args_os().skip(1))
        .env(REEXEC_MARK, "1")
        .exec();
    Err(anyhow!("re-running with a raised open-file limit: {err}"))
}

// ---------------------------------------------------------------------------------------------
// The gateway process.

/// Memory of a process, in KiB.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Mem {
    pub(crate) rss: u64,
    pub(crate) rss_anon: u64,
    /// `Pss_Anon` from `smaps_rollup` (`Anonymous` on kernels without it), when readable.
    pub(crate) pss_anon: Option<u64>,
    threads: u64,
}

fn field_kib(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    line[name.len()..].split_whitespace().next()?.parse().ok()
}

fn read_mem(pid: u32) -> Result<Mem> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).context("reading the gateway's status")?;
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    Ok(Mem {
        rss: field_kib(&status, "VmRSS:").context("VmRSS")?,
        rss_anon: field_kib(&status, "RssAnon:").unwrap_or(0),
        pss_anon: field_kib(&rollup, "Pss_Anon:").or_else(|| field_kib(&rollup, "Anonymous:")),
        threads: field_kib(&status, "Threads:").unwrap_or(0),
    })
}

impl std::fmt::Display for Mem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pss = self.pss_anon.map(|p| format!("{:.1} MiB", p as f64 / 1024.0));
        write!(
            f,
            "VmRSS {:>7.1} MiB, RssAnon {:>7.1} MiB, Pss_Anon {}, {} threads",
            self.rss as f64 / 1024.0,
            self.rss_anon as f64 / 1024.0,
            pss.as_deref().unwrap_or("n/a"),
            self.threads
        )
    }
}

/// Direct children of `pid` (all its threads'): the agent processes, each its own group leader.
pub(crate) fn children_of(pid: u32) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
                out.extend(list.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Whether `pid` is a running (not zombie) process.
pub(crate) fn running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// CPU seconds (user + system) a process has used so far.
fn cpu_secs(pid: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // utime and stime are the 12th and 13th fields after the parenthesised command name.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: f64 = fields
        .get(11..13)
        .map_or(0.0, |f| f.iter().filter_map(|v| v.parse::<f64>().ok()).sum());
    // USER_HZ is 100 on every Linux platform that matters here.
    ticks / 100.0
}

/// CPU seconds of the gateway, of its agents, and of this program.
pub(crate) fn cpu_split(gateway: u32) -> [f64; 3] {
    let agents = children_of(gateway).iter().map(|p| cpu_secs(&p.to_string())).sum();
    [cpu_secs(&gateway.to_string()), agents, cpu_secs("self")]
}

pub(crate) struct GatewayProcess {
    child: Child,
    pub(crate) pid: u32,
    pub(crate) addr: SocketAddr,
    log: PathBuf,
    stopped: bool,
    /// Its data directory and config; removed after the gateway is stopped (fields drop after
    /// `Drop::drop`).
    _dir: tempfile::TempDir,
}

/// Asks the kernel to SIGKILL the gateway when this program dies, however it dies.
#[allow(
    unsafe_code,
    reason = "pre_exec runs between fork and exec; the closure only makes async-signal-safe system calls (prctl, getppid) and allocates nothing"
)]
fn die_with_parent(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec; prctl(PR_SET_PDEATHSIG) and
    // getppid are async-signal-safe, and nothing here allocates or takes a lock.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::other("the benchmark is gone"));
            }
            Ok(())
        });
    }
}

impl GatewayProcess {
    /// Starts `acp-gateway serve --config <config>` in a fresh data directory and waits for the
    /// address it prints. Must be called on the main thread (the death signal follows the
    /// thread that forks).
    pub(crate) fn start(k: &Knobs, print_config: bool) -> Result<Self> {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir()?;
        let config_path = dir.path().join("scale.toml");
        let config_text = config_toml(dir.path(), k);
        std::fs::write(&config_path, &config_text)?;
        if print_config {
            println!("config (JWT secret from ACP_GATEWAY_JWT_SECRET, RUST_LOG=warn; other limits at their defaults):");
            for line in config_text.lines().filter(|l| !l.is_empty()) {
                println!("  {line}");
            }
        }
        let config = config_path.as_path();
        let log = dir.path().join("gateway.log");
        let mut command = std::process::Command::new(gateway_bin());
        command
            .arg("serve")
            .arg("--config")
            .arg(config)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).context("creating the gateway's log")?)
            .process_group(0);
        // The environment must not override the file (DATABASE_URL and ACP_GATEWAY_* would).
        for (name, _) in std::env::vars_os() {
            let name_str = name.to_string_lossy();
            if name_str.starts_with("ACP_GATEWAY_") || name_str == "DATABASE_URL" || name_str == "RUST_LOG" {
                command.env_remove(&name);
            }
        }
        command.env("ACP_GATEWAY_JWT_SECRET", SECRET).env("RUST_LOG", "warn");
        die_with_parent(&mut command);
        let mut child = command.spawn().context("starting the gateway")?;
        let pid = child.id();
        GATEWAY_PGID.store(pid as i32, Ordering::SeqCst);
        *GATEWAY_DIR.lock().unwrap_or_else(|e| e.into_inner()) = Some(dir.path().to_path_buf());
        let stdout = child.stdout.take().context("the gateway's stdout")?;
        let mut this = Self {
            child,
            pid,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            log,
            stopped: false,
            _dir: dir,
        };
        // `serve` prints the web UI's address once listening; the rest of its stdout is drained.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if !sent && let Some(rest) = line.split("http://").nth(1) {
                    let addr = rest.split('/').next().unwrap_or_default().to_string();
                    sent = tx.send(addr).is_ok();
                }
            }
        });
        let addr = rx
            .recv_timeout(STEP)
            .map_err(|_| anyhow!("the gateway printed no address; its log:\n{}", this.log_tail()))?;
        this.addr = addr
            .parse()
            .with_context(|| format!("the gateway's address {addr:?}"))?;
        Ok(this)
    }

    pub(crate) fn mem(&self) -> Result<Mem> {
        read_mem(self.pid)
    }

    pub(crate) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Stops the gateway: SIGTERM (it stops its agents), then SIGKILL to its group after 5 s,
    /// then SIGKILL to every agent's group. Returns the agents still running afterwards.
    pub(crate) fn stop(&mut self) -> Vec<i32> {
        if self.stopped {
            return Vec::new();
        }
        self.stopped = true;
        let agents = children_of(self.pid);
        let group = Pid::from_raw(self.pid as i32);
        let _ = killpg(group, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = killpg(group, Signal::SIGKILL);
        let _ = self.child.wait();
        GATEWAY_PGID.store(0, Ordering::SeqCst);
        for &agent in &agents {
            let _ = killpg(Pid::from_raw(agent), Signal::SIGKILL);
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let left: Vec<i32> = agents.iter().copied().filter(|&p| running(p)).collect();
            if left.is_empty() || Instant::now() > deadline {
                return left;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let left = self.stop();
        if !left.is_empty() {
            eprintln!("agent processes still running after the gateway stopped: {left:?}");
        }
    }
}

/// Kills the gateway's group on Ctrl-C or SIGTERM (its agents die with it) and exits.
pub(crate) fn kill_on_signal() {
    tokio::spawn(async {
        acp_gateway::app::shutdown_signal().await;
        let pgid = GATEWAY_PGID.load(Ordering::SeqCst);
        if pgid > 0 {
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
        if let Some(dir) = GATEWAY_DIR.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = std::fs::remove_dir_all(dir);
        }
        eprintln!("interrupted; gateway killed");
        std::process::exit(130);
    });
}
