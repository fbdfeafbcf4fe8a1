//! Signing people in through the team's identity provider (OpenID Connect, `[oidc]`).
//!
//! - [`Oidc`] holds the provider as discovery describes it (fetched at start, again when a login
//!   needs it and it is older than [`REDISCOVER_AFTER`] or failed), the gateway's client there, and
//!   whether the provider is reachable (`/readyz` names `oidc: degraded` while it is not; signed-in
//!   people and the keys already held keep working).
//! - [`login`] is the browser's way in: `GET /auth/oidc/login` (authorization code with PKCE S256,
//!   `state` and `nonce` in a sealed short-lived cookie) and `GET /auth/oidc/callback` (the ID
//!   token verified by `openidconnect`: signature from the JWKS, `iss`, `aud`, `exp`, `nonce`,
//!   `azp`), ending with the gateway's own cookie, never the provider's tokens.
//! - [`recheck`] keeps a working day safe: every sign-in with a refresh token is checked again
//!   every `recheck_secs`; a person the provider no longer lets in is signed out and their
//!   WebSockets are closed with 1008, on every replica.
//! - Provider tokens on the API are [`crate::identity::auth::jwks`]'s.

mod identity;
pub mod login;
pub mod policy;
pub mod recheck;
mod userinfo;

use parking_lot::Mutex;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use openidconnect::IssuerUrl;
use openidconnect::core::CoreProviderMetadata;

use crate::identity::WebSessions;
use crate::identity::auth::jwks::Jwks;
use crate::infra::config::OidcConfig;
use crate::infra::sealing::Sealer;

pub use identity::BindError;
pub use policy::Policy;
pub use recheck::{Watched, is_live};

/// Discovery older than this is fetched again when a login needs it.
pub const REDISCOVER_AFTER: Duration = Duration::from_secs(300);
/// After a failed discovery, logins wait this long before the provider is asked again.
const RETRY_AFTER: Duration = Duration::from_secs(5);
/// Longest wait for the provider on any one request.
pub const PROVIDER_TIMEOUT: Duration = Duration::from_secs(10);

/// The provider as discovered.
#[derive(Clone)]
pub struct Discovered {
    /// Its metadata (endpoints, and the keys ID tokens are verified with).
    pub metadata: CoreProviderMetadata,
    /// Its RP-initiated sign-out endpoint, if it has one (not part of the core metadata).
    pub end_session_endpoint: Option<String>,
    /// When it was fetched.
    at: Instant,
}

/// The configured identity provider and this gateway's client there.
pub struct Oidc {
    /// The settings.
    pub cfg: OidcConfig,
    /// Who may sign in.
    pub policy: Policy,
    /// Groups whose members administer the gateway (`[admin].groups`).
    pub admin_groups: Vec<String>,
    /// For the provider: no redirects followed (the token endpoint must answer itself).
    pub http: reqwest::Client,
    /// Seals the login state cookie and the provider's tokens at rest.
    pub sealer: Sealer,
    /// Sign-ins and the WebSockets that ride on them.
    pub watched: Arc<Watched>,
    /// Where sign-ins and the accounts bound to user names are kept.
    pub store: WebSessions,
    discovered: tokio::sync::RwLock<Option<Discovered>>,
    /// One discovery at a time.
    discovering: tokio::sync::Mutex<()>,
    /// The last failure to reach the provider, while it lasts.
    failure: Mutex<Option<(Instant, String)>>,
    /// The provider's keys for tokens on the API (once its `jwks_uri` is known).
    api_keys: OnceLock<Arc<Jwks>>,
    /// `state` values already used (a replayed callback is refused), until they expire.
    pub(crate) used_states: Mutex<login::UsedStates>,
    /// Provider accounts bound to user names, as lately read from the store.
    bindings: identity::Bindings,
}

impl std::fmt::Debug for Oidc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Oidc")
            .field("issuer", &self.cfg.issuer)
            .finish_non_exhaustive()
    }
}

