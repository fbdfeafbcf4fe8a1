//! What a user's sign-in changes about their agent processes: the keys they signed in with,
//! added to the environment (handed to the pool from above through the small [`UserEnv`] trait,
//! so the pool needs no store), and recycling, so that new credentials take effect.

use async_trait::async_trait;
use secrecy::SecretString;

/// Variables no user value may set: the gateway sets them itself (the contract's "Tenancy"), or
/// they change what the agent's programs load and run.
pub const RESERVED: [&str; 9] = [
    "PATH", "HOME", "USER", "TMPDIR", "LANG", "LC_ALL", "TERM", "TZ", "SHELL",
];

/// Whether a user may set `name`: an environment variable's usual spelling (`[A-Z_][A-Z0-9_]*`,
/// at most 128 bytes), not reserved, not one of the dynamic loader's.
pub fn user_may_set(name: &str) -> bool {
    let mut chars = name.chars();
    let first = chars.next();
    first.is_some_and(|c| c.is_ascii_uppercase() || c == '_')
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        && name.len() <= 128
        && !RESERVED.contains(&name)
        && !name.starts_with("LD_")
        && !name.starts_with("ACP_GATEWAY_")
        && name != "DATABASE_URL"
}

/// A user's own additions to an agent's environment.
#[async_trait]
pub trait UserEnv: Send + Sync + std::fmt::Debug {
    /// `user`'s variables for `agent`; an error says what the user should do (it reaches them).
    async fn env(&self, user: &str, agent: &str) -> Result<Vec<(String, SecretString)>, String>;
}

impl super::AgentPool {
    /// Stops `user`'s processes of this agent so that new credentials take effect (their
    /// sessions are restored on a new process at their next request). How many were stopped.
    pub fn recycle_user(&self, user: &str) -> usize {
        let procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
        let mine: Vec<_> = procs
            .iter()
            .filter(|p| !p.is_dead() && p.owner().as_deref() == Some(user))
            .collect();
        for p in &mine {
            tracing::info!(agent = %self.name, process = p.id, user = %user, "recycling the user's agent process");
            p.stop();
        }
        mine.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_unreserved_names_may_be_set() {
        for ok in ["OPENAI_API_KEY", "CODEX_API_KEY", "_X", "A1"] {
            assert!(user_may_set(ok), "{ok}");
        }
        for bad in [
            "",
            "PATH",
            "HOME",
            "LD_PRELOAD",
            "ACP_GATEWAY_JWT_SECRET",
            "DATABASE_URL",
            "a",
            "1A",
            "A-B",
            "A=B",
        ] {
            assert!(!user_may_set(bad), "{bad}");
        }
    }
}
