//! An agent's OS process: started in a process group of its own (an `npx`/`uvx` wrapper, or an
//! MCP server the agent starts, would otherwise outlive it), reaped by one task that stops the
//! whole group (TERM, then KILL) and kills whatever is left of it once the leader is gone, and its
//! stderr logged with the last lines kept for the report of how it ended.

use parking_lot::{Mutex, MutexGuard};
use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::BytesMut;
use futures_util::StreamExt;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout};
use tokio_util::codec::{Decoder, FramedRead, LinesCodec, LinesCodecError};
use tokio_util::sync::CancellationToken;

use super::reaper::GroupRecord;
use crate::tenancy::{Launch, Pending, Ready};

/// stderr lines kept for error reports.
const STDERR_TAIL: usize = 20;
/// Longest stderr line logged.
const STDERR_LINE_MAX: usize = 8 * 1024;

/// Locks `m`, also after a panic elsewhere left it poisoned: what the pool keeps under its locks
/// (maps, a name, a few lines) is whole after every statement, so a panic cannot leave it torn.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock()
}

/// A child just started, with its pipes taken out, for the tasks that serve it.
pub(super) struct Spawned {
    /// OS process id (also its process group id).
    pub pid: u32,
    /// For [`wait`], the only one that reaps it.
    pub child: Child,
    /// Kills the group on every path that drops it; [`wait`] holds it.
    pub guard: GroupGuard,
    /// For the writer that drains the JSON-RPC peer's queue.
    pub stdin: ChildStdin,
    /// For the reader that routes the agent's lines.
    pub stdout: ChildStdout,
    /// For [`read_stderr`].
    pub stderr: ChildStderr,
    /// With `network = "egress-only"`: what sets the sandbox's network up (the agent starts
    /// once it has), to run as a task of its own.
    pub network: Option<Pending>,
}

/// Starts `launch` with piped stdio as the leader of a new session and process group (the
/// launch does `setsid`), recorded in `groups` (so that a gateway killed outright still cleans
/// it up at its next start).
pub(super) fn spawn(launch: Launch, groups: &GroupRecord) -> std::io::Result<Spawned> {
    let Ready {
        mut command,
        child_fds,
        network,
    } = launch.into_tokio()?;
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let program = std::path::PathBuf::from(command.as_std().get_program());
    let spawned = command.spawn();
    // The child has its copies (or failed): the gateway's go.
    drop(child_fds);
    let mut child = spawned.map_err(|e| crate::infra::files::named(e, "cannot run", &program))?;
    let pid = child
        .id()
        .ok_or_else(|| std::io::Error::other("agent exited at once"))?;
    let guard = GroupGuard::new(pid as i32);
    let (Some(stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(std::io::Error::other("agent pipes missing"));
    };
    groups.add(guard.0);
    Ok(Spawned {
        pid,
        child,
        guard,
        stdin,
        stdout,
        stderr,
        network,
    })
}

/// Kills a whole process group (SIGKILL) when dropped, whatever path dropped it: an agent's,
/// or a terminal sign-in's login program.
#[derive(Debug)]
pub struct GroupGuard(i32);

impl GroupGuard {
    /// Guards the process group `pgid` (a group leader's pid).
    pub fn new(pgid: i32) -> Self {
        Self(pgid)
    }

    /// The group's id.
    pub fn pgid(&self) -> i32 {
        self.0
    }

    /// Kills the whole group now (ESRCH, a group already gone, is no error).
    pub fn kill(&self) {
        let _ = killpg(Pid::from_raw(self.0), Signal::SIGKILL);
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Reaps the child; stops its group when `stop` fires (TERM, then KILL after two seconds) and
/// always kills whatever is left of the group once the leader is gone. Returns how it ended.
pub(super) async fn wait(
    mut child: Child,
    guard: GroupGuard,
    groups: &GroupRecord,
    stop: &CancellationToken,
) -> String {
    let status = tokio::select! {
        status = child.wait() => status,
        () = stop.cancelled() => {
            let _ = killpg(Pid::from_raw(guard.0), Signal::SIGTERM);
            match tokio::time::timeout(Duration::from_secs(2), child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    let _ = killpg(Pid::from_raw(guard.0), Signal::SIGKILL);
                    child.wait().await
                }
            }
        }
    };
    let pgid = guard.0;
    drop(guard);
    groups.remove(pgid);
    match status {
        Ok(s) => match (s.code(), std::os::unix::process::ExitStatusExt::signal(&s)) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(sig)) => format!("killed by signal {sig}"),
            _ => s.to_string(),
        },
        Err(e) => format!("wait failed: {e}"),
    }
}

