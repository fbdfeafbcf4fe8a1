//! Tokens from an identity provider, verified against the keys it publishes (its JWKS): what CLIs,
//! CI jobs and SDK clients send on `/acp` and `/api/*` when a team signs in with OpenID Connect.
//!
//! - Keys come from `jwks_uri` (discovery, or `ACP_GATEWAY_JWT_JWKS_URL`) and are kept as long as
//!   the provider's `Cache-Control: max-age` says, within [`MIN_TTL`]..[`MAX_TTL`].
//! - A token naming a `kid` we do not hold fetches the set again, at most once per
//!   [`Jwks::refetch_every`]: a flood of random `kid`s costs the provider one request per interval.
//! - Each key verifies one algorithm: the JWK's `alg`, else the one its type and curve imply
//!   (RSA: RS256, P-256: ES256, P-384: ES384, Ed25519: EdDSA). Symmetric (`oct`) keys are never
//!   used, so no token verifies as HMAC with a public key, and `none` never verifies.
//! - `iss` must be the issuer, `aud` one of the audiences (required), `exp` present and future.
//! - While the provider cannot be reached, the keys already held keep working (and the provider
//!   is reported degraded).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

/// Shortest time keys are kept, whatever the provider says.
pub const MIN_TTL: Duration = Duration::from_secs(1);
/// Longest time keys are kept before they are fetched again.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// Kept this long when the provider says nothing.
pub const DEFAULT_TTL: Duration = Duration::from_secs(300);
/// Largest key set read.
const MAX_JWKS_BYTES: usize = 256 * 1024;

/// One verifying key.
struct Key {
    decoding: DecodingKey,
    alg: Algorithm,
}

/// What is held of the provider's key set.
#[derive(Default)]
struct Held {
    keys: HashMap<String, Key>,
    /// Until when the keys are fresh.
    fresh_until: Option<Instant>,
    /// When the set was last asked for (successfully or not).
    last_fetch: Option<Instant>,
    /// Whether the last fetch failed.
    failing: bool,
}

/// Why a provider's token was refused.
#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    /// Its `kid` is not in the provider's set (even after looking again, or too soon to).
    #[error("token signed with an unknown key {0:?}")]
    UnknownKey(String),
    /// No `kid`, and the provider has more than one key.
    #[error("token names no key (kid) and the provider has several")]
    NoKeyId,
    /// The header's algorithm is not the one that key verifies.
    #[error("token algorithm {got:?} is not the key's {want:?}")]
    WrongAlgorithm { got: Algorithm, want: Algorithm },
    /// Signature, claims or format.
    #[error("invalid token: {0}")]
    Invalid(#[from] jsonwebtoken::errors::Error),
    /// The provider's keys cannot be had and none are held.
    #[error("the identity provider's keys cannot be fetched: {0}")]
    Unavailable(String),
}

impl JwksError {
    /// Why, as a metric label (`acp_gateway_auth_failures_total{reason}`).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::UnknownKey(_) | Self::NoKeyId => "unknown_key",
            Self::WrongAlgorithm { .. } => "wrong_algorithm",
            Self::Unavailable(_) => "provider_unavailable",
            Self::Invalid(e) => super::AuthError::Invalid(e.clone()).reason(),
        }
    }
}

/// A provider's key set, fetched and cached.
pub struct Jwks {
    url: String,
    issuer: String,
    audiences: Vec<String>,
    refetch_every: Duration,
    http: reqwest::Client,
    held: tokio::sync::RwLock<Held>,
    /// One fetch at a time; a token waiting for it then looks at what it brought.
    fetching: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Jwks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jwks").field("url", &self.url).finish_non_exhaustive()
    }
}

impl Jwks {
    /// Keys at `url` for tokens from `issuer` meant for one of `audiences`.
    pub fn new(
        url: String,
        issuer: String,
        audiences: Vec<String>,
        refetch_every: Duration,
        http: reqwest::Client,
    ) -> Self {
        Self {
            url,
            issuer,
            audiences,
            refetch_every,
            http,
            held: tokio::sync::RwLock::default(),
            fetching: tokio::sync::Mutex::new(()),
        }
    }

    /// Where the keys come from.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether the last attempt to fetch the keys failed.
    pub async fn is_failing(&self) -> bool {
        self.held.read().await.failing
    }

