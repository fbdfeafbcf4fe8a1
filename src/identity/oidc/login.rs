//! The authorization code flow with PKCE, as the gateway's client at the provider
//! (`openidconnect` does the protocol; the HTTP side is `http::oidc`).
//!
//! [`Oidc::start`] makes the provider's authorization URL and the state the callback needs
//! (`state`, `nonce`, the PKCE verifier), sealed into a cookie value no one else can read or
//! forge. [`Oidc::finish`] checks the callback against it (each `state` once), trades the code for
//! tokens, verifies the ID token (signature from the provider's keys, `iss`, `aud`, `azp`, `exp`,
//! `nonce`), applies the [`Policy`](super::Policy), and records the sign-in with the provider's
//! refresh and ID tokens sealed.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use openidconnect::core::{CoreAuthenticationFlow, CoreClient, CoreIdToken};
use openidconnect::{
    AuthorizationCode, ClientId, ClientSecret, CsrfToken, EndpointMaybeSet, EndpointNotSet, EndpointSet, Nonce,
    OAuth2TokenResponse, PkceCodeChallenge, PkceCodeVerifier, RedirectUrl, Scope, TokenResponse,
};
use secrecy::ExposeSecret;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::policy::Refused;
use super::{Discovered, Oidc, error_chain};
use crate::identity::WebSession;
use crate::infra::sealing::Sealed;

/// How long a login may take at the provider.
pub const LOGIN_TTL_SECS: u64 = 600;
/// The associated data the login state cookie is sealed under.
const STATE_AAD: (&str, &str, &str) = ("", "oidc", "login-state");

/// What the callback needs, sealed into a cookie between the two legs.
#[derive(Serialize, Deserialize)]
struct LoginState {
    state: String,
    nonce: String,
    verifier: String,
    expires_at: u64,
}

/// What is kept of the provider's tokens for a sign-in (sealed at rest).
#[derive(Serialize, Deserialize, Default)]
pub struct ProviderTokens {
    /// To check the person again later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
    /// For the provider's sign-out (`id_token_hint`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_token: Option<String>,
}

/// Why a login did not end in a sign-in.
#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    /// The provider cannot be reached (discovery or token endpoint).
    #[error("the identity provider cannot be reached: {0}")]
    Unavailable(#[from] super::ProviderDown),
    /// The callback does not belong to a login this browser started (or came twice, or late).
    #[error("this sign-in link is not one this browser started, or it was already used or expired; start again")]
    BadState,
    /// The provider said no (the person cancelled, or the provider refused).
    #[error("the identity provider did not sign you in: {0}")]
    Provider(String),
    /// The ID token failed verification.
    #[error("the identity provider's answer failed verification: {0}")]
    Invalid(String),
    /// The person may not use this gateway.
    #[error("{} may not use this gateway: {}", .0.account, .0.why)]
    Refused(Refused),
    /// The sign-in could not be recorded.
    #[error("the sign-in could not be recorded: {0}")]
    Store(String),
}

/// A completed sign-in.
#[derive(Debug)]
pub struct SignedIn {
    /// Who.
    pub user: String,
    /// Its id (the cookie's `sid`).
    pub sid: String,
    /// Seconds the cookie lasts.
    pub ttl_secs: u64,
    /// Whether the provider puts them in an admin group (`[admin].groups`).
    pub admin: bool,
}

impl Oidc {
    /// The client at the provider `d` describes.
    pub(super) fn client(&self, d: &Discovered) -> Result<ProviderClient, LoginError> {
        let redirect = self.cfg.redirect_url.clone().unwrap_or_default();
        let redirect = RedirectUrl::new(redirect.clone())
            .map_err(|e| LoginError::Invalid(format!("oidc.redirect_url {redirect:?}: {e}")))?;
        let secret = self
            .cfg
            .client_secret
            .as_ref()
            .map(|s| ClientSecret::new(s.expose_secret().to_string()));
        Ok(CoreClient::from_provider_metadata(
            d.metadata.clone(),
            ClientId::new(self.cfg.client_id.clone().unwrap_or_default()),
            secret,
        )
        .set_redirect_uri(redirect))
    }