/// The last stderr lines of a child, logged when it ends (never sent to clients: they can hold
/// other users' data or the host's secrets).
pub(super) struct StderrTail {
    lines: Mutex<VecDeque<String>>,
    /// A sign-in running on the process is shown the lines meant for its user.
    pub watch: super::signin_watch::SigninWatch,
}

impl Default for StderrTail {
    fn default() -> Self {
        Self {
            lines: Mutex::new(VecDeque::with_capacity(STDERR_TAIL)),
            watch: super::signin_watch::SigninWatch::default(),
        }
    }
}

impl StderrTail {
    /// The lines kept, oldest first.
    pub fn lines(&self) -> Vec<String> {
        lock(&self.lines).iter().cloned().collect()
    }

    fn push(&self, line: String) {
        self.watch.stderr(&line);
        let mut tail = lock(&self.lines);
        if tail.len() == STDERR_TAIL {
            tail.pop_front();
        }
        tail.push_back(line);
    }
}

/// One line of an agent's output as [`AgentLines`] reads it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Line {
    /// A whole line, without its `\n` (or `\r\n`).
    Text(String),
    /// A line longer than the cap: skipped.
    TooLong,
    /// A line that is not UTF-8: skipped.
    NotUtf8,
}

/// Newline-delimited lines with a length cap, where a line over the cap or not UTF-8 is an item
/// of its own rather than an error: tokio-util's `FramedRead` ends the stream after a decoder
/// error, which would take one bad line for the end of the agent's output.
#[derive(Debug)]
pub(super) struct AgentLines(LinesCodec);

impl AgentLines {
    /// Lines of at most `max` bytes.
    pub fn new(max: usize) -> Self {
        Self(LinesCodec::new_with_max_length(max))
    }

    fn item(decoded: Result<Option<String>, LinesCodecError>) -> Result<Option<Line>, std::io::Error> {
        match decoded {
            Ok(line) => Ok(line.map(Line::Text)),
            // `LinesCodec` discards the rest of the long line by itself and goes on.
            Err(LinesCodecError::MaxLineLengthExceeded) => Ok(Some(Line::TooLong)),
            // The decoder does no I/O: its one `Io` error is a line that is not UTF-8, already
            // taken out of the buffer.
            Err(LinesCodecError::Io(_)) => Ok(Some(Line::NotUtf8)),
        }
    }
}

impl Decoder for AgentLines {
    type Item = Line;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Line>, std::io::Error> {
        Self::item(self.0.decode(buf))
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Line>, std::io::Error> {
        Self::item(self.0.decode_eof(buf))
    }
}

/// Logs each stderr line (cut at 8 KiB) under the agent's name and process id, and keeps the
/// last ones in `tail`. Stops at EOF, or once nobody holds `tail` any more; reads on past lines
/// it cannot log, so the agent never blocks on a full stderr pipe.
pub(super) async fn read_stderr(
    stderr: ChildStderr,
    tail: Weak<StderrTail>,
    agent: Arc<str>,
    process: u64,
    ended: CancellationToken,
) {
    // Whatever way this ends, the reaper may now read a whole tail.
    let _ended = ended.drop_guard();
    let mut lines = FramedRead::new(stderr, AgentLines::new(STDERR_LINE_MAX));
    while let Some(line) = lines.next().await {
        let Some(tail) = tail.upgrade() else {
            return;
        };
        let line = match line {
            Ok(Line::Text(line)) => line,
            Ok(Line::TooLong) => String::from("[stderr line over 8 KiB cut]"),
            Ok(Line::NotUtf8) => String::from("[stderr line not UTF-8]"),
            Err(_) => return,
        };
        tracing::info!(target: "agent_stderr", agent = %agent, process, "{line}");
        tail.push(line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_long_or_broken_line_is_skipped_and_reading_goes_on() {
        let input: &[u8] = b"first\nxxxxxxxxxxxxxxxxxxxx\nsecond\n\xff\xfe\nthird";
        let lines: Vec<Line> = FramedRead::new(input, AgentLines::new(8))
            .map(|l| l.expect("no error"))
            .collect()
            .await;
        assert_eq!(
            lines,
            vec![
                Line::Text("first".into()),
                Line::TooLong,
                Line::Text("second".into()),
                Line::NotUtf8,
                Line::Text("third".into()),
            ]
        );
    }
}
