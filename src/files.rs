//! Files and directories only the gateway's OS user may read: the data directory, the generated
//! secret, the SQLite database, and each user's home and workspaces.

use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

/// Creates `dir` (and its parents) with mode `0700` for what it creates; tightens an existing
/// directory that others can read.
pub fn private_dir(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let mode = std::fs::metadata(dir)?.permissions().mode();
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Makes an existing file that the group or others can access mode `0600`, with a warning; a
/// missing file is fine.
pub fn private_file(path: &Path) -> io::Result<()> {
    let mode = match std::fs::metadata(path) {
        Ok(m) => m.permissions().mode(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if mode & 0o077 != 0 {
        tracing::warn!(
            file = %path.display(),
            mode = format!("{:o}", mode & 0o777),
            "file was readable by other users; changing its mode to 0600"
        );
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loose_files_and_directories_are_tightened() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path().join("a/b");
        private_dir(&d).expect("create");
        assert_eq!(std::fs::metadata(&d).expect("meta").permissions().mode() & 0o777, 0o700);
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        private_dir(&d).expect("tighten");
        assert_eq!(std::fs::metadata(&d).expect("meta").permissions().mode() & 0o777, 0o700);
        let f = d.join("f");
        private_file(&f).expect("a missing file is fine");
        std::fs::write(&f, "x").expect("write");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        private_file(&f).expect("tighten");
        assert_eq!(std::fs::metadata(&f).expect("meta").permissions().mode() & 0o777, 0o600);
    }
}