    /// Starts a login: the provider's authorization URL, and the sealed state cookie value.
    pub async fn start(&self) -> Result<(String, String), LoginError> {
        // With the provider known to be down, look again (at most every few seconds) rather than
        // send the browser to a provider that will not answer.
        let force = self.degraded().await.is_some();
        let d = self.provider(force).await?;
        if force && let Some((_, why)) = self.failure() {
            return Err(super::ProviderDown(why).into());
        }
        let client = self.client(&d)?;
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let mut request = client
            .authorize_url(
                CoreAuthenticationFlow::AuthorizationCode,
                CsrfToken::new_random,
                Nonce::new_random,
            )
            .set_pkce_challenge(challenge);
        for scope in self.cfg.scopes.iter().filter(|s| s.as_str() != "openid") {
            request = request.add_scope(Scope::new(scope.clone()));
        }
        let (url, state, nonce) = request.url();
        let login = LoginState {
            state: state.secret().clone(),
            nonce: nonce.secret().clone(),
            verifier: verifier.secret().clone(),
            expires_at: crate::infra::clock::now_secs() + LOGIN_TTL_SECS,
        };
        let json = serde_json::to_string(&login).unwrap_or_default();
        let sealed = self.sealer.seal(STATE_AAD.0, STATE_AAD.1, STATE_AAD.2, &json);
        Ok((url.to_string(), encode_sealed(&sealed)))
    }

    /// Ends a login: `code` and `state` from the callback, `cookie` the state cookie's value.
    pub async fn finish(&self, code: &str, state: &str, cookie: Option<&str>) -> Result<SignedIn, LoginError> {
        let login = self.open_state(cookie).ok_or(LoginError::BadState)?;
        if login.expires_at < crate::infra::clock::now_secs()
            || !constant_time_eq(login.state.as_bytes(), state.as_bytes())
        {
            return Err(LoginError::BadState);
        }
        if !self.use_state(&login.state) {
            return Err(LoginError::BadState);
        }
        let d = self.provider(false).await?;
        let client = self.client(&d)?;
        let request = client
            .exchange_code(AuthorizationCode::new(code.to_string()))
            .map_err(|e| LoginError::Invalid(format!("the provider names no token endpoint: {e}")))?
            .set_pkce_verifier(PkceCodeVerifier::new(login.verifier.clone()));
        let tokens = match request.request_async(&self.http).await {
            Ok(t) => {
                self.recovered();
                t
            }
            Err(openidconnect::RequestTokenError::ServerResponse(e)) => {
                return Err(LoginError::Provider(e.to_string()));
            }
            Err(e) => {
                let why = format!("token endpoint: {}", error_chain(&e));
                self.failed("token", &why);
                return Err(super::ProviderDown(why).into());
            }
        };
        let id_token = tokens
            .id_token()
            .ok_or_else(|| LoginError::Invalid("the token response has no ID token".into()))?;
        let claims = self.verified_claims(&client, &d, id_token, Some(&login.nonce)).await?;
        let claims = self
            .with_userinfo(&d, tokens.access_token().secret(), claims)
            .await
            .map_err(LoginError::Unavailable)?;
        let user = self.policy.admit(&claims).map_err(LoginError::Refused)?;
        self.bind(&user, &claims).await.map_err(|e| match e {
            super::BindError::Refused(r) => LoginError::Refused(r),
            super::BindError::Store(e) => LoginError::Store(e),
        })?;
        let admin = self.policy.in_any_group(&claims, &self.admin_groups);
        let provider_tokens = ProviderTokens {
            refresh_token: tokens.refresh_token().map(|r| r.secret().clone()),
            id_token: None,
        };
        let sid = B64.encode(rand::random::<[u8; 32]>());
        let now = crate::infra::clock::now_secs();
        let ttl_secs = self.cfg.session_ttl_secs;
        let record = self.seal_session(&sid, &user, &provider_tokens, now, now + ttl_secs, now);
        self.store
            .put(&record)
            .await
            .map_err(|e| LoginError::Store(e.to_string()))?;
        Ok(SignedIn {
            user,
            sid,
            ttl_secs,
            admin,
        })
    }

