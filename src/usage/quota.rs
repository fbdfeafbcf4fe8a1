//! Per-user caps: what one user may hold of the gateway at once, so that one user at a cap never
//! slows another. Each refusal names the cap and its limit.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::Hash;
use std::num::NonZeroU32;
use std::sync::Arc;

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use crate::agents::pool::{ProcessCaps, ProcessSlot};
use crate::infra::config::Limits;
use crate::protocol::RpcError;

/// JSON-RPC code for a per-user cap (in the implementation-defined `-32000` range).
pub use crate::protocol::codes::CAP_REACHED;

pub use crate::infra::cap::CapReached;

/// The per-user counters.
#[derive(Debug)]
pub struct Quotas {
    /// Open WebSocket connections per user.
    connections: Arc<Counted<Arc<str>>>,
    /// Live agent processes per user (processes of agents shared between users are nobody's).
    agent_processes: Arc<Counted<Arc<str>>>,
    /// Requests per second per user (GCRA, with a burst).
    requests: DefaultKeyedRateLimiter<Arc<str>>,
    /// `limits.requests_per_second_per_user`, for messages.
    rate: u32,
    /// `limits.max_live_sessions_per_user`.
    max_live_sessions: usize,
}

/// Something each key (a user, a client address) may hold a limited number of at once.
#[derive(Debug)]
pub(crate) struct Counted<K: Hash + Eq> {
    /// How many each key may hold.
    max: usize,
    /// How many each key holds (keys holding none are not in the map).
    held: Mutex<HashMap<K, usize>>,
}

impl<K: Hash + Eq + Clone> Counted<K> {
    /// A counter allowing `max` per key.
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// One of `key`'s slots, or `None` when it holds `max` already.
    pub(crate) fn take(self: &Arc<Self>, key: &K) -> Option<Slot<K>> {
        let mut held = self.held.lock();
        let n = held.entry(key.clone()).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(Slot {
            of: self.clone(),
            key: key.clone(),
        })
    }
}

/// One of a key's slots (a user's connection or agent process, an address's connection); given
/// back when dropped.
#[derive(Debug)]
pub struct Slot<K: Hash + Eq = Arc<str>> {
    of: Arc<Counted<K>>,
    key: K,
}

impl<K: Hash + Eq> Slot<K> {
    /// Whose slot it is.
    pub fn key(&self) -> &K {
        &self.key
    }
}

impl<K: Hash + Eq> Drop for Slot<K> {
    fn drop(&mut self) {
        let mut held = self.of.held.lock();
        if let Some(n) = held.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
}

impl Quotas {
    /// Counters for `limits`.
    pub fn new(limits: &Limits) -> Arc<Self> {
        let rate = NonZeroU32::new(limits.requests_per_second_per_user.max(1)).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(limits.request_burst_per_user.max(1)).unwrap_or(NonZeroU32::MIN);
        Arc::new(Self {
            connections: Counted::new(limits.max_connections_per_user),
            agent_processes: Counted::new(limits.max_agent_processes_per_user),
            requests: RateLimiter::keyed(Quota::per_second(rate).allow_burst(burst)),
            rate: rate.get(),
            max_live_sessions: limits.max_live_sessions_per_user,
        })
    }

    /// Takes one of `user`'s connection slots.
    pub fn connect(&self, user: &str) -> Result<Slot, CapReached> {
        let counted = &self.connections;
        counted
            .take(&Arc::from(user))
            .ok_or_else(|| CapReached::new("connections", counted.max as u64))
    }

    /// Takes one of `user`'s agent process slots, held while the process runs.
    pub fn agent_process(&self, user: &Arc<str>) -> Result<Slot, CapReached> {
        let counted = &self.agent_processes;
        counted
            .take(user)
            .ok_or_else(|| CapReached::new("agent_processes", counted.max as u64))
    }

    /// Counts one request of `user` against the rate.
    pub fn request(&self, user: &Arc<str>) -> Result<(), CapReached> {
        self.requests
            .check_key(user)
            .map_err(|_| CapReached::new("requests_per_second", u64::from(self.rate)))
    }

    /// Checks that `user` may put one more session on an agent process (`live` are on one now).
    pub fn live_session(&self, live: usize) -> Result<(), CapReached> {
        if live >= self.max_live_sessions {
            return Err(CapReached::new("live_sessions", self.max_live_sessions as u64));
        }
        Ok(())
    }

    /// Forgets rate state of users who have been quiet (keeps memory flat).
    pub fn sweep(&self) {
        self.requests.retain_recent();
        self.requests.shrink_to_fit();
    }
}

impl ProcessCaps for Quotas {
    fn agent_process(&self, user: &Arc<str>) -> Result<ProcessSlot, RpcError> {
        let slot = Quotas::agent_process(self, user).map_err(|cap| cap.rpc())?;
        Ok(ProcessSlot::new(user.clone(), slot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_slots_are_counted_per_user_and_given_back() {
        let limits = Limits {
            max_connections_per_user: 2,
            ..Limits::default()
        };
        let q = Quotas::new(&limits);
        let a1 = q.connect("alice").expect("first");
        let _a2 = q.connect("alice").expect("second");
        assert_eq!(q.connect("alice").err().map(|e| e.cap), Some("connections"));
        let _b = q.connect("bob").expect("bob is not alice");
        drop(a1);
        assert!(q.connect("alice").is_ok(), "a slot comes back when its connection ends");
    }

    #[test]
    fn agent_processes_are_counted_per_user_apart_from_connections() {
        let limits = Limits {
            max_agent_processes_per_user: 1,
            max_connections_per_user: 1,
            ..Limits::default()
        };
        let q = Quotas::new(&limits);
        let alice: Arc<str> = Arc::from("alice");
        let _c = q.connect("alice").expect("a connection");
        let p = q.agent_process(&alice).expect("a process");
        assert_eq!(p.key(), &alice);
        let err = q.agent_process(&alice).expect_err("one is the cap");
        assert_eq!((err.cap, err.limit), ("agent_processes", 1));
        assert!(q.agent_process(&Arc::from("bob")).is_ok());
        drop(p);
        assert!(q.agent_process(&alice).is_ok());
    }

    #[test]
    fn requests_are_rate_limited_per_user() {
        let limits = Limits {
            requests_per_second_per_user: 1,
            request_burst_per_user: 3,
            ..Limits::default()
        };
        let q = Quotas::new(&limits);
        let alice: Arc<str> = Arc::from("alice");
        let bob: Arc<str> = Arc::from("bob");
        for _ in 0..3 {
            assert!(q.request(&alice).is_ok());
        }
        let err = q.request(&alice).expect_err("over the burst");
        assert_eq!(err.rpc().code, CAP_REACHED);
        assert!(err.message().contains("requests_per_second"), "{}", err.message());
        assert!(q.request(&bob).is_ok(), "one user at a cap never slows another");
    }
}
