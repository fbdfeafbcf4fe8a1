//! Replicas that share sessions through Postgres: Postgres is the shared state and the bus,
//! nothing else is (no cluster protocol of our own).
//!
//! - [`lease`]: a session is served live (on an agent process) by the replica holding its lease
//!   (`session_leases`): taken when it creates or restores the session, renewed in one statement
//!   every third of the lease time, given up when the session leaves its agent and at shutdown.
//!   Another replica takes it once it expired, or at once when its holder is gone from the
//!   database: each replica holds an advisory lock on its listening connection, and a killed
//!   process's connections (and lock) end with it. The transcript writer stores a session's
//!   updates only while its lease is held ([`crate::store::Store::write_batch_leased`]).
//! - [`bus`]: every replica LISTENs. The writer NOTIFYs `acp_session_committed` (`session:seq`)
//!   in the transaction that stores the updates, so the notice arrives exactly when they are
//!   committed, for the sessions another replica follows ([`follow`]); a replica with clients on
//!   a session it does not serve reads them from `session_events`. Messages between replicas (a
//!   client's prompt or cancel for a session another replica serves, and the answers) are rows
//!   of `replica_messages`, announced by NOTIFY `acp_replica` (`target:id`).
//!
//! This module knows the database and nothing above it: what a notice or message means is the
//! [`Handler`]'s business (the session and bridge layers implement it).

pub mod bus;
pub mod follow;
pub mod lease;
mod sessions;
pub mod watchers;

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use tokio::sync::oneshot;

use crate::store::StoreError;

/// First key of every replica's advisory lock (the second is `hashtext(replica id)`): "acpg".
const LOCK_CLASS: i32 = 0x6163_7067;
/// Channel of commit notices.
pub const COMMITTED_CHANNEL: &str = "acp_session_committed";
/// Channel of messages between replicas.
pub const MESSAGE_CHANNEL: &str = "acp_replica";

/// What a replica is told by the bus.
pub trait Handler: Send + Sync + 'static {
    /// Updates of `session` up to `seq` are committed (by whichever replica serves it).
    fn committed(&self, session: &str, seq: u64);
    /// The listening connection was re-established: notices may have been missed meanwhile.
    fn resync(&self);
    /// Another replica sent this replica a message.
    fn message(&self, message: Message);
    /// Whether this replica still serves `session` on an agent process (else its lease goes).
    fn serving(&self, session: &str) -> bool;
    /// Another replica took `session`'s lease: this one must stop serving it live.
    fn lease_lost(&self, session: &str);
}