    /// Verifies an ID token with the provider's keys (looking for new keys once, after a
    /// rotation) and returns all its claims. `nonce`: the one the login sent (none on refresh).
    pub(super) async fn verified_claims(
        &self,
        client: &ProviderClient,
        d: &Discovered,
        id_token: &CoreIdToken,
        nonce: Option<&str>,
    ) -> Result<Map<String, Value>, LoginError> {
        let check = |client: &ProviderClient| -> Result<(), LoginError> {
            let verifier = client.id_token_verifier();
            let result = match nonce {
                Some(n) => id_token.claims(&verifier, &Nonce::new(n.to_string())).map(|_| ()),
                None => id_token.claims(&verifier, |_: Option<&Nonce>| Ok(())).map(|_| ()),
            };
            result.map_err(|e| LoginError::Invalid(error_chain(&e)))
        };
        if let Err(first) = check(client) {
            // A key the held metadata does not have yet: the provider rotated its keys.
            let fresh = self.provider(true).await?;
            if fresh.at == d.at {
                return Err(first);
            }
            let client = self.client(&fresh)?;
            check(&client)?;
        }
        // Verified above: its payload may now be read for the claims openidconnect does not type.
        payload(&id_token.to_string()).ok_or_else(|| LoginError::Invalid("unreadable ID token payload".into()))
    }

    /// A sign-in record with the provider's tokens sealed.
    pub(super) fn seal_session(
        &self,
        sid: &str,
        user: &str,
        tokens: &ProviderTokens,
        created: u64,
        expires: u64,
        checked: u64,
    ) -> WebSession {
        let json = serde_json::to_string(tokens).unwrap_or_default();
        let sealed = self.sealer.seal(user, "oidc", sid, &json);
        WebSession {
            id: sid.to_string(),
            owner: user.to_string(),
            key_id: sealed.key_id,
            nonce: sealed.nonce,
            sealed: sealed.ciphertext,
            created_at: created as i64,
            expires_at: expires as i64,
            checked_at: checked as i64,
            revoked_at: None,
        }
    }

    /// The provider's tokens of a sign-in record.
    pub(super) fn open_session(&self, s: &WebSession) -> Option<ProviderTokens> {
        let sealed = Sealed {
            key_id: s.key_id.clone(),
            nonce: s.nonce.clone(),
            ciphertext: s.sealed.clone(),
        };
        let json = self.sealer.open(&s.owner, "oidc", &s.id, &sealed).ok()?;
        serde_json::from_str(json.expose_secret()).ok()
    }

    /// The provider's sign-out URL for a sign-in, sending the browser back to `back`.
    pub async fn end_session_url(&self, sid: &str, back: &str) -> Option<String> {
        let d = self.provider(false).await.ok()?;
        let end = d.end_session_endpoint.clone()?;
        let mut url = reqwest::Url::parse(&end).ok()?;
        // `client_id`, not `id_token_hint`: an ID token in a URL ends up in browser history and
        // the provider's logs.
        let _ = sid;
        url.query_pairs_mut()
            .append_pair("client_id", self.cfg.client_id.as_deref().unwrap_or_default())
            .append_pair("post_logout_redirect_uri", back);
        Some(url.to_string())
    }

    /// Whether `state` is the one of the login this browser's cookie holds (not consumed).
    pub fn state_matches(&self, state: Option<&str>, cookie: Option<&str>) -> bool {
        match (state, self.open_state(cookie)) {
            (Some(state), Some(login)) => constant_time_eq(login.state.as_bytes(), state.as_bytes()),
            _ => false,
        }
    }

