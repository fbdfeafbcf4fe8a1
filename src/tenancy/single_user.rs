//! The one user that agents without the sandbox they asked for serve (`sandbox = "auto"` where
//! bubblewrap does not work): such an agent can read everything the gateway's OS user can (its
//! secrets, its database, every home), so only one person may ever use it. The first user to
//! need one is remembered in the data directory (`single-user`), so that a restart does not hand
//! the host to someone else; an operator who means several users removes the file after setting
//! `sandbox = "none"` or installing bubblewrap.

use parking_lot::Mutex;
use std::path::{Path, PathBuf};

/// The file in the data directory that names the one user.
const FILE: &str = "single-user";

/// The one user, once known.
#[derive(Debug)]
pub(super) struct SingleUser {
    /// Where the user is remembered.
    file: PathBuf,
    /// The user, once known (read from the file at start).
    user: Mutex<Option<String>>,
}

impl SingleUser {
    /// The one user remembered in `data_dir`, if any.
    pub(super) fn new(data_dir: &Path) -> Self {
        let file = data_dir.join(FILE);
        let user = std::fs::read_to_string(&file)
            .ok()
            .map(|s| s.trim_end_matches('\n').to_string())
            .filter(|s| !s.is_empty());
        Self {
            file,
            user: Mutex::new(user),
        }
    }

    /// The one user, if known.
    #[cfg(test)]
    fn current(&self) -> Option<String> {
        self.user.lock().clone()
    }

    /// `Ok` when `user` is the one user (becoming it if there is none yet); else who is.
    pub(super) fn admit(&self, user: &str) -> Result<(), TheOneUser> {
        let mut current = self.user.lock();
        match current.as_deref() {
            Some(one) if one == user => Ok(()),
            Some(one) => Err(TheOneUser::Is(one.to_string())),
            None => {
                // Written before anyone is served: if it cannot be, nobody is.
                if let Err(e) = crate::infra::files::write_new_private(&self.file, format!("{user}\n").as_bytes()) {
                    let e = crate::infra::files::named(e, "cannot write", &self.file);
                    tracing::error!(error = %e, "cannot remember the one user of unsandboxed agents");
                    return Err(TheOneUser::Unwritten(e));
                }
                tracing::warn!(user = %user, file = %self.file.display(), "unsandboxed agents now serve this user only");
                *current = Some(user.to_string());
                Ok(())
            }
        }
    }
}

/// Who the one user is, when someone else asks.
#[derive(Debug, thiserror::Error)]
pub(super) enum TheOneUser {
    /// This user.
    #[error("{0:?}")]
    Is(String),
    /// Nobody can be, since the file remembering them cannot be written.
    #[error("nobody: {0}")]
    Unwritten(std::io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_user_is_the_only_one_and_is_remembered() {
        let dir = tempfile::tempdir().expect("tempdir");
        let one = SingleUser::new(dir.path());
        assert_eq!(one.current(), None);
        one.admit("alice").expect("the first");
        one.admit("alice").expect("again");
        assert_eq!(one.admit("bob").expect_err("another").to_string(), "\"alice\"");
        let again = SingleUser::new(dir.path());
        let refused = again.admit("bob").expect_err("after a restart too");
        assert!(matches!(&refused, TheOneUser::Is(one) if one == "alice"), "{refused}");
    }
}
