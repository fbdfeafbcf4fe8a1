//! Keys users give their agents (an agent's `env_var` sign-in methods: `OPENAI_API_KEY`, …),
//! sealed at rest by [`Sealer`] with the owner, the agent and the variable's name as associated
//! data. Values are never logged and never returned by a route: only their names and when they
//! were set.

use secrecy::{ExposeSecret, SecretString};

use crate::agents::pool::{UserEnv, UserEnvError};
use crate::infra::sealing::{Sealed, Sealer};
use crate::store::{SealedRows, StoreError, StoredSecret};

/// Users' keys: sealed into the store, opened for their own agent processes only.
#[derive(Debug)]
pub struct Keys {
    /// Where they are kept (sealed).
    store: SealedRows,
    /// Seals and opens them.
    sealer: Sealer,
}

/// A key as a user may see it: its name and when it was set, never its value.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KeyInfo {
    /// The agent it is for.
    pub agent: String,
    /// The environment variable.
    pub name: String,
    /// When it was set (epoch ms).
    #[serde(rename = "updatedAt")]
    pub updated_at_ms: i64,
}

impl Keys {
    /// Keys kept in `store`, sealed by `sealer`.
    pub fn new(store: SealedRows, sealer: Sealer) -> Self {
        Self { store, sealer }
    }

    /// Where they are kept (a user's agent logins are kept there too).
    pub fn rows(&self) -> &SealedRows {
        &self.store
    }

    /// Sets `owner`'s `vars` for `agent` (all or none).
    pub async fn set(&self, owner: &str, agent: &str, vars: &[(String, SecretString)]) -> Result<(), StoreError> {
        let now = crate::store::now_micros();
        let rows: Vec<StoredSecret> = vars
            .iter()
            .map(|(name, value)| {
                let sealed = self.sealer.seal(owner, agent, name, value.expose_secret());
                StoredSecret {
                    agent: agent.to_string(),
                    name: name.clone(),
                    key_id: sealed.key_id,
                    nonce: sealed.nonce,
                    ciphertext: sealed.ciphertext,
                    updated_at: now,
                }
            })
            .collect();
        self.store.put(owner, &rows).await
    }

    /// What `owner` has set, for every agent (names and times only).
    pub async fn list(&self, owner: &str) -> Result<Vec<KeyInfo>, StoreError> {
        Ok(self
            .store
            .get(owner, None)
            .await?
            .into_iter()
            .map(|s| KeyInfo {
                agent: s.agent,
                name: s.name,
                updated_at_ms: s.updated_at / 1000,
            })
            .collect())
    }

    /// Removes `owner`'s keys for `agent` (sign-out); how many there were.
    pub async fn remove(&self, owner: &str, agent: &str) -> Result<u64, StoreError> {
        self.store.delete(owner, agent).await
    }
}

#[async_trait::async_trait]
impl UserEnv for Keys {
    async fn env(&self, user: &str, agent: &str) -> Result<Vec<(String, SecretString)>, UserEnvError> {
        let stored = self.store.get(user, Some(agent)).await.map_err(|e| {
            tracing::error!(user, agent, error = %e, "cannot read the user's agent keys");
            UserEnvError::Unreadable
        })?;
        stored
            .into_iter()
            .map(|s| {
                let sealed = Sealed {
                    key_id: s.key_id,
                    nonce: s.nonce,
                    ciphertext: s.ciphertext,
                };
                match self.sealer.open(user, agent, &s.name, &sealed) {
                    Ok(value) => Ok((s.name, value)),
                    Err(e) => {
                        tracing::error!(user, agent, name = %s.name, error = %e, "cannot open a user's agent key");
                        Err(UserEnvError::Unusable {
                            name: s.name,
                            agent: agent.to_string(),
                            source: Box::new(e),
                        })
                    }
                }
            })
            .collect()
    }
}
