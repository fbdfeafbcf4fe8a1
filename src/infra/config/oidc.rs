//! `[oidc]`: a team signs in through its identity provider (OpenID Connect), and programs use the
//! provider's tokens on the API. Off unless `issuer` and `client_id` are set.

use secrecy::SecretString;
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// OpenID Connect settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OidcConfig {
    /// The provider's issuer URL (discovery is at `{issuer}/.well-known/openid-configuration`).
    pub issuer: Option<String>,
    /// This gateway's client id at the provider.
    pub client_id: Option<String>,
    /// Its client secret; none for a public client (PKCE alone).
    #[serde(serialize_with = "super::never_serialize_secret")]
    pub client_secret: Option<SecretString>,
    /// Where the provider sends the browser back: `https://HOST/auth/oidc/callback`.
    pub redirect_url: Option<String>,
    /// The provider's name on the sign-in button ("Sign in with …").
    pub label: Option<String>,
    /// Scopes asked for (`openid` is always asked).
    pub scopes: Vec<String>,
    /// The claim that names the user (`sub`, or `email`/`preferred_username` for readable names).
    pub user_claim: String,
    /// The claim that lists the user's groups.
    pub groups_claim: String,
    /// When not empty, only members of one of these groups get in.
    pub allowed_groups: Vec<String>,
    /// When not empty, only verified e-mail addresses in one of these domains get in.
    pub allowed_domains: Vec<String>,
    /// Lifetime of the gateway's cookie after a sign-in.
    pub session_ttl_secs: u64,
    /// How often a signed-in user is checked again with the provider (refresh token), so that one
    /// removed from the allowed groups loses access.
    pub recheck_secs: u64,
    /// The `aud` a provider token on the API must carry (default: the client id).
    pub api_audiences: Vec<String>,
    /// How soon a token naming an unknown key may fetch the provider's keys again.
    pub jwks_refetch_secs: u64,
    /// Users of the gateway's own tokens (`acp-gateway token --sub`, the login link): names a
    /// provider account never gets, whatever its claims say.
    pub local_users: Vec<String>,
    /// Callbacks remembered (10 minutes each) so that a replayed one is refused; past it the
    /// oldest is forgotten (its code is spent at the provider anyway).
    pub used_states_max: usize,
}

impl Default for OidcConfig {
    fn default() -> Self {
        Self {
            issuer: None,
            client_id: None,
            client_secret: None,
            redirect_url: None,
            label: None,
            scopes: ["openid", "profile", "email"].map(String::from).to_vec(),
            user_claim: String::from("sub"),
            groups_claim: String::from("groups"),
            allowed_groups: Vec::new(),
            allowed_domains: Vec::new(),
            session_ttl_secs: 12 * 3600,
            recheck_secs: 900,
            api_audiences: Vec::new(),
            jwks_refetch_secs: 60,
            local_users: vec![String::from("local")],
            used_states_max: 50_000,
        }
    }
}

/// Environment variables of `[oidc]` that set a string.
pub(super) const ENV_KEYS: &[(&str, &str)] = &[
    ("ACP_GATEWAY_OIDC_ISSUER", "oidc.issuer"),
    ("ACP_GATEWAY_OIDC_CLIENT_ID", "oidc.client_id"),
    ("ACP_GATEWAY_OIDC_CLIENT_SECRET", "oidc.client_secret"),
    ("ACP_GATEWAY_OIDC_REDIRECT_URL", "oidc.redirect_url"),
    ("ACP_GATEWAY_OIDC_LABEL", "oidc.label"),
    ("ACP_GATEWAY_OIDC_USER_CLAIM", "oidc.user_claim"),
    ("ACP_GATEWAY_OIDC_GROUPS_CLAIM", "oidc.groups_claim"),
];

/// Environment variables of `[oidc]` that set a comma-separated list.
pub(super) const ENV_LISTS: &[(&str, &str)] = &[
    ("ACP_GATEWAY_OIDC_SCOPES", "oidc.scopes"),
    ("ACP_GATEWAY_OIDC_ALLOWED_GROUPS", "oidc.allowed_groups"),
    ("ACP_GATEWAY_OIDC_ALLOWED_DOMAINS", "oidc.allowed_domains"),
    ("ACP_GATEWAY_OIDC_API_AUDIENCES", "oidc.api_audiences"),
    ("ACP_GATEWAY_OIDC_LOCAL_USERS", "oidc.local_users"),
];

/// Environment variables of `[oidc]` that set a number.
pub(super) const ENV_NUMBERS: &[(&str, &str)] = &[
    ("ACP_GATEWAY_OIDC_SESSION_TTL_SECS", "oidc.session_ttl_secs"),
    ("ACP_GATEWAY_OIDC_RECHECK_SECS", "oidc.recheck_secs"),
    ("ACP_GATEWAY_OIDC_JWKS_REFETCH_SECS", "oidc.jwks_refetch_secs"),
    ("ACP_GATEWAY_OIDC_USED_STATES_MAX", "oidc.used_states_max"),
];

impl OidcConfig {
    /// Whether sign-in through a provider is configured.
    pub fn enabled(&self) -> bool {
        self.issuer.is_some() && self.client_id.is_some()
    }

    /// The issuer exactly as configured: providers compare it to their `iss` letter for letter,
    /// and some end it in `/` (Auth0's `https://TENANT.auth0.com/`), others not.
    pub fn issuer(&self) -> Option<&str> {
        self.issuer.as_deref()
    }

    /// The audiences a provider token on the API may carry.
    pub fn audiences(&self) -> Vec<String> {
        if self.api_audiences.is_empty() {
            self.client_id.iter().cloned().collect()
        } else {
            self.api_audiences.clone()
        }
    }

    /// Checks what the settings alone can tell.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        if self.issuer.is_some() != self.client_id.is_some() {
            return invalid(
                "oidc: set both issuer (ACP_GATEWAY_OIDC_ISSUER) and client_id (ACP_GATEWAY_OIDC_CLIENT_ID), or neither".into(),
            );
        }
        if !self.enabled() {
            return Ok(());
        }
        let issuer = self.issuer.as_deref().unwrap_or_default();
        if !(issuer.starts_with("https://") || is_loopback_http(issuer)) {
            return invalid(format!(
                "oidc.issuer (ACP_GATEWAY_OIDC_ISSUER) {issuer:?}: must be an https:// URL (plain http only on loopback)"
            ));
        }
        match self.redirect_url.as_deref() {
            None => {
                return invalid(
                    "oidc.redirect_url (ACP_GATEWAY_OIDC_REDIRECT_URL): required, e.g. https://gateway.example.com/auth/oidc/callback".into(),
                );
            }
            Some(url) if !url.ends_with("/auth/oidc/callback") => {
                return invalid(format!(
                    "oidc.redirect_url (ACP_GATEWAY_OIDC_REDIRECT_URL) {url:?}: must end with /auth/oidc/callback"
                ));
            }
            Some(_) => {}
        }
        if self.user_claim.trim().is_empty() {
            return invalid("oidc.user_claim: must name a claim (sub, email, preferred_username, …)".into());
        }
        if self.session_ttl_secs == 0 || self.recheck_secs == 0 {
            return invalid("oidc.session_ttl_secs and oidc.recheck_secs must be at least 1".into());
        }
        Ok(())
    }
}

/// `http://127.0.0.1…`, `http://[::1]…` or `http://localhost…`.
fn is_loopback_http(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    ["127.0.0.1", "[::1]", "localhost"]
        .iter()
        .any(|h| rest == *h || rest.starts_with(&format!("{h}:")) || rest.starts_with(&format!("{h}/")))
}
