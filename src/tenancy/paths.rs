//! Users' names and paths: the filesystem-safe user, the templates' `{user}`, and paths resolved
//! the way the kernel would resolve them.

use std::fmt::Write as _;
use std::io;
use std::path::{Component, Path, PathBuf};

use super::SHARED_HOME;

/// A JWT `sub` made filesystem-safe: every byte outside `[A-Za-z0-9_-]` becomes `%XX`
/// (upper-case hex). One-to-one, and never `.`, `..` or a path with `/`.
pub fn escape_user(sub: &str) -> String {
    let mut out = String::with_capacity(sub.len());
    for b in sub.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// `template` with `{user}` filled in.
pub(super) fn fill(template: &str, user: &str) -> PathBuf {
    PathBuf::from(template.replace("{user}", user))
}

/// The escaped user, refused when it would be the shared home's name.
pub(super) fn checked_user(user: &str) -> io::Result<String> {
    let escaped = escape_user(user);
    if escaped.is_empty() || escaped == SHARED_HOME {
        return Err(io::Error::other(format!("the user name {user:?} is reserved")));
    }
    Ok(escaped)
}

/// The directory above the first path component that holds `{user}`: where every user's
/// directories of that kind live. `None` when the template has no `{user}`.
pub(super) fn user_base(template: &str) -> Option<PathBuf> {
    let path = Path::new(template);
    let mut base = PathBuf::new();
    for part in path.components() {
        if part.as_os_str().to_string_lossy().contains("{user}") {
            return Some(base);
        }
        base.push(part);
    }
    None
}

/// `path` with `.` and `..` folded and the longest existing prefix resolved through symlinks. A
/// relative path is taken from the current directory (the default SQLite URL,
/// `sqlite://data/acp-gateway.db`, is one), never from `/`.
pub(super) fn resolve_existing(path: &Path) -> io::Result<PathBuf> {
    let absolute;
    let path = if path.is_relative() {
        absolute = std::env::current_dir()?.join(path);
        absolute.as_path()
    } else {
        path
    };
    // Walk component by component, resolving symlinks as they are met, so that `link/..`
    // means what the kernel would make of it.
    let mut resolved = PathBuf::from("/");
    let mut rest: Vec<Component<'_>> = path.components().collect();
    rest.reverse();
    let mut missing = false;
    while let Some(part) = rest.pop() {
        match part {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            // The kernel refuses `missing/..` (ENOENT). Folding it by text instead would make
            // `root/nope/../link/x` the unresolved `root/link/x` when `link` leads out of the root.
            Component::ParentDir if missing => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "`..` after a directory that does not exist",
                ));
            }
            Component::ParentDir => {
                resolved.pop();
            }
            Component::Normal(name) => {
                resolved.push(name);
                if missing {
                    continue;
                }
                match std::fs::canonicalize(&resolved) {
                    Ok(real) => resolved = real,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        // A dangling symlink must not be taken as a plain name.
                        if std::fs::symlink_metadata(&resolved).is_ok() {
                            return Err(io::Error::other("a symlink points nowhere"));
                        }
                        missing = true;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(resolved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_users_one_to_one() {
        assert_eq!(escape_user("alice_B-9"), "alice_B-9");
        assert_eq!(escape_user("a.b@c/d"), "a%2Eb%40c%2Fd");
        assert_eq!(escape_user(".."), "%2E%2E");
        assert_eq!(escape_user("é"), "%C3%A9");
        assert_ne!(
            escape_user("a%2E"),
            escape_user("a."),
            "the escape character is escaped too"
        );
    }

    #[test]
    fn finds_the_directory_of_every_user() {
        assert_eq!(user_base("/d/homes/{user}"), Some(PathBuf::from("/d/homes")));
        assert_eq!(user_base("/w/{user}/code"), Some(PathBuf::from("/w")));
        assert_eq!(user_base("/srv/x"), None);
    }

    #[test]
    fn a_relative_path_is_taken_from_the_current_directory() {
        let cwd = std::env::current_dir().expect("cwd").canonicalize().expect("canon");
        let resolved = resolve_existing(Path::new("no-such-dir-here/acp-gateway.db")).expect("ok");
        assert_eq!(resolved, cwd.join("no-such-dir-here/acp-gateway.db"));
    }

    #[test]
    fn resolves_dot_dot_and_symlinks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canon");
        std::fs::create_dir(root.join("a")).expect("mkdir");
        std::os::unix::fs::symlink("/etc", root.join("a/out")).expect("symlink");
        assert_eq!(
            resolve_existing(&root.join("a/../a/./b")).expect("ok"),
            root.join("a/b")
        );
        assert_eq!(
            resolve_existing(&root.join("a/out/x")).expect("ok"),
            PathBuf::from("/etc/x")
        );
        assert_eq!(
            resolve_existing(&root.join("a/out/..")).expect("ok"),
            PathBuf::from("/")
        );
        std::os::unix::fs::symlink(root.join("nowhere"), root.join("a/dangling")).expect("symlink");
        assert!(resolve_existing(&root.join("a/dangling/x")).is_err());
        // Past a missing directory `..` cannot be folded by text: `a/out` leads to /etc.
        assert!(resolve_existing(&root.join("nope/../a/out/passwd")).is_err());
        assert!(resolve_existing(&root.join("a/nope/x/../../out")).is_err());
        assert_eq!(
            resolve_existing(&root.join("a/nope/new")).expect("ok"),
            root.join("a/nope/new")
        );
    }
}
