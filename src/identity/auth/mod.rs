//! Who is calling: JWT verification and minting, and the one-time login codes (`codes`). Where a
//! request's token comes from is HTTP's business (`http::auth`).
//!
//! The configured key pins the algorithm: an HS256 secret accepts only HS256 tokens, a PEM public
//! key only its own family (RS256, ES256 or EdDSA). `alg: none`, a token signed with another
//! algorithm, or an HS256 token forged with the public key as its secret are all refused.
//! `exp` and `sub` are required, `nbf` honoured, `iss`/`aud` checked when configured.
//!
//! What a key must be: an HS256 secret has at least [`MIN_SECRET_BYTES`] bytes (a shorter one can be
//! brute-forced offline from any token), and a public key comes with a required audience (an
//! identity provider's key also signs tokens for its other applications).

pub(crate) mod codes;
pub mod jwks;

pub use codes::LoginCodes;

use std::path::Path;

use base64::Engine;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

use crate::infra::clock::now_secs;
use crate::infra::config::JwtConfig;

/// Name of the file in the data directory that holds the generated secret.
const GENERATED_SECRET_FILE: &str = "jwt-secret";

/// Shortest HS256 secret accepted, in bytes (RFC 7518 §3.2: at least the hash size).
pub const MIN_SECRET_BYTES: usize = 32;

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The token's `sub`: the user every session belongs to.
    pub user: String,
    /// The token's `exp`, in seconds since the epoch; a connection is closed when it passes.
    pub expires_at: u64,
    /// For a sign-in through the identity provider: its id (`sid`), which ends when the person
    /// signs out or the provider no longer lets them in.
    pub session: Option<String>,
    /// Whether the token says its user is in an admin group (`[admin].groups`).
    pub admin: bool,
}

/// Why a token was refused. Callers answer every variant the same way (`401`); the variant is
/// for the log.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The token failed verification.
    #[error("invalid token: {0}")]
    Invalid(#[from] jsonwebtoken::errors::Error),
    /// `sub` was empty.
    #[error("token has an empty sub")]
    EmptySubject,
}

impl AuthError {
    /// Why, as a metric label (`acp_gateway_auth_failures_total{reason}`).
    pub fn reason(&self) -> &'static str {
        use jsonwebtoken::errors::ErrorKind;
        match self {
            Self::EmptySubject => "invalid",
            Self::Invalid(e) => match e.kind() {
                ErrorKind::ExpiredSignature => "expired",
                ErrorKind::ImmatureSignature => "not_yet_valid",
                ErrorKind::InvalidAudience => "wrong_audience",
                ErrorKind::InvalidIssuer => "wrong_issuer",
                ErrorKind::MissingRequiredClaim(_) => "missing_claim",
                ErrorKind::InvalidSignature | ErrorKind::InvalidAlgorithm => "bad_signature",
                ErrorKind::InvalidToken
                | ErrorKind::InvalidClaimFormat(_)
                | ErrorKind::Base64(_)
                | ErrorKind::Json(_)
                | ErrorKind::Utf8(_) => "malformed",
                _ => "invalid",
            },
        }
    }
}

