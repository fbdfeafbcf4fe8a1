//! A per-user cap that was reached: the refusal the caps (`usage::quota`), the sessions (stored
//! bytes) and the pool answer with, counted and named the same way everywhere.

use crate::protocol::RpcError;
use crate::protocol::codes::CAP_REACHED;

/// A cap that was reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapReached {
    /// Which cap (`connections`, `agent_processes`, `requests_per_second`, `live_sessions`,
    /// `stored_bytes`).
    pub cap: &'static str,
    /// Its limit.
    pub limit: u64,
}

impl CapReached {
    /// A refusal at `cap` (one of [`crate::infra::metrics::CAPS`]), counted in
    /// `acp_gateway_cap_hits_total`.
    pub fn new(cap: &'static str, limit: u64) -> Self {
        crate::infra::metrics::cap_hit(cap);
        Self { cap, limit }
    }

    /// The message a client gets.
    pub fn message(&self) -> String {
        format!(
            "per-user cap reached: {} (limit {}); try again later",
            self.cap, self.limit
        )
    }

    /// As a JSON-RPC error.
    pub fn rpc(&self) -> RpcError {
        RpcError::new(CAP_REACHED, self.message())
            .with_data(serde_json::json!({ "cap": self.cap, "limit": self.limit }))
    }
}