impl Oidc {
    /// The provider of `cfg` (not contacted yet: see [`Oidc::discover`]).
    pub fn new(
        cfg: OidcConfig,
        admin_groups: Vec<String>,
        sealer: Sealer,
        store: WebSessions,
    ) -> Result<Self, BuildError> {
        let http = provider_http()?;
        Ok(Self {
            policy: Policy::from_config(&cfg),
            admin_groups,
            cfg,
            http,
            sealer,
            watched: Arc::default(),
            store,
            discovered: tokio::sync::RwLock::new(None),
            discovering: tokio::sync::Mutex::new(()),
            failure: Mutex::new(None),
            api_keys: OnceLock::new(),
            used_states: Mutex::default(),
            bindings: identity::Bindings::default(),
        })
    }

    /// The name on the sign-in button.
    pub fn label(&self) -> String {
        self.cfg.label.clone().unwrap_or_else(|| {
            let issuer = self.cfg.issuer().unwrap_or_default();
            issuer
                .split("://")
                .nth(1)
                .and_then(|rest| rest.split('/').next())
                .unwrap_or(issuer)
                .to_string()
        })
    }

    /// The provider's metadata: what is held when fresh, else fetched now (`force`: fetched now
    /// unless it was a moment ago). While the provider cannot be reached, what is held is used
    /// if there is any.
    pub async fn provider(&self, force: bool) -> Result<Discovered, ProviderDown> {
        if let Some(d) = self.fresh(force).await {
            return Ok(d);
        }
        let _one = self.discovering.lock().await;
        if let Some(d) = self.fresh(force).await {
            return Ok(d);
        }
        if let Some((at, why)) = self.failure()
            && at.elapsed() < RETRY_AFTER
        {
            return self.discovered.read().await.clone().ok_or(ProviderDown(why));
        }
        match self.discover().await {
            Ok(d) => Ok(d),
            Err(e) => self.discovered.read().await.clone().ok_or(e),
        }
    }

    async fn fresh(&self, force: bool) -> Option<Discovered> {
        let held = self.discovered.read().await;
        let limit = if force {
            Duration::from_secs(2)
        } else {
            REDISCOVER_AFTER
        };
        held.as_ref().filter(|d| d.at.elapsed() < limit).cloned()
    }

    /// Fetches discovery (and the keys it names) now.
    pub async fn discover(&self) -> Result<Discovered, ProviderDown> {
        let issuer = self.cfg.issuer().unwrap_or_default().to_string();
        let url = IssuerUrl::new(issuer.clone()).map_err(|e| ProviderDown(format!("oidc.issuer {issuer:?}: {e}")))?;
        match CoreProviderMetadata::discover_async(url, &self.http).await {
            Ok(metadata) => {
                let end_session_endpoint = self.end_session_endpoint(&issuer).await;
                crate::infra::metrics::oidc_fetch("discovery", "ok");
                let jwks_uri = metadata.jwks_uri().url().to_string();
                let _ = self.api_keys.set(Arc::new(Jwks::new(
                    jwks_uri,
                    issuer,
                    self.cfg.audiences(),
                    Duration::from_secs(self.cfg.jwks_refetch_secs.max(1)),
                    self.http.clone(),
                )));
                let d = Discovered {
                    metadata,
                    end_session_endpoint,
                    at: Instant::now(),
                };
                *self.discovered.write().await = Some(d.clone());
                self.recovered();
                Ok(d)
            }
            Err(e) => {
                let why = format!("cannot read the discovery document of {issuer}: {}", error_chain(&e));
                self.failed("discovery", &why);
                Err(ProviderDown(why))
            }
        }
    }

    /// `end_session_endpoint` of the discovery document (read as JSON: `openidconnect`'s core
    /// metadata does not carry it).
    async fn end_session_endpoint(&self, issuer: &str) -> Option<String> {
        let url = format!("{}/.well-known/openid-configuration", issuer.trim_end_matches('/'));
        let doc: serde_json::Value = self.http.get(&url).send().await.ok()?.json().await.ok()?;
        doc.get("end_session_endpoint")?.as_str().map(String::from)
    }

