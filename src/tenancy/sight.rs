//! What one user's agents can see of this host, as one rule that the sandbox builds its mounts
//! from and the workspace file routes check every path against (links resolved first), so that
//! neither shows what the other hides.
//!
//! Everything is in sight except the hidden places: the gateway's data directory, the SQLite
//! file's directory, the directories that hold every user's homes and workspaces, and the files
//! that hold the gateway's configuration. Inside a hidden directory only the user's own home and
//! own workspace roots are in sight again; a hidden file stays hidden wherever it lies.

use std::path::{Path, PathBuf};

/// The host's own, which a sandbox replaces with its own (`--proc`, `--dev`).
const HOST_ONLY: [&str; 2] = ["/proc", "/dev"];

/// The hidden places of a gateway, and one user's own places inside them.
#[derive(Debug, Clone, Default)]
pub struct Sight {
    /// Directories out of sight, resolved (symlinks followed).
    hidden_dirs: Vec<PathBuf>,
    /// Single files out of sight (the configuration file), resolved.
    hidden_files: Vec<PathBuf>,
    /// The user's own home and roots: in sight even inside a hidden directory.
    own: Vec<PathBuf>,
}

impl Sight {
    /// The rule for one user: `hidden_dirs` and `hidden_files` out of sight, `own` back in.
    pub(super) fn new(hidden_dirs: &[PathBuf], hidden_files: &[PathBuf], own: Vec<PathBuf>) -> Self {
        Self {
            hidden_dirs: hidden_dirs.to_vec(),
            hidden_files: hidden_files.to_vec(),
            own,
        }
    }

    /// Whether `path` (absolute, resolved) is in sight. The host's `/proc` and `/dev` never are:
    /// a sandbox has its own.
    pub fn sees(&self, path: &Path) -> bool {
        if self.hidden_files.iter().any(|f| path == f) || HOST_ONLY.iter().any(|h| path.starts_with(h)) {
            return false;
        }
        self.own.iter().any(|o| path.starts_with(o)) || !self.hidden_dirs.iter().any(|h| path.starts_with(h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_places_are_out_of_sight_but_the_users_own() {
        let sight = Sight::new(
            &[PathBuf::from("/d/data"), PathBuf::from("/d/work")],
            &[PathBuf::from("/etc/acp/config.toml")],
            vec![PathBuf::from("/d/data/homes/alice"), PathBuf::from("/d/work/alice")],
        );
        for seen in [
            "/",
            "/etc/passwd",
            "/d/data/homes/alice/.x",
            "/d/work/alice",
            "/d/database",
            "/etc/acp/other",
        ] {
            assert!(sight.sees(Path::new(seen)), "{seen}");
        }
        for unseen in [
            "/d/data",
            "/d/data/jwt-secret",
            "/d/data/homes/bob/cred.json",
            "/d/data/homes/alice2",
            "/d/work/bob",
            "/etc/acp/config.toml",
            "/proc/1/environ",
            "/dev/watchdog",
        ] {
            assert!(!sight.sees(Path::new(unseen)), "{unseen}");
        }
    }
}
