//! # acp-gateway
//!
//! A multi-user WebSocket gateway for Agent Client Protocol (ACP) agents. Browsers and remote ACP
//! clients connect to `/acp`; the gateway authenticates them (JWT), bridges them to pooled stdio
//! agent processes, and keeps every session and its full transcript in a database so that any
//! client can list, reload and resume its sessions with nothing lost.
//!
//! # Layout
//!
//! The core path, from the socket to the store, bottom first (docs/architecture.md draws it, and
//! `tests/it/layering.rs` holds every import to it):
//!
//! - `protocol`: JSON-RPC parsing (once, borrowed) and frame building (no re-serialization).
//! - [`infra`]: configuration, the clock, logs and the Prometheus recorder, metrics, traces,
//!   private files, the byte-bounded queues.
//! - [`store`]: the `Store` trait (SQLite and Postgres), the `Db` handle the features' tables are
//!   reached through, the batching transcript writer, cursors.
//! - `tenancy`: what a user's agent process can reach: environment, home, workspaces, sandbox.
//! - `agents`: agent processes pooled per agent (`pool`: spawning, routing stdout, reaping),
//!   and the built-in offline agent (`demo`).
//! - `session`: live sessions: sequence numbers, attached clients, agent requests.
//!
//! The features, each in its own module: [`audit`] (who did what), [`export`] (a transcript as
//! JSON Lines or Markdown), [`identity`] (tokens; team sign-in through OpenID Connect), `push`
//! (Web Push), [`replica`] (replicas sharing sessions through Postgres), `retention` (deleting
//! sessions past `[retention] days`), `settings` (a user's sealed agent keys and MCP servers),
//! [`sharing`] (sessions shared with a teammate, and the watch that closes the clients of shares
//! that end), `signin` (signing users in to agents in a pseudo-terminal), `usage` (spend, and the
//! per-user caps).
//!
//! On top: `connection` (one WebSocket connection: reading, writing, what each method does),
//! [`gateway`] (the state handlers reach), `http` (the routes), [`app`] (builds every part,
//! serves, shuts down in order) and [`cli`] (the commands; `main.rs` only calls it).

// Unit tests spawn freely: their runtime ends with each test.
#![cfg_attr(test, allow(clippy::disallowed_methods))]

/// jemalloc instead of glibc's malloc, for every binary built on this crate (the server, its
/// tests and benchmarks, so that what they measure is what runs). The gateway's threads hand
/// buffers to each other (an agent's reader allocates an update, the transcript writer and a
/// client's sender free it), and glibc frees a block into the arena of the thread that allocated
/// it, under that arena's lock: in a 200,000-update stream nine in ten of the gateway's futex
/// calls were threads waiting on those locks (measured with `perf record -e
/// syscalls:sys_enter_futex --call-graph dwarf`). jemalloc's per-thread caches take those frees
/// without a lock. docs/dependencies.md gives the figures.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

pub(crate) mod agents;
pub mod app;
pub mod audit;
pub mod cli;
pub(crate) mod connection;
pub mod editor;
pub mod export;
pub mod gateway;
pub(crate) mod http;
pub mod identity;
pub mod infra;
pub(crate) mod protocol;
pub(crate) mod push;
pub mod replica;
pub(crate) mod retention;
pub(crate) mod session;
pub(crate) mod settings;
pub mod sharing;
pub(crate) mod signin;
pub mod store;
pub(crate) mod tenancy;
pub(crate) mod usage;
