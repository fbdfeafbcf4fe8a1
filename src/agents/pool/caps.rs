//! What the pool asks before it starts a process for one user: a slot under their cap on agent
//! processes. The per-user caps implement [`ProcessCaps`]; the pool knows only this trait.

use std::fmt::Debug;
use std::sync::Arc;

use crate::protocol::RpcError;

/// Counts each user's agent processes against their cap.
pub trait ProcessCaps: Send + Sync + Debug {
    /// One of `user`'s process slots, held for the life of the process; the refusal (naming the
    /// cap and its limit) when they hold as many as they may.
    fn agent_process(&self, user: &Arc<str>) -> Result<ProcessSlot, RpcError>;
}

/// A user's hold on one process slot: given back when dropped.
#[derive(Debug)]
pub struct ProcessSlot {
    user: Arc<str>,
    _hold: Box<dyn Debug + Send + Sync>,
}

impl ProcessSlot {
    /// `user`'s slot, given back when `hold` is dropped.
    pub fn new(user: Arc<str>, hold: impl Debug + Send + Sync + 'static) -> Self {
        Self {
            user,
            _hold: Box::new(hold),
        }
    }

    /// Whose slot it is.
    pub fn user(&self) -> &Arc<str> {
        &self.user
    }
}