/// A key could not be set up from the configuration.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Reading or writing a key file failed.
    #[error("{path}: {source}")]
    Io {
        /// The configured public key or the generated secret, named in the message.
        path: String,
        source: std::io::Error,
    },
    /// The PEM is not an RSA, EC (P-256) or Ed25519 public key.
    #[error("{0}: not an RSA, EC P-256 or Ed25519 public key in PEM form")]
    BadPem(String),
    /// The HS256 secret is too short to resist an offline guess.
    #[error(
        "jwt.secret (ACP_GATEWAY_JWT_SECRET) is {0} bytes long; an HS256 secret must have at least {MIN_SECRET_BYTES} bytes (for example `openssl rand -base64 32`)"
    )]
    WeakSecret(usize),
    /// A public key without a required audience would accept tokens minted for other applications.
    #[error(
        "jwt.audience (ACP_GATEWAY_JWT_AUDIENCE) is required with jwt.public_key (ACP_GATEWAY_JWT_PUBLIC_KEY): without it, tokens your identity provider issued for other applications would be accepted"
    )]
    AudienceRequired,
    /// Minting needs the HS256 secret.
    #[error("this gateway verifies tokens with a public key; mint tokens with your identity provider")]
    CannotMint,
    /// Encoding failed.
    #[error("cannot sign token: {0}")]
    Sign(#[from] jsonwebtoken::errors::Error),
}

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    iat: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    iss: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    aud: Option<serde_json::Value>,
    /// The gateway's own: the sign-in through the identity provider this cookie belongs to.
    #[serde(default, rename = "acp_sid", skip_serializing_if = "Option::is_none")]
    sid: Option<String>,
    /// The gateway's own: set on the cookie of an admin's sign-in through the identity provider.
    #[serde(default, rename = "acp_adm", skip_serializing_if = "std::ops::Not::not")]
    adm: bool,
}

/// Verifies tokens (and, with an HS256 secret, mints them).
pub struct Authenticator {
    /// The key tokens must be signed with.
    decoding: DecodingKey,
    /// Pinned algorithm and claim rules.
    validation: Validation,
    /// Present only with an HS256 secret.
    encoding: Option<EncodingKey>,
    /// `iss` of minted tokens: the configured issuer, so our own tokens pass our own check.
    issuer: Option<String>,
    /// `aud` of minted tokens, for the same reason.
    audience: Option<String>,
    /// With a PEM key (which only verifies): the HS256 key the gateway signs and checks the
    /// cookies of sign-ins through its identity provider with (derived from the secrets key, so
    /// replicas share it). Only tokens with a sign-in (`acp_sid`) are accepted under it.
    session_key: std::sync::OnceLock<(DecodingKey, EncodingKey, Validation)>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("algorithms", &self.validation.algorithms)
            .finish_non_exhaustive()
    }
}

/// Checks what the configuration alone can tell: a long enough secret, an audience with a public
/// key. [`Authenticator::from_config`] runs it too (and checks a generated secret the same way).
pub(crate) fn check_config(cfg: &JwtConfig) -> Result<(), KeyError> {
    if let Some(secret) = &cfg.secret {
        check_secret(secret)?;
    }
    if cfg.public_key.is_some() && cfg.audience.as_deref().is_none_or(|a| a.trim().is_empty()) {
        return Err(KeyError::AudienceRequired);
    }
    Ok(())
}

fn check_secret(secret: &SecretString) -> Result<(), KeyError> {
    let len = secret.expose_secret().len();
    if len < MIN_SECRET_BYTES {
        return Err(KeyError::WeakSecret(len));
    }
    Ok(())
}

impl Authenticator {
    /// Builds the verifier from the configuration; with no key at all, generates (once) and reuses
    /// a secret in `data_dir`.
    pub fn from_config(cfg: &JwtConfig, data_dir: &Path) -> Result<Self, KeyError> {
        check_config(cfg)?;
        let (decoding, encoding, alg) = if let Some(path) = &cfg.public_key {
            let pem = std::fs::read(path).map_err(|source| KeyError::Io {
                path: path.display().to_string(),
                source,
            })?;
            let (key, alg) = public_key(&pem).ok_or_else(|| KeyError::BadPem(path.display().to_string()))?;
            (key, None, alg)
        } else {
            let secret = match &cfg.secret {
                Some(s) => s.clone(),
                None => generated_secret(data_dir)?,
            };
            check_secret(&secret)?;
            let bytes = secret.expose_secret().as_bytes();
            (
                DecodingKey::from_secret(bytes),
                Some(EncodingKey::from_secret(bytes)),
                Algorithm::HS256,
            )
        };
        let mut validation = Validation::new(alg);
        validation.algorithms = vec![alg];
        validation.leeway = 5;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        let mut required = vec!["exp", "sub"];
        required.extend(cfg.issuer.as_ref().map(|_| "iss"));
        required.extend(cfg.audience.as_ref().map(|_| "aud"));
        validation.set_required_spec_claims(&required);
        match &cfg.issuer {
            Some(iss) => validation.set_issuer(&[iss]),
            None => validation.iss = None,
        }
        match &cfg.audience {
            Some(aud) => validation.set_audience(&[aud]),
            None => validation.validate_aud = false,
        }
        Ok(Self {
            decoding,
            validation,
            encoding,
            issuer: cfg.issuer.clone(),
            audience: cfg.audience.clone(),
            session_key: std::sync::OnceLock::new(),
        })
    }

