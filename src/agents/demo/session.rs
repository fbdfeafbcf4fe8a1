//! One demo session: its replayable history, its cwd and its prompts' turn-taking.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::path::PathBuf;

use serde_json::Value;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::{lock, modes};

/// Most updates kept per session for `session/load` replay (oldest dropped first).
const MAX_HISTORY: usize = 100_000;

/// One session: its replayable history and its prompt bookkeeping.
pub(super) struct Session {
    /// The session id.
    pub(super) id: String,
    /// Serialized `session/update` envelope up to and including `"update":`.
    pub(super) prefix: Box<[u8]>,
    /// Serialized `update` objects, oldest first, at most [`MAX_HISTORY`].
    pub(super) history: Mutex<VecDeque<Box<str>>>,
    /// Token shared by prompts received since the last cancel; replaced on each cancel.
    pub(super) cancel: Mutex<CancellationToken>,
    /// Fires (is dropped) when the last prompt received ends: each prompt waits for the one
    /// before it, so prompts run one at a time in the order they arrived.
    pub(super) turn: Mutex<Option<oneshot::Receiver<()>>>,
    /// The working directory the client gave (`session/new`, `load`, `resume`); showcase
    /// edits write under it and nowhere else.
    pub(super) cwd: Mutex<Option<PathBuf>>,
    /// Showcase mode's per-session choices (mode, model, effort) and running usage.
    pub(super) show: Mutex<modes::State>,
}

impl Session {
    /// A fresh session with an empty history.
    pub(super) fn new(id: &str) -> Self {
        let prefix = format!(
            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":{},"update":"#,
            Value::from(id)
        );
        Session {
            id: id.to_owned(),
            prefix: prefix.into_bytes().into_boxed_slice(),
            history: Mutex::default(),
            cancel: Mutex::default(),
            turn: Mutex::default(),
            cwd: Mutex::default(),
            show: Mutex::default(),
        }
    }

    /// Appends an update to the history, dropping the oldest beyond the cap.
    pub(super) fn record(&self, update: &str) {
        let mut h = lock(&self.history);
        h.push_back(update.into());
        if h.len() > MAX_HISTORY {
            h.pop_front();
        }
    }

    /// Remembers the client's `cwd` from a `session/new|load|resume` request's params.
    pub(super) fn set_cwd(&self, params: &Value) {
        if let Some(cwd) = params.get("cwd").and_then(Value::as_str) {
            *lock(&self.cwd) = Some(PathBuf::from(cwd));
        }
    }

    /// One `session/update` notification line for `update` (serialized).
    pub(super) fn update_line(&self, update: &str) -> Vec<u8> {
        let mut line = Vec::with_capacity(self.prefix.len() + update.len() + 3);
        line.extend_from_slice(&self.prefix);
        line.extend_from_slice(update.as_bytes());
        line.extend_from_slice(b"}}\n");
        line
    }

    /// Cancels every prompt received so far.
    pub(super) fn cancel(&self) {
        std::mem::take(&mut *lock(&self.cancel)).cancel();
    }
}
