//! What a user adds to their own agent processes' environment (the keys they signed in with),
//! handed to the pool from above through this small trait so the pool needs no store.

use std::sync::Arc;

use async_trait::async_trait;
use secrecy::SecretString;

use crate::protocol::RpcError;

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
    /// What `user`'s own process of this agent said in `initialize` (started for them when they
    /// have none): what a sign-in runs must come from the user's own agent, never from a process
    /// of another user, whose answer that user may have shaped.
    pub async fn own_info(&self, user: &Arc<str>) -> Result<Arc<super::AgentInfo>, RpcError> {
        let mine = || {
            let procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
            procs
                .iter()
                .filter(|p| !p.is_dead() && p.owner().as_deref() == Some(&**user))
                .find_map(|p| p.info.get().cloned())
        };
        if let Some(info) = mine() {
            return Ok(info);
        }
        let _gate = self.spawn_gate.lock().await;
        if let Some(info) = mine() {
            return Ok(info);
        }
        let p = self.spawn_locked(Some(user)).await?;
        p.info
            .get()
            .cloned()
            .ok_or_else(|| RpcError::internal("agent did not initialize"))
    }

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
