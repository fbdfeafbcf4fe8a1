//! # acp-gateway
//!
//! A multi-user WebSocket gateway for Agent Client Protocol (ACP) agents. Browsers and remote ACP
//! clients connect to `/acp`; the gateway authenticates them (JWT), bridges them to pooled stdio
//! agent processes, and keeps every session and its full transcript in a database so that any
//! client can list, reload and resume its sessions with nothing lost.
//!
//! # Layout
//!
//! - [`cli`]: the commands (`serve`, `token`, `migrate`, `demo-agent`). `main.rs` only calls it.
//! - [`config`]: defaults → TOML file → environment → flags.
//! - [`app`]: builds every part, serves, and shuts down in order.
//! - [`gateway`]: the state handlers reach (config, auth, sessions, pools, tenancy).
//! - [`http`]: the routes: health, metrics, `/acp` upgrade, REST API, the web UI's workspace
//!   browser (`/api/fs/*`), login, static web UI.
//! - [`audit`]: the audit log (who did what), as log lines and rows.
//! - [`auth`]: JWT verification and minting; where tokens come from; an identity provider's keys.
//! - [`oidc`]: signing people in through the team's identity provider (OpenID Connect).
//! - [`bridge`]: one WebSocket connection: reading, writing, and what each method does.
//! - [`quota`]: per-user caps (connections, request rate).
//! - [`retention`]: deleting sessions not updated for `[retention] days`, in bounded batches.
//! - [`replica`]: replicas sharing sessions through Postgres: leases, the LISTEN/NOTIFY bus.
//! - [`session`]: live sessions: sequence numbers, attached clients, agent requests.
//! - [`pool`]: agent processes, pooled per agent; spawning, routing stdout, reaping.
//! - [`store`]: the `Store` trait (SQLite and Postgres), the batching transcript writer, cursors.
//! - [`outbox`]: one client's bounded outgoing queue (never waited on by fan-out).
//! - [`protocol`]: JSON-RPC parsing (once, borrowed) and frame building (no re-serialization).
//! - [`demo_agent`]: the built-in offline ACP agent.
//! - [`export`]: a stored transcript as JSON Lines or Markdown, streamed page by page.
//! - [`telemetry`]: logs and the Prometheus recorder.
//! - [`metrics`]: every Prometheus series: names, help, labels known at start, buckets.
//! - [`secrets`]: keys users give their agents, sealed at rest (XChaCha20-Poly1305).
//! - [`sharing`]: sessions shared with a teammate (observer or controller, by name or link);
//!   [`share_watch`] closes the clients of shares that end.
//! - [`signin`]: signing users in to agents: a `terminal` method's login program in a
//!   pseudo-terminal, in the user's sandbox.
//! - [`usage`]: what each person spends (agents' `usage_update` costs), and caps on it.
//! - [`tenancy`]: what a user's agent process can reach: environment, home, workspaces, sandbox.
//! - [`traces`]: OpenTelemetry spans per client and agent request (OTLP/HTTP), W3C context to agents.

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

pub mod app;
pub mod audit;
pub mod auth;
pub(crate) mod bridge;
pub(crate) mod budget;
pub mod cli;
pub mod config;
pub mod demo_agent;
pub mod export;
pub(crate) mod files;
pub mod gateway;
pub(crate) mod http;
pub mod metrics;
pub mod oidc;
pub(crate) mod outbox;
pub mod pool;
pub(crate) mod protocol;
pub mod push;
pub mod quota;
pub mod replica;
pub mod retention;
pub mod sealed_list;
pub mod secrets;
pub mod session;
pub mod share_watch;
pub mod sharing;
pub mod signin;
pub mod store;
pub mod telemetry;
pub mod tenancy;
pub mod traces;
pub mod usage;
pub mod user_mcp;
