//! The agent's modes, config options and models as this replica knows them for a session: what
//! `session/load` answers with, when the store's copy must be read instead (another replica may
//! serve the session), and how changes reach the store in the order they were made.

use parking_lot::MutexGuard;
use std::sync::atomic::Ordering;

use super::LiveSession;
use crate::session::controls::Controls;
use crate::store::persister::Item;

/// The agent's modes, config options and models as this replica last knew them: current while
/// the session is served here (see [`LiveSession::controls_json`]).
#[derive(Debug, Default)]
pub(super) struct KnownControls {
    /// The controls.
    pub(super) now: parking_lot::Mutex<Controls>,
    /// Whether `now` holds what the store does (or newer): read from it, or set here.
    pub(super) known: std::sync::atomic::AtomicBool,
}

impl LiveSession {
    pub(super) fn lock_controls(&self) -> MutexGuard<'_, Controls> {
        self.controls.now.lock()
    }

    /// The agent's controls as `session/load` answers them (a JSON object). Current while the
    /// session is served here, or when [`LiveSession::controls_need_store`] says so.
    pub fn controls_json(&self) -> String {
        self.lock_controls().to_json()
    }

    /// Whether the store may hold newer controls than this replica: it never read them, or
    /// (when other replicas share the database and it does not serve the session now) another
    /// replica may have changed them.
    pub fn controls_need_store(&self) -> bool {
        !self.controls.known.load(Ordering::Acquire) || (self.ctx.replica.is_some() && !self.is_bound_now())
    }

    /// Takes what the store holds.
    pub fn stored_controls(&self, stored: &str) {
        *self.lock_controls() = Controls::from_result(stored);
        self.controls.known.store(true, Ordering::Release);
    }

    /// Changes the controls with `change` (which says whether it changed anything) and, if it
    /// did, stores them.
    pub async fn change_controls(&self, change: impl FnOnce(&mut Controls) -> bool) {
        if !self.change_controls_now(change) {
            return;
        }
        if self.ctx.replica.is_some() {
            self.store_controls_now().await;
        } else {
            self.store_controls_in_order().await;
        }
    }

    /// Changes the controls in memory only (the caller stores them with
    /// [`LiveSession::store_controls_in_order`]); whether `change` changed anything.
    pub fn change_controls_now(&self, change: impl FnOnce(&mut Controls) -> bool) -> bool {
        let changed = change(&mut self.lock_controls());
        self.controls.known.store(true, Ordering::Release);
        changed
    }

    /// Queues the controls as they are now for the writer.
    pub async fn store_controls_in_order(&self) {
        let _numbering = self.seq.lock.lock().await;
        self.store_controls().await;
    }

    /// Whether other replicas read this session's controls from the store.
    pub fn replicated(&self) -> bool {
        self.ctx.replica.is_some()
    }

    /// Stores the controls as they are now and waits until they are written (at most the
    /// writer's flush timeout), so other replicas read what this one answered.
    pub async fn store_controls_now(&self) {
        self.store_controls_in_order().await;
        if let Err(e) = self.ctx.persister.flush().await {
            tracing::warn!(session = %self.id, error = %e, "session controls not yet stored");
        }
    }

    /// Queues the controls for the writer. Called under `numbering`, and the controls are read
    /// there, so the writer gets them in the order they changed (the last write is the newest).
    pub(super) async fn store_controls(&self) {
        let controls = self.controls_json();
        self.ctx
            .persister
            .send(Item::Controls {
                session: self.id.clone(),
                controls,
            })
            .await;
    }
}
