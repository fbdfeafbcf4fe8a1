//! A test gateway's data directory in the system temp dir, removed for good when its last handle
//! goes.

use std::path::Path;
use std::sync::Arc;

/// A temporary directory that an in-process gateway writes into.
///
/// A gateway dropped without `stop()` is still ending its agents while its directory goes, and
/// the agent reaper rewrites `agent-groups` as each ends: one rewrite landing between
/// `remove_dir_all`'s unlinks and its `rmdir` left the directory in the system temp dir (six in
/// one run of the suite). Dropping this removes it again until it is gone; a rewrite after that
/// finds no directory to write in. Shared by `Arc`, so whichever holder goes last does it: the
/// gateway, or a test that keeps the directory to start another gateway in it.
pub struct DataDir(Option<tempfile::TempDir>);

impl DataDir {
    /// A new, empty directory.
    pub fn new() -> Arc<Self> {
        Arc::new(Self(Some(tempfile::tempdir().expect("tempdir"))))
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        self.0.as_ref().expect("a data dir is there until dropped").path()
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let Some(dir) = self.0.take() else { return };
        let path = dir.path().to_path_buf();
        drop(dir);
        for _ in 0..10 {
            if !path.exists() {
                break;
            }
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}
