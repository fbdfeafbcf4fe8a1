//! Sessions: in memory (sequence, attached clients, agent process) and as the agent process
//! sees them ([`crate::agents::pool::SessionRoute`]).
//!
//! - [`live`]: one session and its publish path (stored before it is visible).
//! - [`client`]: a connected client as sessions see it.
//! - [`controls`]: the agent's modes, config options and models, as `session/load` answers them.
//! - [`requests`]: an agent's requests to the session's clients.
//! - [`asks`]: those requests asked of clients on other replicas too.
//! - [`registry`]: the sessions in memory.
//! - [`service`]: the one door to session rows and transcripts.
//! - [`list`]: `session/list` from the store.
//! - [`queue`]: messages typed while a turn runs, sent as turns end.
//! - [`shared`]: sessions shared with other replicas (leases, updates committed elsewhere).
//! - [`replicas`]: the other replicas as sessions reach them (the replica feature implements it).

pub mod asks;
pub mod client;
pub mod controls;
pub mod list;
pub mod live;
pub mod observe;
pub mod queue;
pub mod registry;
pub mod replicas;
pub mod requests;
pub mod service;
pub mod shared;

pub use client::Client;
pub use controls::Controls;
pub use live::{Attach, Context, LiveSession, SessionOptions};
pub use observe::{Attention, Notifier, UpdateObserver, UserServers};
pub use registry::Registry;
pub use replicas::{Followed, Holder, Note, Replicas, Served};
pub use service::Sessions;
