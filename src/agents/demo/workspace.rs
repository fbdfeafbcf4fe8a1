//! The showcase's one file, `acp-demo/hello.rs` under a session's cwd: read and written without
//! ever leaving that cwd.
//!
//! Links are followed only while they stay inside the cwd (resolved with `..` and every link);
//! the last step opens with `O_NOFOLLOW`, so a link planted there between the check and the
//! open fails instead of being followed. Every failure is a sentence for the tool call, never a
//! panic.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

/// The folder the showcase writes in, under the session's cwd.
pub(super) const DIR: &str = "acp-demo";
/// The file it edits, in [`DIR`].
pub(super) const FILE: &str = "hello.rs";
/// Largest file read back: anything bigger was not written by the showcase.
const MAX_READ: u64 = 64 << 10;

/// Why the showcase's file cannot be read or written: a sentence for the tool call, naming the
/// path and what failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum FileError {
    /// An operation on a path failed.
    #[error("cannot {what} {}: {source}", path.display())]
    Io {
        /// What was being done (`read`, `write`, `create`, `look at`, `follow`, `open the session's cwd`).
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// What failed.
        source: io::Error,
    },
    /// The session's cwd is relative.
    #[error("the session's cwd {} is not an absolute path", .0.display())]
    Relative(PathBuf),
    /// The file there is bigger than the showcase writes.
    #[error("{} is over {MAX_READ} bytes; leaving it alone", .0.display())]
    TooBig(PathBuf),
    /// The file there is not text.
    #[error("{} is not UTF-8 text; leaving it alone", .0.display())]
    NotText(PathBuf),
    /// Something that should be a folder is not.
    #[error("{} is not a folder", .0.display())]
    NotAFolder(PathBuf),
    /// Something that should be a file is not.
    #[error("{} is not a regular file", .0.display())]
    NotAFile(PathBuf),
    /// A link leads out of the cwd.
    #[error("{} leads outside the session's cwd (to {}); the demo agent does not follow it", .path.display(), .to.display())]
    Outside {
        /// The link.
        path: PathBuf,
        /// Where it leads.
        to: PathBuf,
    },
    /// The path has no folder to write in (the cwd is `/`).
    #[error("{} has no folder to write in", .0.display())]
    NoFolder(PathBuf),
    /// The session was made without a cwd.
    #[error("the session has no cwd")]
    NoCwd,
    /// The blocking task running the operation failed.
    #[error("file task failed: {0}")]
    Task(String),
}

impl FileError {
    fn io(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Self {
        let path = path.to_path_buf();
        move |source| Self::Io { what, path, source }
    }
}

/// The file's path as the client names it: `<cwd>/acp-demo/hello.rs`.
pub(super) fn display_path(cwd: &Path) -> PathBuf {
    cwd.join(DIR).join(FILE)
}

/// The file's text, `None` when it does not exist yet.
pub(super) fn read(cwd: &Path) -> Result<Option<String>, FileError> {
    let Some(path) = resolve(cwd, false)? else {
        return Ok(None);
    };
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(FileError::io("read", &path)(e)),
    };
    let mut bytes = Vec::new();
    file.take(MAX_READ + 1)
        .read_to_end(&mut bytes)
        .map_err(FileError::io("read", &path))?;
    if bytes.len() as u64 > MAX_READ {
        return Err(FileError::TooBig(path));
    }
    String::from_utf8(bytes).map(Some).map_err(|_| FileError::NotText(path))
}

/// Replaces the file's text with `text` (creating `acp-demo/` if missing): written to a
/// temporary file beside it, then renamed over it, so no reader sees half a file.
pub(super) fn write(cwd: &Path, text: &str) -> Result<(), FileError> {
    let path = resolve(cwd, true)?.ok_or_else(|| FileError::NoFolder(cwd.to_path_buf()))?;
    let dir = path.parent().ok_or_else(|| FileError::NoFolder(path.clone()))?;
    let tmp = dir.join(format!(".{FILE}.{}.tmp", uuid::Uuid::new_v4().simple()));
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&tmp)
        .and_then(|mut f: File| {
            f.write_all(text.as_bytes())?;
            f.sync_all()
        })
        .and_then(|()| std::fs::rename(&tmp, &path));
    written.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        FileError::io("write", &path)(e)
    })
}

