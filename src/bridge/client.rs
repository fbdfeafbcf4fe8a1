//! One connected WebSocket client, as the rest of the gateway sees it: a bounded queue of frames
//! for it, and the bookkeeping of requests in flight in both directions.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use axum::extract::ws::Utf8Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::pool::AgentProcess;
use crate::session::Settle;

/// What the connection's writer sends.
#[derive(Debug)]
pub enum Outbound {
    /// A JSON-RPC message.
    Text(Utf8Bytes),
    /// Close the connection with this code and reason.
    Close(u16, &'static str),
}

/// Close code sent to a client that stopped reading (RFC 6455 1013, "try again later").
pub const CLOSE_TOO_SLOW: u16 = 1013;

/// Where one of a client's requests went: the process and the id the gateway used there.
type ForwardedTo = (Weak<AgentProcess>, u64);

/// A connected client.
pub struct ClientHandle {
    /// `Acp-Connection-Id`.
    pub id: Arc<str>,
    /// The authenticated user.
    pub user: Arc<str>,
    /// Frames for the writer (bounded: `limits.client_queue`).
    tx: mpsc::Sender<Outbound>,
    /// Fired when the connection is closing.
    closed: CancellationToken,
    /// How long a full queue may stay full before the client is dropped.
    slow_timeout: Duration,
    /// Ids for requests the gateway sends this client (its own id space on this socket).
    next_out_id: AtomicU64,
    /// Agent requests asked of this client, by the id it was asked under.
    out_requests: Mutex<HashMap<u64, Arc<Settle>>>,
    /// This client's requests in flight at an agent: its id (raw JSON) → (process, agent-side id).
    forwarded: Mutex<HashMap<Box<str>, ForwardedTo>>,
    /// Sessions it is attached to.
    sessions: Mutex<HashSet<Arc<str>>>,
}

impl std::fmt::Debug for ClientHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientHandle")
            .field("id", &self.id)
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl ClientHandle {
    /// A handle and the receiving end of its queue.
    pub fn new(
        id: Arc<str>,
        user: Arc<str>,
        queue: usize,
        slow_timeout: Duration,
    ) -> (Arc<Self>, mpsc::Receiver<Outbound>) {
        let (tx, rx) = mpsc::channel(queue);
        let handle = Self {
            id,
            user,
            tx,
            closed: CancellationToken::new(),
            slow_timeout,
            next_out_id: AtomicU64::new(0),
            out_requests: Mutex::new(HashMap::new()),
            forwarded: Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashSet::new()),
        };
        (Arc::new(handle), rx)
    }

    /// Queues a frame. Waits while the queue is full, up to the slow-client timeout; a client
    /// still not reading then is disconnected (it can reconnect and catch up with `afterSeq`).
    /// `false` when the frame was not queued.
    pub async fn send(&self, frame: Utf8Bytes) -> bool {
        if self.closed.is_cancelled() {
            return false;
        }
        match self.tx.try_send(Outbound::Text(frame)) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Closed(_)) => false,
            Err(mpsc::error::TrySendError::Full(msg)) => {
                let sent = tokio::select! {
                    r = tokio::time::timeout(self.slow_timeout, self.tx.send(msg)) => r,
                    () = self.closed.cancelled() => return false,
                };
                match sent {
                    Ok(Ok(())) => true,
                    Ok(Err(_)) => false,
                    Err(_) => {
                        tracing::warn!(connection = %self.id, user = %self.user, "client is not reading; disconnecting it");
                        metrics::counter!("acp_gateway_slow_clients_dropped_total").increment(1);
                        self.close(CLOSE_TOO_SLOW, "client too slow; reconnect and resume with afterSeq");
                        false
                    }
                }
            }
        }
    }

    /// Closes the connection.
    pub fn close(&self, code: u16, reason: &'static str) {
        if !self.closed.is_cancelled() {
            self.closed.cancel();
            let _ = self.tx.try_send(Outbound::Close(code, reason));
        }
    }

    /// Whether the connection is closing.
    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Resolves when the connection is closing.
    pub async fn closed(&self) {
        self.closed.cancelled().await;
    }

    /// Records an agent request asked of this client; returns the id to ask it under.
    pub fn register_out_request(&self, settle: Arc<Settle>) -> u64 {
        let id = self.next_out_id.fetch_add(1, Ordering::Relaxed);
        self.out_requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, settle);
        id
    }

    /// Takes the agent request this client was asked under `id`.
    pub fn take_out_request(&self, id: u64) -> Option<Arc<Settle>> {
        self.out_requests.lock().unwrap_or_else(|e| e.into_inner()).remove(&id)
    }

    /// Forgets an agent request settled elsewhere.
    pub fn forget_out_request(&self, id: u64) {
        self.out_requests.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    }

    /// Remembers where a forwarded request went (for `$/cancel_request`).
    pub fn remember_forwarded(&self, client_id: &str, process: &Arc<AgentProcess>, agent_id: u64) {
        self.forwarded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(client_id.into(), (Arc::downgrade(process), agent_id));
    }

    /// Forgets a forwarded request (answered).
    pub fn forget_forwarded(&self, client_id: &str) {
        self.forwarded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(client_id);
    }

    /// Where a forwarded request went.
    pub fn forwarded(&self, client_id: &str) -> Option<(Arc<AgentProcess>, u64)> {
        let map = self.forwarded.lock().unwrap_or_else(|e| e.into_inner());
        map.get(client_id).and_then(|(p, id)| p.upgrade().map(|p| (p, *id)))
    }

    /// Notes that the client is attached to a session.
    pub fn track_session(&self, id: &Arc<str>) {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone());
    }

    /// Notes that the client left a session.
    pub fn untrack_session(&self, id: &str) {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    }

    /// Everything to clean up when the connection ends.
    pub fn take_leftovers(&self) -> (Vec<Arc<str>>, Vec<Arc<Settle>>) {
        let sessions = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .collect();
        let asked = self
            .out_requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .map(|(_, s)| s)
            .collect();
        self.forwarded.lock().unwrap_or_else(|e| e.into_inner()).clear();
        (sessions, asked)
    }
}
