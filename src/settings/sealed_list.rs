//! A per-user list kept as one sealed row of `user_secrets` (the whole list is one ciphertext
//! under the gateway's secrets key, bound to its owner): users' own MCP servers and their push
//! subscriptions. The row's `agent` column holds a name no agent may have (it begins with `/`),
//! so agent keys and sign-out never meet it.

use std::sync::Arc;

use secrecy::ExposeSecret;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::settings::secrets::{Sealed, Sealer};
use crate::store::{Store, StoredSecret};

/// Why a request about a user's list failed; the message says what.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    /// Not acceptable as given.
    #[error("{0}")]
    Invalid(String),
    /// The operator turned the feature off (the message names the setting).
    #[error("{0}")]
    Off(&'static str),
    /// The store failed.
    #[error("{0}")]
    Unavailable(String),
}

/// One user's list of `T`, under `user_secrets (owner, agent, name)`.
#[derive(Debug)]
pub struct SealedList {
    store: Arc<dyn Store>,
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
    pub fn new(
        store: Arc<dyn Store>,
        sealer: Sealer,
        agent: &'static str,
        name: &'static str,
        what: &'static str,
    ) -> Self {
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
    pub async fn read<T: DeserializeOwned>(&self, owner: &str) -> Result<Vec<T>, String> {
        let what = self.what;
        let rows = self
            .store
            .secrets(owner, Some(self.agent))
            .await
            .map_err(|e| format!("{what} cannot be read now: {e}"))?;
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
            .map_err(|e| format!("{what} cannot be opened: {e}"))?;
        serde_json::from_str(plain.expose_secret()).map_err(|e| format!("{what} as stored cannot be read: {e}"))
    }

    /// Replaces `owner`'s list (an empty one removes the row).
    pub async fn write<T: Serialize>(&self, owner: &str, items: &[T]) -> Result<(), String> {
        let what = self.what;
        let failed = |e: crate::store::StoreError| format!("{what} could not be stored: {e}");
        if items.is_empty() {
            self.store.delete_secrets(owner, self.agent).await.map_err(failed)?;
            return Ok(());
        }
        let plain = serde_json::to_string(items).map_err(|e| e.to_string())?;
        let sealed = self.sealer.seal(owner, self.agent, self.name, &plain);
        let row = StoredSecret {
            agent: self.agent.to_string(),
            name: self.name.to_string(),
            key_id: sealed.key_id,
            nonce: sealed.nonce,
            ciphertext: sealed.ciphertext,
            updated_at: crate::store::now_micros(),
        };
        self.store.put_secrets(owner, &[row]).await.map_err(failed)
    }
}
