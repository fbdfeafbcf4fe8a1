//! What a pool holds, counted: its live processes, their states, owners and pids (for metrics,
//! the admin routes, operators' tooling and tests).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::AgentPool;

/// How many of a pool's processes are in each state, and the sessions they carry (for metrics).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ProcessStates {
    /// Started, `initialize` not answered yet.
    pub starting: usize,
    /// Carrying no session and waiting for no answer.
    pub idle: usize,
    /// Carrying a session or waiting for an answer.
    pub busy: usize,
    /// Sessions bound to its live processes.
    pub sessions: usize,
}

impl AgentPool {
    /// Live processes (for tests and metrics).
    pub fn process_count(&self) -> usize {
        self.procs.lock().iter().filter(|p| !p.is_dead()).count()
    }

    /// How many processes are in each state (for metrics, at each scrape).
    pub fn process_states(&self) -> ProcessStates {
        let mut states = ProcessStates {
            starting: self.starting.load(Ordering::Relaxed),
            ..ProcessStates::default()
        };
        for p in self.procs.lock().iter() {
            if p.is_dead() {
                continue;
            }
            let sessions = p.session_count();
            states.sessions += sessions;
            if sessions > 0 || p.is_waiting() {
                states.busy += 1;
            } else {
                states.idle += 1;
            }
        }
        states
    }

    /// Live processes per owning user (shared and warm ones are nobody's).
    pub fn owners(&self) -> Vec<Arc<str>> {
        self.procs
            .lock()
            .iter()
            .filter(|p| !p.is_dead())
            .filter_map(|p| p.owner())
            .collect()
    }

    /// OS process ids of the live processes (for operators' tooling and tests).
    pub fn pids(&self) -> Vec<u32> {
        self.procs
            .lock()
            .iter()
            .filter(|p| !p.is_dead())
            .map(|p| p.pid)
            .collect()
    }
}
