//! What a user's sign-in changes about their agent processes: the keys they signed in with,
//! added to the environment (handed to the pool from above through the small [`UserEnv`] trait,
//! so the pool needs no store), and recycling, so that new credentials take effect.

use async_trait::async_trait;
use secrecy::SecretString;

pub use crate::tenancy::user_may_set;

/// A user's own additions to an agent's environment.
#[async_trait]
pub trait UserEnv: Send + Sync + std::fmt::Debug {
    /// `user`'s variables for `agent`; an error says what the user should do (it reaches them).
    async fn env(&self, user: &str, agent: &str) -> Result<Vec<(String, SecretString)>, UserEnvError>;
}

/// Why a user's variables for an agent cannot be had; the message is for the user.
#[derive(Debug, thiserror::Error)]
pub enum UserEnvError {
    /// They could not be read (the detail is logged where it happened).
    #[error("your keys for this agent cannot be read now; try again later")]
    Unreadable,
    /// One of them does not open.
    #[error("your key {name} for agent {agent} cannot be used: {source}")]
    Unusable {
        /// The variable.
        name: String,
        /// The agent.
        agent: String,
        /// Why it does not open.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl super::AgentPool {
    /// Stops `user`'s processes of this agent so that new credentials take effect (their
    /// sessions are restored on a new process at their next request). How many were stopped.
    pub fn recycle_user(&self, user: &str) -> usize {
        let procs = self.procs.lock();
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