    /// Verifies `token` and returns its claims.
    pub async fn verify(&self, token: &str) -> Result<serde_json::Map<String, serde_json::Value>, JwksError> {
        let header = jsonwebtoken::decode_header(token)?;
        let kid = header.kid.clone();
        // Fresh keys first (fetched if stale); then, for an unknown kid, one more look if the
        // last one is old enough.
        let stale = self.held.read().await.fresh_until.is_none_or(|t| Instant::now() >= t);
        if stale {
            self.fetch(None).await;
        }
        if let Some(kid) = &kid
            && !self.held.read().await.keys.contains_key(kid)
        {
            self.fetch(Some(kid)).await;
        }
        let held = self.held.read().await;
        let key = match &kid {
            Some(kid) => held.keys.get(kid).ok_or_else(|| JwksError::UnknownKey(kid.clone()))?,
            None if held.keys.len() == 1 => held.keys.values().next().ok_or(JwksError::NoKeyId)?,
            None if held.keys.is_empty() && held.failing => {
                return Err(JwksError::Unavailable(self.url.clone()));
            }
            None => return Err(JwksError::NoKeyId),
        };
        if header.alg != key.alg {
            return Err(JwksError::WrongAlgorithm {
                got: header.alg,
                want: key.alg,
            });
        }
        let mut validation = Validation::new(key.alg);
        validation.algorithms = vec![key.alg];
        validation.leeway = 5;
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&self.audiences);
        let data =
            jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(token, &key.decoding, &validation)?;
        Ok(data.claims)
    }

    /// Fetches the set, unless another fetch brought what is needed meanwhile: for `unknown`,
    /// unless that kid arrived or the last fetch is more recent than [`Self::refetch_every`].
    async fn fetch(&self, unknown: Option<&str>) {
        let _one = self.fetching.lock().await;
        {
            let held = self.held.read().await;
            let recent = held.last_fetch.is_some_and(|t| t.elapsed() < self.refetch_every);
            match unknown {
                Some(kid) if held.keys.contains_key(kid) || recent => return,
                None if held.fresh_until.is_some_and(|t| Instant::now() < t) => return,
                // Stale, but the provider was asked a moment ago and failed: keep what is held.
                None if recent && held.failing => return,
                _ => {}
            }
        }
        self.fetch_now().await;
    }

    /// For `/readyz`: asks for the set unless it was asked within `every` or a fetch is under
    /// way, so that a provider gone (or back) shows without a token having to need its keys.
    /// Returns whether the last fetch failed.
    pub async fn probe(&self, every: Duration) -> bool {
        let due = self.held.read().await.last_fetch.is_none_or(|t| t.elapsed() >= every);
        if due && let Ok(_one) = self.fetching.try_lock() {
            self.fetch_now().await;
        }
        self.is_failing().await
    }

    /// Fetches the set now and holds what it brought (the caller holds `fetching`).
    async fn fetch_now(&self) {
        let started = Instant::now();
        let outcome = self.download().await;
        let mut held = self.held.write().await;
        held.last_fetch = Some(started);
        match outcome {
            Ok((keys, ttl)) => {
                crate::infra::metrics::oidc_fetch("jwks", "ok");
                tracing::debug!(url = %self.url, keys = keys.len(), ttl_secs = ttl.as_secs(), "identity provider keys fetched");
                held.keys = keys;
                held.fresh_until = Some(started + ttl);
                held.failing = false;
            }
            Err(e) => {
                crate::infra::metrics::oidc_fetch("jwks", "error");
                tracing::warn!(url = %self.url, error = %e, held = held.keys.len(), "cannot fetch the identity provider's keys; the keys held keep working");
                held.failing = true;
            }
        }
    }

    async fn download(&self) -> Result<(HashMap<String, Key>, Duration), FetchError> {
        let url = || self.url.clone();
        let response = self
            .http
            .get(&self.url)
            .send()
            .await
            .map_err(|source| FetchError::Request { url: url(), source })?;
        let status = response.status();
        if !status.is_success() {
            return Err(FetchError::Status { url: url(), status });
        }
        let ttl = response
            .headers()
            .get(reqwest::header::CACHE_CONTROL)
            .and_then(|v| v.to_str().ok())
            .and_then(max_age)
            .unwrap_or(DEFAULT_TTL)
            .clamp(MIN_TTL, MAX_TTL);
        let body = response
            .bytes()
            .await
            .map_err(|source| FetchError::Request { url: url(), source })?;
        if body.len() > MAX_JWKS_BYTES {
            return Err(FetchError::TooLarge { url: url() });
        }
        Ok((parse_keys(&body)?, ttl))
    }
}

