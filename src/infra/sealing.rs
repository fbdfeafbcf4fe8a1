//! Sealing at rest: every secret the gateway keeps (users' agent keys, their MCP servers' and
//! push subscriptions' lists, the identity provider's tokens) is sealed with XChaCha20-Poly1305
//! (a random 192-bit nonce per value) under the gateway's secrets key, with what it belongs to as
//! associated data, so a sealed value moved to another row no longer opens. The key is
//! `ACP_GATEWAY_SECRETS_KEY` (32 bytes, base64) or one generated into the data directory (`0600`)
//! on first start; each stored value names the key it was sealed with (a short fingerprint), so a
//! gateway started with another key says so instead of handing an agent garbage. Keys for other
//! purposes (cursor signing, say) are derived from it, never the key itself.

use std::path::Path;

use base64::Engine as _;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};

/// The file the generated key is kept in, inside the data directory.
pub const KEY_FILE: &str = "secrets-key";

/// Why a key or a sealed value cannot be used. Never holds a value.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    /// `ACP_GATEWAY_SECRETS_KEY` or the key file is not 32 bytes of base64.
    #[error("{0}")]
    BadKey(String),
    /// The key file cannot be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        source: std::io::Error,
    },
    /// The value was sealed with another key than this gateway's.
    #[error(
        "it was stored under another secrets key (key id {stored}; this gateway's is {ours}): start the gateway with the ACP_GATEWAY_SECRETS_KEY it was stored with, or sign in again"
    )]
    OtherKey {
        /// The fingerprint stored with the value.
        stored: String,
        /// This gateway's.
        ours: String,
    },
    /// The value does not open under this key (altered, or moved to another row).
    #[error("it does not open under this gateway's secrets key (altered or moved); sign in again")]
    Corrupt,
}

/// A sealed value as it is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    /// Fingerprint of the key it was sealed with.
    pub key_id: String,
    /// The 24-byte nonce.
    pub nonce: Vec<u8>,
    /// Ciphertext and tag.
    pub ciphertext: Vec<u8>,
}

/// Seals and opens users' keys with the gateway's secrets key.
#[derive(Clone)]
pub struct Sealer {
    /// The AEAD, keyed.
    cipher: XChaCha20Poly1305,
    /// The key's fingerprint (hex of the first 8 bytes of a SHA-256 over it).
    key_id: String,
    /// What [`Sealer::derive`] derives keys from (itself derived from the key, never the key).
    derive_root: [u8; 32],
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

impl Sealer {
    /// The configured key, else the one kept in `data_dir` (generated, `0600`, on first use).
    pub fn from_config(configured: Option<&SecretString>, data_dir: &Path) -> Result<Self, SecretsError> {
        let key = match configured {
            Some(key) => decode_key(key.expose_secret(), "ACP_GATEWAY_SECRETS_KEY")?,
            None => kept_key(data_dir)?,
        };
        Ok(Self::new(&key))
    }

    /// A sealer for `key`.
    pub fn new(key: &[u8; 32]) -> Self {
        let mut id = Sha256::new();
        id.update(b"acp-gateway secrets key id\0");
        id.update(key);
        let id = id.finalize();
        Self {
            cipher: XChaCha20Poly1305::new(key.into()),
            key_id: id[..8].iter().map(|b| format!("{b:02x}")).collect(),
            derive_root: hmac_sha256(key, b"acp-gateway derived keys v1"),
        }
    }

    /// A 32-byte key for `purpose`, derived from the secrets key (HMAC-SHA256): the same on every
    /// replica that shares the secrets key, useless for anything else.
    pub fn derive(&self, purpose: &str) -> [u8; 32] {
        hmac_sha256(&self.derive_root, purpose.as_bytes())
    }

    /// This key's fingerprint.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// Seals `value` for `owner`'s `agent` variable `name`.
    pub fn seal(&self, owner: &str, agent: &str, name: &str, value: &str) -> Sealed {
        let nonce: [u8; 24] = rand::random();
        let aad = associated(owner, agent, name);
        let ciphertext = self
            .cipher
            .encrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: value.as_bytes(),
                    aad: &aad,
                },
            )
            // Encryption fails only for messages beyond 256 GiB.
            .unwrap_or_default();
        Sealed {
            key_id: self.key_id.clone(),
            nonce: nonce.to_vec(),
            ciphertext,
        }
    }

    /// Opens what [`Sealer::seal`] made for the same owner, agent and name.
    pub fn open(&self, owner: &str, agent: &str, name: &str, sealed: &Sealed) -> Result<SecretString, SecretsError> {
        if sealed.key_id != self.key_id {
            return Err(SecretsError::OtherKey {
                stored: sealed.key_id.clone(),
                ours: self.key_id.clone(),
            });
        }
        let nonce = <[u8; 24]>::try_from(sealed.nonce.as_slice()).map_err(|_| SecretsError::Corrupt)?;
        let aad = associated(owner, agent, name);
        let plain = self
            .cipher
            .decrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: &sealed.ciphertext,
                    aad: &aad,
                },
            )
            .map_err(|_| SecretsError::Corrupt)?;
        String::from_utf8(plain)
            .map(SecretString::from)
            .map_err(|_| SecretsError::Corrupt)
    }
}

