//! The integration tests, one binary: a real gateway on port 0 with a real database and real
//! agent processes, driven by real clients (`common`). One binary links the crate once and shares
//! one throwaway Postgres server between every test, where forty binaries linked it forty times and
//! started a server each.
//!
//! Four suites stay binaries of their own because they read what belongs to the whole test
//! process, which other tests running beside them would change: `tests/durability` (this
//! process's file descriptors and children), `tests/catch_up.rs` (the process-wide count of
//! slow clients dropped must stay still), `tests/metrics.rs` (every series of the process-wide
//! recorder at zero before the load) and `tests/traces.rs` (the process-wide trace switch).

// Tests and benchmarks spawn freely: their runtime ends with them.
#![allow(clippy::disallowed_methods)]

#[path = "../common/mod.rs"]
mod common;

mod admin;
mod agent_keys;
mod agent_signin;
mod attachments;
mod cli;
mod controls;
mod db_faults;
mod device;
mod drain;
mod editor;
mod elicitation;
mod export;
mod faults;
mod fork;
mod front_door;
mod gateway;
mod host_safety;
mod isolation;
mod layering;
mod lifecycle;
mod oidc;
mod push;
mod queue;
mod quotas;
mod replay;
mod replicas;
mod rls;
mod secrets_in_logs;
mod settle;
mod share_store;
mod sharing;
mod signin_terminal;
mod socket_limits;
mod store;
mod streamable;
mod tenancy;
mod timeouts;
mod usage;
mod user_mcp;
mod workspace_api;
