//! The other replicas sharing the database, as sessions reach them. The replica feature
//! implements [`Replicas`] (`replica::Replica`: leases, the followers' rows, the bus), and
//! start-up hands it to the session service, so the session layer names no replica type.

use std::sync::Arc;

use async_trait::async_trait;

use crate::store::StoreError;

/// Who holds a session's lease after [`Replicas::acquire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// This replica (taken now, or held already).
    Me,
    /// Another replica, alive and within its lease.
    Other(String),
}

/// What [`Replicas::follow`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Followed {
    /// Another replica serves the session: its commits are announced from now on, and the ones
    /// before are in the store (the caller reads it).
    pub served_by: Option<Served>,
    /// This replica's clients may answer the session's agent requests from now on (a client that
    /// may control the session attached here for the first time).
    pub new_watcher: bool,
}

/// The replica serving a session.
#[derive(Debug, PartialEq, Eq)]
pub struct Served {
    /// Its id.
    pub replica: String,
    /// Whether its lease is current (an expired one may be taken over at any moment).
    pub current: bool,
}

/// What the session layer tells another replica about agent requests asked across replicas
/// (docs/replicas.md); the bus sends it from this replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// This replica's agent asks `session`'s clients something: the target asks its own.
    Ask {
        /// This replica's number for the request.
        key: u64,
        /// Gateway session id.
        session: String,
        /// The ACP method.
        method: String,
        /// Its params (with the gateway's session id), raw JSON.
        params: String,
        /// Ask only after the updates up to this seq (the request followed them).
        after_seq: u64,
    },
    /// A client here answered the target's request `key` first.
    Answered {
        /// The request's `key`.
        key: u64,
        /// The client's `result`, raw JSON, if it had one.
        result: Option<String>,
        /// Its `error`, raw JSON, if it had one.
        error: Option<String>,
    },
    /// This replica's request `key` is settled: the target tells its clients `$/cancel_request`.
    Settled {
        /// The request's `key`.
        key: u64,
    },
    /// This replica has clients of `session` now: the serving replica asks it what its agent is
    /// still waiting on.
    Watching {
        /// Gateway session id.
        session: String,
    },
}

/// This replica among the others on one Postgres database, as the session layer uses it.
#[async_trait]
pub trait Replicas: Send + Sync + std::fmt::Debug + 'static {
    /// This replica's id.
    fn id(&self) -> &Arc<str>;
    /// Whether this replica holds `session`'s lease.
    fn holds(&self, session: &str) -> bool;
    /// Takes `session`'s lease if it is free, expired, this replica's, or its holder is gone.
    async fn acquire(&self, session: &str) -> Result<Holder, StoreError>;
    /// Takes the lease of a session created here just now.
    async fn acquire_new(&self, session: &str) -> Result<Holder, StoreError>;
    /// A client of this replica attached to `session` (`controls`: one that may answer its
    /// agent's requests); `None` when there was nothing new to note.
    async fn follow(&self, session: &str, controls: bool) -> Result<Option<Followed>, StoreError>;
    /// Asks the replica serving `session` (another one) to announce its commits.
    async fn announce(&self, session: &str) -> Result<Option<Served>, StoreError>;
    /// Whether this replica follows `session`.
    fn follows(&self, session: &str) -> bool;
    /// Stops following `session` if `unattended` still says nobody here is attached; whether it
    /// did.
    async fn unfollow(&self, session: &str, unattended: &(dyn Fn() -> bool + Send + Sync)) -> Result<bool, StoreError>;
    /// Forgets that `session` is followed (its rows are written again at the next follow).
    fn forget_following(&self, session: &str);
    /// This replica's clients no longer answer `session`'s agent requests.
    async fn unwatch(&self, session: &str) -> Result<(), StoreError>;
    /// The other replicas whose clients may answer `session`'s agent requests, newest first.
    async fn watchers(&self, session: &str) -> Result<Vec<String>, StoreError>;
    /// Sends `note` to replica `target`, from this one.
    async fn tell(&self, target: &str, note: Note) -> Result<(), StoreError>;
}