    fn open_state(&self, cookie: Option<&str>) -> Option<LoginState> {
        let sealed = decode_sealed(cookie?)?;
        let json = self.sealer.open(STATE_AAD.0, STATE_AAD.1, STATE_AAD.2, &sealed).ok()?;
        serde_json::from_str(json.expose_secret()).ok()
    }

    /// Marks the `state` of a login whose own sealed cookie came back with it used; false when
    /// it already was. At most `oidc.used_states_max` are held: past it the oldest is forgotten,
    /// never a login refused (a flood of forged callbacks from cookies of its own once locked
    /// every sign-in out). A forgotten `state` could come back only with its cookie and a code,
    /// which the provider takes once.
    fn use_state(&self, state: &str) -> bool {
        let max = self.cfg.used_states_max.max(1);
        let mut used = self.used_states.lock();
        used.insert(state, max)
    }
}

/// `state`s of callbacks already taken, oldest first, for [`LOGIN_TTL_SECS`] at most.
#[derive(Debug, Default)]
pub(crate) struct UsedStates {
    at: std::collections::HashMap<String, std::time::Instant>,
    order: std::collections::VecDeque<String>,
}

impl UsedStates {
    /// Holds `state` (false when it is held already), forgetting expired ones and, past `max`,
    /// the oldest.
    fn insert(&mut self, state: &str, max: usize) -> bool {
        let now = std::time::Instant::now();
        let live = |at: &std::time::Instant| now.duration_since(*at).as_secs() < LOGIN_TTL_SECS;
        if self.at.get(state).is_some_and(live) {
            return false;
        }
        while let Some(oldest) = self.order.front() {
            let expired = !self.at.get(oldest).is_some_and(live);
            if !expired && self.order.len() < max {
                break;
            }
            if let Some(oldest) = self.order.pop_front() {
                self.at.remove(&oldest);
            }
        }
        self.at.insert(state.to_string(), now);
        self.order.push_back(state.to_string());
        true
    }
}

/// The gateway's client at the provider, as discovery configures it (authorization endpoint
/// set; token and userinfo endpoints as the provider names them).
pub(super) type ProviderClient =
    CoreClient<EndpointSet, EndpointNotSet, EndpointNotSet, EndpointNotSet, EndpointMaybeSet, EndpointMaybeSet>;

/// `{key_id}.{nonce}.{ciphertext}`, base64url.
fn encode_sealed(s: &Sealed) -> String {
    format!("{}.{}.{}", s.key_id, B64.encode(&s.nonce), B64.encode(&s.ciphertext))
}

fn decode_sealed(value: &str) -> Option<Sealed> {
    let mut parts = value.split('.');
    let (key_id, nonce, ciphertext) = (parts.next()?, parts.next()?, parts.next()?);
    Some(Sealed {
        key_id: key_id.to_string(),
        nonce: B64.decode(nonce).ok()?,
        ciphertext: B64.decode(ciphertext).ok()?,
    })
}

/// The payload of a JWT, as JSON (no verification: the caller has verified it).
fn payload(jwt: &str) -> Option<Map<String, Value>> {
    let part = jwt.split('.').nth(1)?;
    serde_json::from_slice(&B64.decode(part).ok()?).ok()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_memory_forgets_the_oldest_and_refuses_nobody() {
        let mut used = UsedStates::default();
        assert!(used.insert("a", 2));
        assert!(!used.insert("a", 2), "a replay");
        assert!(used.insert("b", 2));
        assert!(used.insert("c", 2), "full: the oldest goes, the new one is taken");
        assert!(!used.insert("c", 2) && !used.insert("b", 2));
        assert_eq!(used.order.len(), 2);
        assert_eq!(used.at.len(), 2);
    }
}