    /// With a PEM key: the key sign-in cookies are signed with (no effect with an HS256 secret,
    /// which signs them itself).
    pub fn use_session_key(&self, key: &[u8; 32]) {
        if self.encoding.is_some() {
            return;
        }
        let mut validation = self.validation.clone();
        validation.algorithms = vec![Algorithm::HS256];
        let _ = self
            .session_key
            .set((DecodingKey::from_secret(key), EncodingKey::from_secret(key), validation));
    }

    /// Whether this gateway can sign the cookie of a sign-in through its identity provider.
    pub fn can_mint_sessions(&self) -> bool {
        self.encoding.is_some() || self.session_key.get().is_some()
    }

    /// Verifies a token and returns its caller.
    pub fn verify(&self, token: &str) -> Result<Identity, AuthError> {
        let data = match jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation) {
            Ok(data) => data,
            Err(e) => return self.verify_session_cookie(token).ok_or(AuthError::Invalid(e)),
        };
        if data.claims.sub.trim().is_empty() {
            return Err(AuthError::EmptySubject);
        }
        Ok(Identity {
            user: data.claims.sub,
            expires_at: data.claims.exp,
            // Only tokens the gateway signed itself (its HS256 key) carry its own claims; a
            // provider's token verified with a PEM key never does, whatever it says.
            session: data.claims.sid.filter(|_| self.encoding.is_some()),
            admin: data.claims.adm && self.encoding.is_some(),
        })
    }

    /// A sign-in cookie under the session key (PEM deployments), if `token` is one.
    fn verify_session_cookie(&self, token: &str) -> Option<Identity> {
        let (decoding, _, validation) = self.session_key.get()?;
        let data = jsonwebtoken::decode::<Claims>(token, decoding, validation).ok()?;
        let sid = data.claims.sid.filter(|_| !data.claims.sub.trim().is_empty())?;
        Some(Identity {
            user: data.claims.sub,
            expires_at: data.claims.exp,
            session: Some(sid),
            admin: data.claims.adm,
        })
    }

    /// Whether this gateway can mint tokens (it verifies with an HS256 secret).
    pub fn can_mint(&self) -> bool {
        self.encoding.is_some()
    }

    /// Mints an HS256 token for `sub`, valid for `ttl_secs`.
    pub fn mint(&self, sub: &str, ttl_secs: u64) -> Result<String, KeyError> {
        self.mint_claims(sub, ttl_secs, None, false)
    }

    /// Mints the cookie of a sign-in through the identity provider: valid while its `sid` is;
    /// `admin` when the provider put the user in an admin group.
    pub fn mint_session(&self, sub: &str, ttl_secs: u64, sid: &str, admin: bool) -> Result<String, KeyError> {
        self.mint_claims(sub, ttl_secs, Some(sid.to_string()), admin)
    }

    fn mint_claims(&self, sub: &str, ttl_secs: u64, sid: Option<String>, adm: bool) -> Result<String, KeyError> {
        let session_key = sid.as_ref().and_then(|_| self.session_key.get()).map(|(_, e, _)| e);
        let key = self.encoding.as_ref().or(session_key).ok_or(KeyError::CannotMint)?;
        let now = now_secs();
        let claims = Claims {
            sub: sub.to_string(),
            exp: now + ttl_secs,
            iat: Some(now),
            iss: self.issuer.clone(),
            aud: self.audience.clone().map(serde_json::Value::String),
            sid,
            adm,
        };
        Ok(jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, key)?)
    }
}

