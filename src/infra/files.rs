//! Files and directories only the gateway's OS user may read: the data directory, the generated
//! secret, the SQLite database, and each user's home and workspaces.
//!
//! The gateway makes private only what it creates. A directory that already exists (`/`, `/tmp`,
//! an operator's `/srv/repos`) belongs to someone else and is left exactly as it is: its mode,
//! owner and contents are never changed here.

use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

/// Creates `dir` and every missing parent with mode `0700`. Directories that already exist are
/// left as they are. The error names the directory and what was being done.
pub fn private_dir(dir: &Path) -> io::Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => return Ok(()),
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a directory", dir.display()),
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(named(e, "cannot look up", dir)),
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| named(e, "cannot create directory", dir))
}

/// Whether others than the owner can reach into `dir` (for a warning about a data directory the
/// operator created open).
pub fn is_open_to_others(dir: &Path) -> bool {
    std::fs::metadata(dir).is_ok_and(|m| m.permissions().mode() & 0o077 != 0)
}

/// Makes an existing file that the group or others can access mode `0600`, with a warning; a
/// missing file is fine. Only for the gateway's own files (its secret, its SQLite database).
pub fn private_file(path: &Path) -> io::Result<()> {
    let mode = match std::fs::metadata(path) {
        Ok(m) => m.permissions().mode(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(named(e, "cannot look up", path)),
    };
    if mode & 0o077 != 0 {
        tracing::warn!(
            file = %path.display(),
            mode = format!("{:o}", mode & 0o777),
            "file was readable by other users; changing its mode to 0600"
        );
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| named(e, "cannot chmod 0600", path))?;
    }
    Ok(())
}

/// Writes `contents` to a new file `path` of mode `0600` (never over an existing one), synced:
/// the gateway's generated secrets.
pub fn write_new_private(path: &Path, contents: &[u8]) -> io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(contents)?;
    file.sync_all()
}

/// `e` with the operation and the path in its message (the kind kept): "Operation not permitted"
/// alone does not tell an operator what to fix.
pub fn named(e: io::Error, operation: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{operation} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_private_directories_and_leaves_existing_ones_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path().join("a/b");
        private_dir(&d).expect("create");
        for created in [dir.path().join("a"), d.clone()] {
            assert_eq!(
                std::fs::metadata(&created).expect("meta").permissions().mode() & 0o777,
                0o700
            );
        }
        // One the gateway did not create keeps its mode.
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        private_dir(&d).expect("existing");
        assert_eq!(std::fs::metadata(&d).expect("meta").permissions().mode() & 0o777, 0o755);
        assert!(is_open_to_others(&d));
        let f = d.join("f");
        private_file(&f).expect("a missing file is fine");
        std::fs::write(&f, "x").expect("write");
        let err = private_dir(&f).expect_err("a file is not a directory");
        assert!(err.to_string().contains(&f.display().to_string()), "{err}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        private_file(&f).expect("tighten");
        assert_eq!(std::fs::metadata(&f).expect("meta").permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn errors_name_the_path_and_the_operation() {
        let err = private_dir(Path::new("/proc/acp-gateway-cannot-be-here/x")).expect_err("cannot create");
        let text = err.to_string();
        assert!(
            text.contains("cannot create directory /proc/acp-gateway-cannot-be-here/x"),
            "{text}"
        );
    }
}
