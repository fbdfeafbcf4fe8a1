//! The rule for a path a client names (a session's `cwd`, an additional directory, a file the
//! workspace API serves): absolute, of a length the kernel would take, and resolved inside one of
//! the user's roots and in sight of their agents. Every refusal names the roots, and a path
//! outside them reads the same as a hidden one.

use std::io;
use std::path::{Path, PathBuf};

use super::paths::resolve_existing;
use super::sight::Sight;

/// Longest path a client may name, in bytes (Linux's `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;
/// Most components a client's path may have.
pub const MAX_PATH_DEPTH: usize = 256;

/// Why a client's path was refused; each message ends with the roots allowed.
#[derive(Debug, thiserror::Error)]
pub enum PathRefused {
    /// The user's workspace roots could not be made or entered.
    #[error("your workspace roots are not available: {0}")]
    NoRoots(#[source] io::Error),
    /// Longer or deeper than any path the kernel would take.
    #[error("the path is longer than {MAX_PATH_BYTES} bytes or {MAX_PATH_DEPTH} components{}", allowed(.roots))]
    TooLong {
        /// The roots allowed.
        roots: Vec<PathBuf>,
    },
    /// Relative.
    #[error("{path:?} is not an absolute path{}", allowed(.roots))]
    NotAbsolute {
        /// As the client wrote it.
        path: String,
        /// The roots allowed.
        roots: Vec<PathBuf>,
    },
    /// It could not be resolved (a link that loops, a file in the middle, no permission).
    #[error("cannot resolve {path:?}: {source}{}", allowed(.roots))]
    Unresolvable {
        /// As the client wrote it.
        path: String,
        /// What resolving it met.
        #[source]
        source: io::Error,
        /// The roots allowed.
        roots: Vec<PathBuf>,
    },
    /// Outside every root, or hidden from the user's agents.
    #[error("{path:?} is outside your workspace roots{}", allowed(.roots))]
    Outside {
        /// As the client wrote it.
        path: String,
        /// The roots allowed.
        roots: Vec<PathBuf>,
    },
}

/// `; allowed roots: a, b` (empty when there are no roots to name: a length check alone).
fn allowed(roots: &[PathBuf]) -> String {
    if roots.is_empty() {
        return String::new();
    }
    let names: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
    format!("; allowed roots: {}", names.join(", "))
}

/// Refuses a path longer or deeper than any the kernel would take: resolving it costs the
/// gateway work for each component, and nothing real is that long.
pub fn check_length(path: &str) -> Result<(), PathRefused> {
    if path.len() > MAX_PATH_BYTES || Path::new(path).components().nth(MAX_PATH_DEPTH).is_some() {
        return Err(PathRefused::TooLong { roots: Vec::new() });
    }
    Ok(())
}

/// `path` resolved (`.`, `..`, symlinks) if it is absolute, inside one of `roots` and in `sight`;
/// else why not, naming the roots (the same for a path outside them and a hidden one): the rule
/// of [`super::Tenancy::resolve`], for a caller that holds the user's roots and sight already.
pub fn resolve_within(roots: &[PathBuf], sight: &Sight, path: &str) -> Result<PathBuf, PathRefused> {
    let roots_named = || roots.to_vec();
    if check_length(path).is_err() {
        return Err(PathRefused::TooLong { roots: roots_named() });
    }
    let requested = Path::new(path);
    if !requested.is_absolute() {
        return Err(PathRefused::NotAbsolute {
            path: path.to_string(),
            roots: roots_named(),
        });
    }
    let resolved = resolve_existing(requested).map_err(|source| PathRefused::Unresolvable {
        path: path.to_string(),
        source,
        roots: roots_named(),
    })?;
    if roots.iter().any(|r| resolved.starts_with(r)) && sight.sees(&resolved) {
        Ok(resolved)
    } else {
        Err(PathRefused::Outside {
            path: path.to_string(),
            roots: roots_named(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_the_path_and_the_roots() {
        let roots = vec![PathBuf::from("/srv/w/alice"), PathBuf::from("/srv/shared")];
        let e = PathRefused::Outside {
            path: "/etc".into(),
            roots: roots.clone(),
        };
        assert_eq!(
            e.to_string(),
            "\"/etc\" is outside your workspace roots; allowed roots: /srv/w/alice, /srv/shared"
        );
        let e = PathRefused::NotAbsolute {
            path: "w".into(),
            roots,
        };
        assert_eq!(
            e.to_string(),
            "\"w\" is not an absolute path; allowed roots: /srv/w/alice, /srv/shared"
        );
        let long = "/a".repeat(MAX_PATH_DEPTH + 1);
        assert_eq!(
            check_length(&long).expect_err("too deep").to_string(),
            "the path is longer than 4096 bytes or 256 components"
        );
    }
}