/// Reads a PEM public key and the one algorithm it may verify.
fn public_key(pem: &[u8]) -> Option<(DecodingKey, Algorithm)> {
    let text = std::str::from_utf8(pem).ok()?;
    if text.contains("PRIVATE KEY") {
        return None;
    }
    if let Ok(k) = DecodingKey::from_ed_pem(pem)
        && key_family(text) == Some("ed")
    {
        return Some((k, Algorithm::EdDSA));
    }
    if key_family(text) == Some("ec") {
        return DecodingKey::from_ec_pem(pem).ok().map(|k| (k, Algorithm::ES256));
    }
    DecodingKey::from_rsa_pem(pem).ok().map(|k| (k, Algorithm::RS256))
}

/// Looks at the SubjectPublicKeyInfo algorithm OID to tell key families apart.
fn key_family(pem_text: &str) -> Option<&'static str> {
    let body: String = pem_text.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = base64::engine::general_purpose::STANDARD.decode(body.trim()).ok()?;
    const ED25519: &[u8] = &[0x06, 0x03, 0x2b, 0x65, 0x70];
    const EC_PUBLIC_KEY: &[u8] = &[0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
    let has = |needle: &[u8]| der.windows(needle.len()).any(|w| w == needle);
    if has(ED25519) {
        Some("ed")
    } else if has(EC_PUBLIC_KEY) {
        Some("ec")
    } else {
        Some("rsa")
    }
}

