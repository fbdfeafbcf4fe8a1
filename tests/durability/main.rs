//! Issue 8: a client that stops reading slows nobody else, and a SIGKILLed gateway loses nothing a
//! client saw (the contract's "Limits and faults" and "Durability").
//!
//! Every test here takes [`SERIAL`]: the stall tests measure latencies (on 2 cores a concurrent
//! 50,000-update stream would be what they measure), and the metric they watch is per process.
//!
//! Figures are printed; see them with `cargo test --test durability -- --nocapture`.
//! `DURABILITY_SEED=N` replays the kill points of an earlier run.

// Tests and benchmarks spawn freely: their runtime ends with them.
#![allow(clippy::disallowed_methods)]

mod agent_children;
#[path = "../common/mod.rs"]
mod common;
mod sigkill;
mod stuck_tab;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use acp_gateway::infra::config::DEFAULT_AGENT;
use common::procfs::{self, TcpSocket};
use common::serve_process::{ServeProcess, marked_gateway_bin};
use common::{Client, Db, TestGateway, WAIT, seq, wait_until};
use serde_json::{Value, json};

/// One test at a time in this binary (see the module docs).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// The JWT secret of the gateway processes.
const SECRET: &str = "durability-secret-0123456789-0123456789";

/// Kills (by pid) processes this test started that should not be there any more.
fn kill_leftovers(pids: &[u32]) {
    for pid in pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}
