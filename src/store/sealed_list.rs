//! A per-user list kept as one sealed row of `user_secrets` (the whole list is one ciphertext
//! under the gateway's secrets key, bound to its owner): users' own MCP servers and their push
//! subscriptions. The row's `agent` column holds a name no agent may have (it begins with `/`),
//! so agent keys and sign-out never meet it.

use secrecy::ExposeSecret;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::infra::sealing::{Sealed, Sealer, SecretsError};
use crate::store::{SealedRows, StoreError, StoredSecret};

/// Why a request about a user's list failed; the message says what.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    /// Not acceptable as given.
    #[error("{0}")]
    Invalid(String),
    /// The operator turned the feature off (the message names the setting).
    #[error("{0}")]
    Off(&'static str),
    /// The list could not be read or stored.
    #[error(transparent)]
    Unavailable(#[from] SealedError),
}

/// Why a sealed list could not be read or stored; each names the list ("your MCP servers").
#[derive(Debug, thiserror::Error)]
pub enum SealedError {
    /// The store failed to read it.
    #[error("{what} cannot be read now: {source}")]
    Read {
        /// The list.
        what: &'static str,
        /// What the store said.
        source: StoreError,
    },
    /// Its ciphertext does not open (another key, another owner, tampered).
    #[error("{what} cannot be opened: {source}")]
    Open {
        /// The list.
        what: &'static str,
        /// Why it did not open.
        source: SecretsError,
    },
    /// It opened but is not a list of what it holds.
    #[error("{what} as stored cannot be read: {source}")]
    Decode {
        /// The list.
        what: &'static str,
        /// What the JSON parser said.
        source: serde_json::Error,
    },
    /// It could not be written as JSON.
    #[error("{what} could not be written down: {source}")]
    Encode {
        /// The list.
        what: &'static str,
        /// What the JSON writer said.
        source: serde_json::Error,
    },
    /// The store failed to keep it.
    #[error("{what} could not be stored: {source}")]
    Write {
        /// The list.
        what: &'static str,
        /// What the store said.
        source: StoreError,
    },
}

impl SealedError {
    /// What failed, without why: what a client is told (the why, the store's own words, goes to
    /// the log).
    pub fn what_failed(&self) -> String {
        match self {
            Self::Read { what, .. } => format!("{what} cannot be read now"),
            Self::Open { what, .. } => format!("{what} cannot be opened"),
            Self::Decode { what, .. } => format!("{what} as stored cannot be read"),
            Self::Encode { what, .. } | Self::Write { what, .. } => format!("{what} could not be stored"),
        }
    }
}

/// One user's list of `T`, under `user_secrets (owner, agent, name)`.
#[derive(Debug)]
pub struct SealedList {
    store: SealedRows,
    sealer: Sealer,
    /// The `agent` column: begins with `/` (config refuses such agent names).
    agent: &'static str,
    /// The `name` column.
    name: &'static str,
    /// What the list is, in errors ("your MCP servers").
    what: &'static str,
}

impl SealedList {
    /// The list `what` of each user, in `store` under (`agent`, `name`), sealed by `sealer`.
    pub fn new(store: SealedRows, sealer: Sealer, agent: &'static str, name: &'static str, what: &'static str) -> Self {
        debug_assert!(agent.starts_with('/'));
        Self {
            store,
            sealer,
            agent,
            name,
            what,
        }
    }

    /// `owner`'s list (empty when they have none); the error says what failed.
    pub async fn read<T: DeserializeOwned>(&self, owner: &str) -> Result<Vec<T>, SealedError> {
        let what = self.what;
        let rows = self
            .store
            .get(owner, Some(self.agent))
            .await
            .map_err(|source| SealedError::Read { what, source })?;
        let Some(row) = rows.into_iter().find(|r| r.name == self.name) else {
            return Ok(Vec::new());
        };
        let sealed = Sealed {
            key_id: row.key_id,
            nonce: row.nonce,
            ciphertext: row.ciphertext,
        };
        let plain = self
            .sealer
            .open(owner, self.agent, self.name, &sealed)
            .map_err(|source| SealedError::Open { what, source })?;
        serde_json::from_str(plain.expose_secret()).map_err(|source| SealedError::Decode { what, source })
    }

    /// Replaces `owner`'s list (an empty one removes the row).
    pub async fn write<T: Serialize>(&self, owner: &str, items: &[T]) -> Result<(), SealedError> {
        let what = self.what;
        let failed = |source: StoreError| SealedError::Write { what, source };
        if items.is_empty() {
            self.store.delete(owner, self.agent).await.map_err(failed)?;
            return Ok(());
        }
        let plain = serde_json::to_string(items).map_err(|source| SealedError::Encode { what, source })?;
        let sealed = self.sealer.seal(owner, self.agent, self.name, &plain);
        let row = StoredSecret {
            agent: self.agent.to_string(),
            name: self.name.to_string(),
            key_id: sealed.key_id,
            nonce: sealed.nonce,
            ciphertext: sealed.ciphertext,
            updated_at: crate::store::now_micros(),
        };
        self.store.put(owner, &[row]).await.map_err(failed)
    }
}