/// Loads the secret kept in `data_dir`, creating it (mode 0600, in a 0700 directory) on first use.
/// A kept secret that other users could read is made private again, with a warning.
fn generated_secret(data_dir: &Path) -> Result<SecretString, KeyError> {
    let path = data_dir.join(GENERATED_SECRET_FILE);
    let io = |source| KeyError::Io {
        path: path.display().to_string(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(s) if !s.trim().is_empty() => {
            crate::infra::files::private_file(&path).map_err(io)?;
            return Ok(SecretString::from(s.trim().to_string()));
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    crate::infra::files::private_dir(data_dir).map_err(io)?;
    let bytes: [u8; 32] = rand::random();
    let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    crate::infra::files::write_new_private(&path, secret.as_bytes()).map_err(io)?;
    Ok(SecretString::from(secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hs(secret: &str) -> Authenticator {
        let cfg = JwtConfig {
            secret: Some(SecretString::from(secret.to_string())),
            ..Default::default()
        };
        Authenticator::from_config(&cfg, Path::new("/nonexistent")).expect("hs256")
    }

    /// A secret long enough to be accepted.
    const K: &str = "k-0123456789abcdefghijklmnopqrstuvwxyz";

    fn forge(claims: serde_json::Value, alg: Algorithm, secret: &[u8]) -> String {
        jsonwebtoken::encode(&Header::new(alg), &claims, &EncodingKey::from_secret(secret)).expect("encode")
    }

    #[test]
    fn mints_and_verifies() {
        let a = hs("s3cret-0123456789abcdefghijklmnopqrstuvwxyz");
        let t = a.mint("alice", 60).expect("mint");
        assert_eq!(a.verify(&t).expect("valid").user, "alice");
        assert!(
            hs("other-0123456789abcdefghijklmnopqrstuvwxyz").verify(&t).is_err(),
            "another secret refuses it"
        );
    }

    #[test]
    fn refuses_expired_missing_exp_future_nbf_and_other_algs() {
        let a = hs(K);
        let now = now_secs();
        assert!(
            a.verify(&forge(
                serde_json::json!({"sub":"a","exp":now - 100}),
                Algorithm::HS256,
                K.as_bytes()
            ))
            .is_err()
        );
        assert!(
            a.verify(&forge(serde_json::json!({"sub":"a"}), Algorithm::HS256, K.as_bytes()))
                .is_err()
        );
        assert!(
            a.verify(&forge(
                serde_json::json!({"sub":"a","exp":now+100,"nbf":now+100}),
                Algorithm::HS256,
                K.as_bytes()
            ))
            .is_err()
        );
        assert!(
            a.verify(&forge(
                serde_json::json!({"sub":"a","exp":now+100}),
                Algorithm::HS384,
                K.as_bytes()
            ))
            .is_err()
        );
        assert!(
            a.verify(&forge(
                serde_json::json!({"sub":"","exp":now+100}),
                Algorithm::HS256,
                K.as_bytes()
            ))
            .is_err()
        );
        // alg: none
        let b64 = |v: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        let none = format!(
            "{}.{}.",
            b64(r#"{"alg":"none","typ":"JWT"}"#),
            b64(&format!(r#"{{"sub":"a","exp":{}}}"#, now + 100))
        );
        assert!(a.verify(&none).is_err());
    }

    #[test]
    fn issuer_and_audience_are_enforced_when_set() {
        let cfg = JwtConfig {
            secret: Some(SecretString::from(K.to_string())),
            issuer: Some("me".into()),
            audience: Some("gw".into()),
            ..Default::default()
        };
        let a = Authenticator::from_config(&cfg, Path::new("/nonexistent")).expect("cfg");
        let now = now_secs() + 100;
        assert!(a.verify(&a.mint("u", 60).expect("mint")).is_ok());
        assert!(
            a.verify(&forge(
                serde_json::json!({"sub":"u","exp":now,"iss":"me"}),
                Algorithm::HS256,
                K.as_bytes()
            ))
            .is_err()
        );
        assert!(
            a.verify(&forge(
                serde_json::json!({"sub":"u","exp":now,"aud":"gw"}),
                Algorithm::HS256,
                K.as_bytes()
            ))
            .is_err()
        );
        assert!(
            a.verify(&forge(
                serde_json::json!({"sub":"u","exp":now,"iss":"x","aud":"gw"}),
                Algorithm::HS256,
                K.as_bytes()
            ))
            .is_err()
        );
    }

    #[test]
    fn short_secrets_and_public_keys_without_audience_are_refused() {
        let short = JwtConfig {
            secret: Some(SecretString::from("x".repeat(MIN_SECRET_BYTES - 1))),
            ..Default::default()
        };
        let err = Authenticator::from_config(&short, Path::new("/nonexistent")).expect_err("short");
        assert!(err.to_string().contains("31 bytes"), "{err}");
        let keyed = JwtConfig {
            public_key: Some("/nonexistent.pem".into()),
            ..Default::default()
        };
        let err = Authenticator::from_config(&keyed, Path::new("/nonexistent")).expect_err("no audience");
        assert!(matches!(err, KeyError::AudienceRequired), "{err}");
    }

    #[test]
    fn generated_secret_is_private_and_kept() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).expect("exists").permissions().mode() & 0o777;
        let dir = tempfile::tempdir().expect("tmp");
        let data = dir.path().join("data");
        let a = Authenticator::from_config(&JwtConfig::default(), &data).expect("gen");
        assert_eq!(mode(&data), 0o700);
        assert_eq!(mode(&data.join(GENERATED_SECRET_FILE)), 0o600);
        std::fs::set_permissions(data.join(GENERATED_SECRET_FILE), std::fs::Permissions::from_mode(0o644))
            .expect("chmod");
        let t = a.mint("local", 60).expect("mint");
        let b = Authenticator::from_config(&JwtConfig::default(), &data).expect("reuse");
        assert_eq!(b.verify(&t).expect("same secret").user, "local");
        assert_eq!(mode(&data.join(GENERATED_SECRET_FILE)), 0o600, "made private again");
    }
}