fn hmac_sha256(key: &[u8], data: &[u8]) -> [u8; 32] {
    use hmac::{Hmac, Mac};
    let Ok(mut mac) = <Hmac<Sha256> as Mac>::new_from_slice(key) else {
        unreachable!("HMAC takes keys of any length")
    };
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// What a sealed value is bound to.
fn associated(owner: &str, agent: &str, name: &str) -> Vec<u8> {
    format!("acp-gateway user secret\0{owner}\0{agent}\0{name}").into_bytes()
}

/// 32 bytes from base64 (standard or URL-safe, padded or not); the error names `setting`.
fn decode_key(text: &str, setting: &str) -> Result<[u8; 32], SecretsError> {
    let text = text.trim();
    let engines = [
        base64::engine::general_purpose::STANDARD,
        base64::engine::general_purpose::STANDARD_NO_PAD,
        base64::engine::general_purpose::URL_SAFE,
        base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ];
    engines
        .iter()
        .find_map(|e| e.decode(text).ok())
        .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
        .ok_or_else(|| {
            SecretsError::BadKey(format!(
                "{setting} must be 32 bytes in base64 (for example the output of `openssl rand -base64 32`)"
            ))
        })
}

/// The key kept in `data_dir`, made on first use.
fn kept_key(data_dir: &Path) -> Result<[u8; 32], SecretsError> {
    let path = data_dir.join(KEY_FILE);
    let io = |source| SecretsError::Io {
        path: path.display().to_string(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            crate::infra::files::private_file(&path).map_err(io)?;
            return decode_key(&text, &path.display().to_string());
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    crate::infra::files::private_dir(data_dir).map_err(io)?;
    let key: [u8; 32] = rand::random();
    let text = base64::engine::general_purpose::STANDARD.encode(key);
    crate::infra::files::write_new_private(&path, text.as_bytes()).map_err(io)?;
    tracing::info!(file = %path.display(), "generated the key users' agent keys are sealed with (replicas must share one: set ACP_GATEWAY_SECRETS_KEY)");
    Ok(key)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_value_opens_only_for_its_owner_agent_and_name_under_its_key() {
        let sealer = Sealer::new(&[7; 32]);
        let sealed = sealer.seal("alice", "codex", "OPENAI_API_KEY", "sk-test-1");
        assert!(!sealed.ciphertext.windows(9).any(|w| w == b"sk-test-1"));
        let open = sealer.open("alice", "codex", "OPENAI_API_KEY", &sealed).expect("opens");
        assert_eq!(open.expose_secret(), "sk-test-1");
        for (owner, agent, name) in [
            ("bob", "codex", "OPENAI_API_KEY"),
            ("alice", "claude", "OPENAI_API_KEY"),
            ("alice", "codex", "CODEX_API_KEY"),
        ] {
            assert!(matches!(
                sealer.open(owner, agent, name, &sealed),
                Err(SecretsError::Corrupt)
            ));
        }
        let mut altered = sealed.clone();
        altered.ciphertext[0] ^= 1;
        assert!(matches!(
            sealer.open("alice", "codex", "OPENAI_API_KEY", &altered),
            Err(SecretsError::Corrupt)
        ));
        let other = Sealer::new(&[8; 32]);
        let err = other
            .open("alice", "codex", "OPENAI_API_KEY", &sealed)
            .expect_err("other key");
        assert!(err.to_string().contains(sealer.key_id()) && err.to_string().contains("ACP_GATEWAY_SECRETS_KEY"));
    }

    #[test]
    fn the_key_is_configured_or_kept_private_in_the_data_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = Sealer::from_config(None, dir.path()).expect("generated");
        let mode = std::fs::metadata(dir.path().join(KEY_FILE))
            .expect("kept")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = Sealer::from_config(None, dir.path()).expect("read back");
        assert_eq!(first.key_id(), again.key_id());
        let configured = SecretString::from(base64::engine::general_purpose::STANDARD.encode([1u8; 32]));
        let set = Sealer::from_config(Some(&configured), dir.path()).expect("configured");
        assert_ne!(set.key_id(), first.key_id());
        let err = Sealer::from_config(Some(&SecretString::from("short")), dir.path()).expect_err("too short");
        assert!(err.to_string().contains("ACP_GATEWAY_SECRETS_KEY"), "{err}");
    }
}
