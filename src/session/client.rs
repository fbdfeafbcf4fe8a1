//! A connected client as sessions see it: who it is, its outbox, and the agent requests it has
//! been asked (each under an id of its own connection). The WebSocket bridge creates it and
//! keeps the rest of the connection's bookkeeping itself.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::requests::AgentRequest;
use crate::infra::outbox::Outbox;

/// One connected client.
pub struct Client {
    /// `Acp-Connection-Id`, for logs.
    pub id: Arc<str>,
    /// The authenticated user: every session it touches must be theirs.
    pub user: Arc<str>,
    /// The client's address (for the audit log); none for the gateway's own stand-ins.
    pub addr: Option<Arc<str>>,
    /// Where its frames go.
    pub outbox: Outbox,
    /// Ids for the requests the gateway sends it (its own id space on this socket).
    next_out_id: AtomicU64,
    /// Agent requests asked of it and not yet answered, by the id it was asked under.
    asked: Mutex<HashMap<u64, Arc<AgentRequest>>>,
    /// The session its page shows in a visible tab, as it last said (`_gateway/visibility`):
    /// events of that session are not pushed to the user's devices.
    shown: Mutex<Option<Arc<str>>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("id", &self.id)
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client for `user` on connection `id`, from the address `addr`.
    pub fn new(id: Arc<str>, user: Arc<str>, addr: Option<Arc<str>>, outbox: Outbox) -> Arc<Self> {
        Arc::new(Self {
            id,
            user,
            addr,
            outbox,
            next_out_id: AtomicU64::new(0),
            asked: Mutex::new(HashMap::new()),
            shown: Mutex::new(None),
        })
    }

    /// The address, as the audit log takes it.
    pub fn addr(&self) -> Option<String> {
        self.addr.as_deref().map(String::from)
    }

    /// The client says its page shows `session` in a visible tab (`None`: nothing, or hidden).
    pub fn show(&self, session: Option<&str>) {
        *self.shown.lock() = session.map(Arc::from);
    }

    /// Whether its page shows `session` in a visible tab.
    pub fn shows(&self, session: &str) -> bool {
        self.shown.lock().as_deref().is_some_and(|s| s == session)
    }

    /// Whether its connection is closing.
    pub fn is_closed(&self) -> bool {
        self.outbox.is_closed()
    }

    /// Records an agent request asked of it; returns the id to ask it under.
    pub(crate) fn ask(&self, request: Arc<AgentRequest>) -> u64 {
        let id = self.next_out_id.fetch_add(1, Ordering::Relaxed);
        self.asked.lock().insert(id, request);
        id
    }

    /// Takes the agent request it was asked under `id` (it is answering it).
    pub fn take_asked(&self, id: u64) -> Option<Arc<AgentRequest>> {
        self.asked.lock().remove(&id)
    }

    /// Forgets a request settled elsewhere.
    pub(crate) fn forget_asked(&self, id: u64) {
        self.asked.lock().remove(&id);
    }

    /// Everything it was asked and did not answer (its connection is ending).
    pub fn take_all_asked(&self) -> Vec<Arc<AgentRequest>> {
        self.asked.lock().drain().map(|(_, r)| r).collect()
    }
}
