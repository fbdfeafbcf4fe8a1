//! The sessions this gateway process has in memory, by id; dormant ones are swept (they are
//! loaded again from the store when next used).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

use super::LiveSession;

/// The sessions this gateway process has in memory.
#[derive(Debug, Default)]
pub struct Registry {
    /// By gateway session id.
    map: Mutex<HashMap<Arc<str>, Arc<LiveSession>>>,
}

impl Registry {
    /// The session with `id`, if in memory (ownership is the caller's to check).
    pub fn get(&self, id: &str) -> Option<Arc<LiveSession>> {
        self.map.lock().get(id).cloned()
    }

    /// Adds `session`, or returns the one already there under its id.
    pub fn insert(&self, session: Arc<LiveSession>) -> Arc<LiveSession> {
        self.map.lock().entry(session.id.clone()).or_insert(session).clone()
    }

    /// Forgets a session.
    pub fn remove(&self, id: &str) -> Option<Arc<LiveSession>> {
        self.map.lock().remove(id)
    }

    /// Drops sessions nobody uses (they are reloaded from the store when needed).
    pub fn sweep(&self) {
        self.map.lock().retain(|_, s| !s.is_dormant());
    }

    /// Sessions of `user` on a live agent process right now.
    pub fn live_of(&self, user: &str) -> usize {
        self.map
            .lock()
            .values()
            .filter(|s| &*s.owner == user && s.is_bound_now())
            .count()
    }

    /// Every session in memory.
    pub fn all(&self) -> Vec<Arc<LiveSession>> {
        self.map.lock().values().cloned().collect()
    }

    /// Sessions in memory.
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }
}
