//! The process groups of running agents, recorded in the data directory, so that a gateway
//! that was killed (SIGKILL, OOM) cleans up after itself at its next start: an agent's own
//! children (an `npx` wrapper's node process, an MCP server) have no parent-death signal.
//!
//! A record is `pgid start-time` (the leader's start time in clock ticks since boot, from
//! `/proc/<pid>/stat`): a group is killed at start only if its leader is gone or is still the
//! same process, never a stranger that reused the id.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// The groups this gateway started and has not seen end.
#[derive(Debug)]
pub struct GroupRecord {
    /// `{data_dir}/agent-groups`.
    path: PathBuf,
    /// pgid → its leader's start time.
    live: Mutex<BTreeMap<i32, u64>>,
}

/// A process's start time and process group, from `/proc/<pid>/stat`.
fn stat(pid: i32) -> Option<(u64, i32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces and parentheses).
    let rest = text.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state): pgrp is field 5, starttime field 22.
    let pgrp = fields.get(2)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((start, pgrp))
}

/// Whether any process is still in group `pgid`.
fn group_has_members(pgid: i32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .any(|pid| stat(pid).is_some_and(|(_, pgrp)| pgrp == pgid))
}

impl GroupRecord {
    /// Opens the record at `path`, first killing every group a previous run left behind.
    pub fn open(path: &Path) -> Self {
        let leftovers = std::fs::read_to_string(path).unwrap_or_default();
        for line in leftovers.lines() {
            let mut parts = line.split_whitespace();
            let (Some(Ok(pgid)), Some(Ok(start))) =
                (parts.next().map(str::parse::<i32>), parts.next().map(str::parse::<u64>))
            else {
                continue;
            };
            let same_leader = match stat(pgid) {
                Some((leader_start, _)) => leader_start == start,
                // The leader is gone: while any member is left, no new process can take its id.
                None => true,
            };
            if same_leader && group_has_members(pgid) {
                tracing::warn!(pgid, "killing an agent process group left by a previous run");
                let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
            }
        }
        let record = Self {
            path: path.to_path_buf(),
            live: Mutex::new(BTreeMap::new()),
        };
        record.save(&BTreeMap::new());
        record
    }

    /// Records a group just started (its leader is `pgid`).
    pub fn add(&self, pgid: i32) {
        let Some((start, _)) = stat(pgid) else { return };
        let mut live = self.live.lock();
        live.insert(pgid, start);
        self.save(&live);
    }

    /// Forgets a group that has been killed.
    pub fn remove(&self, pgid: i32) {
        let mut live = self.live.lock();
        if live.remove(&pgid).is_some() {
            self.save(&live);
        }
    }

    /// Rewrites the file (small: one line per running agent process).
    fn save(&self, live: &BTreeMap<i32, u64>) {
        let text: String = live.iter().map(|(pgid, start)| format!("{pgid} {start}\n")).collect();
        let tmp = self.path.with_extension("tmp");
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .and_then(|()| std::fs::rename(&tmp, &self.path));
        if let Err(e) = written {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot record agent process groups");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    #[test]
    fn kills_groups_left_by_a_previous_run_and_spares_strangers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("agent-groups");
        let mut orphan = std::process::Command::new("sleep")
            .arg("600")
            .process_group(0)
            .spawn()
            .expect("sleep");
        let mut stranger = std::process::Command::new("sleep")
            .arg("600")
            .process_group(0)
            .spawn()
            .expect("sleep");
        let (orphan_id, stranger_id) = (orphan.id() as i32, stranger.id() as i32);
        let record = GroupRecord::open(&path);
        record.add(orphan_id);
        // A record whose leader's start time does not match: an id reused by someone else.
        std::fs::write(
            &path,
            format!("{} {}\n{stranger_id} 1\n", orphan_id, stat(orphan_id).expect("stat").0),
        )
        .expect("write");
        drop(record);
        GroupRecord::open(&path);
        let status = orphan.wait().expect("wait");
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9));
        assert!(stranger.try_wait().expect("try_wait").is_none(), "a stranger is spared");
        let _ = stranger.kill();
        let _ = stranger.wait();
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "");
    }
}