    /// Records that the provider could not be reached (`what`: discovery, token, …).
    pub fn failed(&self, what: &'static str, why: &str) {
        crate::infra::metrics::oidc_fetch(what, "error");
        tracing::warn!(issuer = ?self.cfg.issuer, what, error = %why, "the identity provider cannot be reached");
        *self.failure.lock() = Some((Instant::now(), why.to_string()));
    }

    /// Records that the provider answered.
    pub fn recovered(&self) {
        let mut failure = self.failure.lock();
        if failure.take().is_some() {
            tracing::info!(issuer = ?self.cfg.issuer, "the identity provider answers again");
        }
    }

    pub(crate) fn failure(&self) -> Option<(Instant, String)> {
        self.failure.lock().clone()
    }

    /// Why the provider is degraded (for `/readyz`), if it is.
    pub async fn degraded(&self) -> Option<String> {
        if let Some((_, why)) = self.failure() {
            return Some(why);
        }
        if let Some(keys) = self.api_keys.get()
            && keys.is_failing().await
        {
            return Some(format!("cannot fetch the provider's keys from {}", keys.url()));
        }
        None
    }

    /// The provider's keys for tokens on the API, once discovery has named them.
    pub fn api_keys(&self) -> Option<Arc<Jwks>> {
        self.api_keys.get().cloned()
    }
}

/// The identity provider of `[oidc]`, and the keys of `jwt.jwks_url`, when configured.
#[allow(clippy::type_complexity, reason = "two optional parts, named at the call")]
pub fn build(
    config: &crate::infra::config::Config,
    auth: &crate::identity::auth::Authenticator,
    sealer: Sealer,
    store: &WebSessions,
) -> Result<(Option<Arc<Oidc>>, Option<Arc<Jwks>>), BuildError> {
    let oidc = if config.oidc.enabled() {
        auth.use_session_key(&sealer.derive("acp-gateway sign-in cookies v1"));
        if !auth.can_mint_sessions() {
            return Err(BuildError::NoSessionKey);
        }
        let oidc = Oidc::new(config.oidc.clone(), config.admin.groups.clone(), sealer, store.clone())?;
        Some(Arc::new(oidc))
    } else {
        None
    };
    let jwks = match &config.jwt.jwks_url {
        None => None,
        Some(url) => {
            let issuer = config
                .jwt
                .issuer
                .clone()
                .or_else(|| config.oidc.issuer().map(String::from))
                .unwrap_or_default();
            let audiences = match &config.jwt.audience {
                Some(aud) => vec![aud.clone()],
                None => config.oidc.audiences(),
            };
            // The provider's client where there is one; its own otherwise.
            let http = match &oidc {
                Some(o) => o.http.clone(),
                None => provider_http()?,
            };
            Some(Arc::new(Jwks::new(
                url.clone(),
                issuer,
                audiences,
                Duration::from_secs(config.oidc.jwks_refetch_secs.max(1)),
                http,
            )))
        }
    };
    Ok((oidc, jwks))
}

/// The HTTP client for an identity provider: no redirects followed (an endpoint must answer
/// itself), every request bounded by [`PROVIDER_TIMEOUT`].
fn provider_http() -> Result<reqwest::Client, BuildError> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(PROVIDER_TIMEOUT)
        .build()
        .map_err(BuildError::Http)
}

/// Why team sign-in cannot be set up; the message names the setting.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Only a public key verifies tokens here, so the gateway cannot sign its own cookie.
    #[error(
        "oidc: the gateway signs its own cookie after a sign-in, which needs an HS256 secret (jwt.secret / ACP_GATEWAY_JWT_SECRET, or none to generate one); jwt.public_key only verifies. Provider tokens are verified with the provider's keys (jwt.jwks_url or discovery) instead"
    )]
    NoSessionKey,
    /// The HTTP client could not be built (TLS roots).
    #[error("cannot build the HTTP client for the identity provider: {0}")]
    Http(#[source] reqwest::Error),
}

/// The identity provider cannot be reached or read now; says which endpoint and what failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ProviderDown(pub String);

/// An error and its sources, on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
