//! Signing a user in to an agent with one of the agent's `authMethods` (the contract's "Signing
//! agents in"): [`terminal`] runs a `terminal` method's login program for one user, in that
//! user's sandbox, in a pseudo-terminal. [`Running`] keeps it to one at a time per user and agent.
//!
//! The WebSocket that carries the terminal to the browser is `http::signin`'s.

pub mod terminal;

use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::Arc;

use crate::store::{SealedRows, StoredLogin, now_micros};

/// Records that `user` completed a sign-in to `agent` with `method_id` (what `/api/agents` shows
/// them). A store that cannot record it is logged, not fatal: the credentials are in their `HOME`.
pub async fn remember(store: &SealedRows, user: &str, agent: &str, method_id: &str) {
    let login = StoredLogin {
        agent: agent.to_string(),
        method_id: method_id.to_string(),
        signed_in_at: now_micros(),
    };
    if let Err(e) = store.put_login(user, &login).await {
        tracing::error!(user = %user, agent = %agent, error = %e, "cannot record the user's agent sign-in");
    }
}

/// The (user, agent) pairs with a sign-in under way.
#[derive(Debug, Default)]
pub struct Running {
    /// Held pairs; an entry lives as long as its [`Held`].
    held: Mutex<HashSet<(String, String)>>,
}

/// One sign-in's place in [`Running`], given back when dropped (on every path out).
#[derive(Debug)]
pub struct Held {
    /// Where it is held.
    running: Arc<Running>,
    /// The user and the agent.
    key: (String, String),
}

impl Running {
    /// Holds (user, agent), or `None` when a sign-in of that user to that agent is under way.
    pub fn try_hold(self: &Arc<Self>, user: &str, agent: &str) -> Option<Held> {
        let key = (user.to_string(), agent.to_string());
        let fresh = self.held.lock().insert(key.clone());
        fresh.then(|| Held {
            running: self.clone(),
            key,
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.running.held.lock().remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_at_a_time_per_user_and_agent() {
        let running = Arc::new(Running::default());
        let first = running.try_hold("alice", "claude").expect("free");
        assert!(running.try_hold("alice", "claude").is_none());
        assert!(running.try_hold("bob", "claude").is_some(), "another user");
        assert!(running.try_hold("alice", "other").is_some(), "another agent");
        drop(first);
        assert!(running.try_hold("alice", "claude").is_some(), "given back on drop");
    }
}