/// A message between replicas (a `replica_messages` row's body).
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Message {
    /// A client of `from` sent `method` for `session`, which the target serves.
    #[serde(rename_all = "camelCase")]
    Request {
        /// The replica to answer.
        from: String,
        /// Matches the answer to the waiting request on `from`.
        reply: u64,
        /// Gateway session id.
        session: String,
        /// The session's owner (the target checks it again).
        user: String,
        /// The teammate who sent it under a share, when not the owner: the target checks that a
        /// share still lets them control the session (it may have been revoked there), and what
        /// they queue is theirs. Absent from a replica that predates it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        teammate: Option<String>,
        /// The ACP method.
        method: String,
        /// Its params, raw JSON (a string: serde cannot buffer raw values in tagged enums).
        params: String,
        /// The client's id for the request, raw JSON (the answer frame carries it).
        client_id: String,
    },
    /// A client of another replica sent a notification (`session/cancel`) for `session`.
    #[serde(rename_all = "camelCase")]
    Notify {
        /// Gateway session id.
        session: String,
        /// The session's owner.
        user: String,
        /// The teammate who sent it under a share, when not the owner: the target checks that a
        /// share still lets them control the session. Absent from a replica that predates it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        teammate: Option<String>,
        /// The ACP method.
        method: String,
        /// Its params, raw JSON.
        params: String,
    },
    /// The answer to a [`Message::Request`].
    #[serde(rename_all = "camelCase")]
    Answer {
        /// The request's `reply`.
        reply: u64,
        /// The whole JSON-RPC response for the client, under its own id.
        frame: String,
        /// Show it only after every update up to this seq (it followed them on the serving
        /// replica).
        after_seq: u64,
    },
    /// The serving replica `from`'s agent asked something (`session/request_permission`,
    /// `fs/*`, `terminal/*`) of `session`'s clients: the target asks its own.
    #[serde(rename_all = "camelCase")]
    Ask {
        /// The serving replica (the answer goes there).
        from: String,
        /// Its number for the request.
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
    /// A client of replica `from` answered [`Message::Ask`] `key` first.
    #[serde(rename_all = "camelCase")]
    Answered {
        /// The replica whose client answered.
        from: String,
        /// The request's `key`.
        key: u64,
        /// The client's `result`, raw JSON, if it had one.
        result: Option<String>,
        /// Its `error`, raw JSON, if it had one.
        error: Option<String>,
    },
    /// [`Message::Ask`] `key` of replica `from` is settled (answered elsewhere, or given up):
    /// the target tells its clients `$/cancel_request`.
    #[serde(rename_all = "camelCase")]
    Settled {
        /// The serving replica that asked.
        from: String,
        /// The request's `key`.
        key: u64,
    },
    /// Replica `from` has clients of `session` now: the serving replica asks it what its agent
    /// is still waiting on.
    #[serde(rename_all = "camelCase")]
    Watching {
        /// The replica whose client attached.
        from: String,
        /// Gateway session id.
        session: String,
    },
}

/// An answer a remote request waits for.
#[derive(Debug)]
pub struct Answer {
    /// The JSON-RPC response for the client.
    pub frame: String,
    /// Deliver it after the updates up to this seq.
    pub after_seq: u64,
}

/// This replica's handle on the shared database: its identity, leases and messages.
#[derive(Debug)]
pub struct Replica {
    /// This process's name in `session_leases` and `replica_messages` (the configured
    /// `replica_id`, else random): unique among running replicas.
    pub id: Arc<str>,
    /// System connections (leases, messages, listening), as the login role: the tables' owner,
    /// which row-level security does not apply to.
    pool: PgPool,
    /// How long a lease lasts without renewal.
    pub ttl: Duration,
    /// Sessions whose lease this process holds, with when it took each and when the database
    /// last confirmed it.
    held: Mutex<HashMap<Arc<str>, lease::Held>>,
    /// Requests sent to other replicas, waiting for their answers.
    waiting: Mutex<HashMap<u64, oneshot::Sender<Answer>>>,
    /// Next `reply` number.
    next_reply: std::sync::atomic::AtomicU64,
    /// Sessions this process has noted in `session_watchers`.
    watching: Noted,
    /// Sessions this process has noted in `session_followers`.
    following: Noted,
    /// Held while this process starts or stops following or watching a session (see the
    /// `follow` module and [`Replica::unwatch`]).
    follows: tokio::sync::Mutex<()>,
}

/// Sessions this process has written a row for in one of its tables, so each is written once.
#[derive(Debug, Default)]
struct Noted(Mutex<HashSet<Arc<str>>>);

impl Noted {
    /// Notes `session`: whether it was not noted before.
    fn note(&self, session: &str) -> bool {
        self.set().insert(Arc::from(session))
    }

    /// Forgets `session` (its row is to be written again next time, or is gone).
    fn forget(&self, session: &str) {
        self.set().remove(session);
    }

    /// Whether `session` is noted.
    fn contains(&self, session: &str) -> bool {
        self.set().contains(session)
    }

    fn set(&self) -> parking_lot::MutexGuard<'_, HashSet<Arc<str>>> {
        self.0.lock()
    }
}

impl Replica {
    /// Connects to `url` as replica `id` with leases of `ttl`.
    pub async fn connect(url: &str, id: &str, ttl: Duration) -> Result<Arc<Self>, StoreError> {
        let options = PgConnectOptions::from_str(url)?.application_name(&format!("acp-gateway {id}"));
        let pool = PgPoolOptions::new()
            .max_connections(6)
            .min_connections(1)
            .acquire_timeout(crate::store::ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await?;
        Ok(Arc::new(Self {
            id: Arc::from(id),
            pool,
            ttl,
            held: Mutex::new(HashMap::new()),
            waiting: Mutex::new(HashMap::new()),
            next_reply: std::sync::atomic::AtomicU64::new(1),
            watching: Noted::default(),
            following: Noted::default(),
            follows: tokio::sync::Mutex::new(()),
        }))
    }

    /// Sends `message` to replica `target`.
    pub async fn send(&self, target: &str, message: &Message) -> Result<(), StoreError> {
        let body = serde_json::to_string(message).unwrap_or_default();
        let mut tx = self.pool.begin().await?;
        let id: i64 = sqlx::query_scalar("INSERT INTO replica_messages (target, body) VALUES ($1, $2) RETURNING id")
            .bind(target)
            .bind(body)
            .fetch_one(&mut *tx)
            .await?;
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(MESSAGE_CHANNEL)
            .bind(format!("{target}:{id}"))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// A number for a request that waits for an answer, and where the answer will arrive.
    pub fn expect_answer(&self) -> (u64, oneshot::Receiver<Answer>) {
        let reply = self.next_reply.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().insert(reply, tx);
        (reply, rx)
    }

    /// Forgets a request given up on.
    pub fn forget_answer(&self, reply: u64) {
        self.waiting.lock().remove(&reply);
    }

    /// Hands an arrived answer to whoever waits for it.
    fn answered(&self, reply: u64, answer: Answer) {
        if let Some(tx) = self.waiting.lock().remove(&reply) {
            let _ = tx.send(answer);
        }
    }
}