/// Where the file really is, checked to be inside `cwd`; `None` when its folder does not
/// exist and `create` is false.
fn resolve(cwd: &Path, create: bool) -> Result<Option<PathBuf>, FileError> {
    if !cwd.is_absolute() {
        return Err(FileError::Relative(cwd.to_path_buf()));
    }
    let root = cwd
        .canonicalize()
        .map_err(FileError::io("open the session's cwd", cwd))?;
    let dir = root.join(DIR);
    match std::fs::symlink_metadata(&dir) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound && !create => return Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound => DirBuilder::new()
            .mode(0o755)
            .create(&dir)
            .map_err(FileError::io("create", &dir))?,
        Err(e) => return Err(FileError::io("look at", &dir)(e)),
    }
    let dir = inside(&root, &dir)?;
    if !dir.is_dir() {
        return Err(FileError::NotAFolder(dir));
    }
    let file = dir.join(FILE);
    match std::fs::symlink_metadata(&file) {
        Ok(meta) if meta.file_type().is_symlink() => inside(&root, &file).map(Some),
        Ok(meta) if !meta.is_file() => Err(FileError::NotAFile(file)),
        _ => Ok(Some(file)),
    }
}

/// `path` with every link resolved, if that stays under `root` (itself resolved).
fn inside(root: &Path, path: &Path) -> Result<PathBuf, FileError> {
    let real = path.canonicalize().map_err(FileError::io("follow", path))?;
    if real.starts_with(root) {
        Ok(real)
    } else {
        Err(FileError::Outside {
            path: path.to_path_buf(),
            to: real,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn writes_reads_and_replaces_under_the_cwd() {
        let cwd = tempfile::tempdir().unwrap();
        assert_eq!(read(cwd.path()).unwrap(), None);
        write(cwd.path(), "one\n").unwrap();
        assert_eq!(read(cwd.path()).unwrap().as_deref(), Some("one\n"));
        write(cwd.path(), "two\n").unwrap();
        let on_disk = std::fs::read_to_string(cwd.path().join("acp-demo/hello.rs")).unwrap();
        assert_eq!(on_disk, "two\n");
        let names: Vec<_> = std::fs::read_dir(cwd.path().join(DIR)).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file left behind");
    }

    #[test]
    fn refuses_links_that_leave_the_cwd() {
        let cwd = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), cwd.path().join(DIR)).unwrap();
        let err = write(cwd.path(), "x").unwrap_err();
        assert!(err.to_string().contains("leads outside"), "{err}");
        assert!(read(cwd.path()).unwrap_err().to_string().contains("leads outside"));
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);

        let cwd = tempfile::tempdir().unwrap();
        std::fs::create_dir(cwd.path().join(DIR)).unwrap();
        let secret = outside.path().join("secret");
        std::fs::write(&secret, "keep").unwrap();
        std::os::unix::fs::symlink(&secret, cwd.path().join(DIR).join(FILE)).unwrap();
        assert!(
            write(cwd.path(), "x")
                .unwrap_err()
                .to_string()
                .contains("leads outside")
        );
        assert!(read(cwd.path()).unwrap_err().to_string().contains("leads outside"));
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), "keep");
    }

    #[test]
    fn follows_links_that_stay_inside() {
        let cwd = tempfile::tempdir().unwrap();
        std::fs::create_dir(cwd.path().join("real")).unwrap();
        std::os::unix::fs::symlink(cwd.path().join("real"), cwd.path().join(DIR)).unwrap();
        write(cwd.path(), "in\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(cwd.path().join("real").join(FILE)).unwrap(),
            "in\n"
        );
    }

    #[test]
    fn says_why_it_cannot_write() {
        assert!(
            write(Path::new("relative"), "x")
                .unwrap_err()
                .to_string()
                .contains("not an absolute path")
        );
        let cwd = tempfile::tempdir().unwrap();
        let gone = cwd.path().join("gone");
        assert!(
            write(&gone, "x")
                .unwrap_err()
                .to_string()
                .contains("cannot open the session's cwd")
        );
        std::fs::write(cwd.path().join(DIR), "a file, not a folder").unwrap();
        assert!(
            write(cwd.path(), "x")
                .unwrap_err()
                .to_string()
                .contains("is not a folder")
        );
    }
}