/// Why the provider's key set could not be had.
#[derive(Debug, thiserror::Error)]
enum FetchError {
    /// No answer, or the answer broke off.
    #[error("GET {url}: {source}")]
    Request {
        /// The key set's URL.
        url: String,
        /// What the client said.
        source: reqwest::Error,
    },
    /// An answer other than success.
    #[error("GET {url}: HTTP {status}")]
    Status {
        /// The key set's URL.
        url: String,
        /// Its status.
        status: reqwest::StatusCode,
    },
    /// Larger than any key set.
    #[error("GET {url}: key set over {MAX_JWKS_BYTES} bytes")]
    TooLarge {
        /// The key set's URL.
        url: String,
    },
    /// Not a JWKS document.
    #[error("not a JWKS document: {0}")]
    NotJwks(#[from] serde_json::Error),
}

/// `max-age` of a `Cache-Control` value (`no-store`/`no-cache` mean as short as allowed).
fn max_age(value: &str) -> Option<Duration> {
    let mut age = None;
    for part in value.split(',').map(str::trim) {
        let lower = part.to_ascii_lowercase();
        if lower == "no-store" || lower == "no-cache" {
            return Some(MIN_TTL);
        }
        if let Some(n) = lower.strip_prefix("max-age=") {
            age = n.trim_matches('"').parse::<u64>().ok().map(Duration::from_secs);
        }
    }
    age
}

/// The signing keys of a JWKS document, by `kid` (keys without one are named by position).
/// A key that cannot be read, or is not for signatures, is skipped, not fatal.
fn parse_keys(body: &[u8]) -> Result<HashMap<String, Key>, FetchError> {
    #[derive(serde::Deserialize)]
    struct Set {
        keys: Vec<serde_json::Value>,
    }
    let set: Set = serde_json::from_slice(body)?;
    let mut keys = HashMap::new();
    for (i, value) in set.keys.into_iter().enumerate() {
        let Ok(jwk) = serde_json::from_value::<Jwk>(value) else {
            continue;
        };
        if matches!(jwk.common.public_key_use, Some(ref u) if *u != PublicKeyUse::Signature) {
            continue;
        }
        let Some(alg) = algorithm_of(&jwk) else { continue };
        let Ok(decoding) = DecodingKey::from_jwk(&jwk) else {
            continue;
        };
        let kid = jwk.common.key_id.clone().unwrap_or_else(|| format!("#{i}"));
        keys.insert(kid, Key { decoding, alg });
    }
    Ok(keys)
}

/// The one algorithm a published key verifies; `None` for symmetric keys and for an `alg` that
/// does not fit the key.
fn algorithm_of(jwk: &Jwk) -> Option<Algorithm> {
    let implied = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(p) => match p.curve {
            EllipticCurve::P256 => Algorithm::ES256,
            EllipticCurve::P384 => Algorithm::ES384,
            _ => return None,
        },
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => Algorithm::EdDSA,
        AlgorithmParameters::OctetKeyPair(_) | AlgorithmParameters::OctetKey(_) => return None,
    };
    let Some(stated) = jwk.common.key_algorithm else {
        return Some(implied);
    };
    let stated = match stated {
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::PS384 => Algorithm::PS384,
        KeyAlgorithm::PS512 => Algorithm::PS512,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        KeyAlgorithm::EdDSA => Algorithm::EdDSA,
        _ => return None,
    };
    let same_family = matches!(
        (implied, stated),
        (
            Algorithm::RS256,
            Algorithm::RS256
                | Algorithm::RS384
                | Algorithm::RS512
                | Algorithm::PS256
                | Algorithm::PS384
                | Algorithm::PS512
        )
    ) || implied == stated;
    same_family.then_some(stated)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_max_age() {
        assert_eq!(max_age("public, max-age=600"), Some(Duration::from_secs(600)));
        assert_eq!(max_age("no-store"), Some(MIN_TTL));
        assert_eq!(max_age("public"), None);
    }

    #[test]
    fn symmetric_and_misfit_keys_are_never_used() {
        let body = br#"{"keys":[
            {"kty":"oct","k":"c2VjcmV0","kid":"hmac","alg":"HS256"},
            {"kty":"EC","crv":"P-256","kid":"ec","alg":"RS256",
             "x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
            {"kty":"EC","crv":"P-256","kid":"ec-ok","use":"sig",
             "x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
            {"kty":"EC","crv":"P-256","kid":"enc","use":"enc",
             "x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
            {"kty":"weird","kid":"x"}
        ]}"#;
        let keys = parse_keys(body).expect("a set");
        let mut kids: Vec<&String> = keys.keys().collect();
        kids.sort();
        assert_eq!(kids, ["ec-ok"]);
        assert_eq!(keys["ec-ok"].alg, Algorithm::ES256);
    }
}
