//! Domain errors as the ACP edge answers them: the store's and a refused path's, mapped once to
//! JSON-RPC.

use crate::protocol::RpcError;
use crate::store::StoreError;
use crate::tenancy::{McpRefused, PathRefused};

/// A client's MCP server refused: `-32602`, naming the entry.
impl From<McpRefused> for RpcError {
    fn from(e: McpRefused) -> Self {
        Self::invalid_params(e.to_string())
    }
}

/// A client's path refused: `-32602`, saying why and naming the roots allowed.
impl From<PathRefused> for RpcError {
    fn from(e: PathRefused) -> Self {
        Self::invalid_params(e.to_string())
    }
}

/// What a client sees when the store fails: a generic internal error. The detail is logged here,
/// once, so callers can use `?` where they answer a client.
impl From<StoreError> for RpcError {
    fn from(e: StoreError) -> Self {
        tracing::error!(error = %e, "session store failed");
        Self::internal("session store unavailable")
    }
}

#[cfg(test)]
mod tests {
    use crate::protocol::{RpcError, codes};
    use crate::store::StoreError;

    #[test]
    fn store_errors_reach_clients_without_their_detail() {
        let e = RpcError::from(StoreError::UnsupportedUrl("mysql://secret@host".into()));
        assert_eq!(e.code, codes::INTERNAL_ERROR);
        assert_eq!(e.message, "session store unavailable");
        assert_eq!(e.data, None);
    }
}
