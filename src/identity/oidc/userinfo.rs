//! Claims from the provider's userinfo endpoint, for when the ID token lacks what the rules read.
//!
//! A provider may keep the scope's claims (`email`, `groups`) out of the ID token when it also
//! issues an access token (OpenID Connect Core 5.4; `oidc-provider`'s default,
//! `conformIdTokenClaims`): they are at its userinfo endpoint instead. When the user claim, the
//! groups claim (allowed or admin groups set) or the e-mail claims (allowed domains set) are
//! missing from a verified ID token, the gateway asks the userinfo endpoint with the access token
//! it was given beside it, and adds what the ID token lacks (what the ID token says wins). The
//! answer's `sub` must be the ID token's (Core 5.3.2), or nothing of it is taken.

use serde_json::{Map, Value};

use super::{Discovered, Oidc, error_chain};

impl Oidc {
    /// `claims` (a verified ID token's) with what the userinfo endpoint adds, when the rules
    /// need a claim they lack. `Err` only when the provider cannot be reached (the sign-in then
    /// fails as with the token endpoint down); an endpoint that answers with an error, or a
    /// provider without one, leaves the claims as they are (the rules then say what is missing).
    pub(super) async fn with_userinfo(
        &self,
        d: &Discovered,
        access_token: &str,
        mut claims: Map<String, Value>,
    ) -> Result<Map<String, Value>, super::ProviderDown> {
        if !self.policy.lacks_claims(&claims, &self.admin_groups) {
            return Ok(claims);
        }
        let Some(endpoint) = d.metadata.userinfo_endpoint() else {
            return Ok(claims);
        };
        let url = endpoint.url().as_str();
        let response = match self
            .http
            .get(url)
            .bearer_auth(access_token)
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
        {
            Ok(r) => r,
            Err(e) => {
                let why = format!("userinfo endpoint: {}", error_chain(&e));
                self.failed("userinfo", &why);
                return Err(super::ProviderDown(why));
            }
        };
        crate::infra::metrics::oidc_fetch("userinfo", if response.status().is_success() { "ok" } else { "error" });
        if !response.status().is_success() {
            tracing::warn!(url, status = %response.status(), "the provider's userinfo endpoint refused the access token; using the ID token's claims alone");
            return Ok(claims);
        }
        // A signed or encrypted answer (`application/jwt`) is not read: JSON only.
        let info = match response.json::<Map<String, Value>>().await {
            Ok(info) => info,
            Err(e) => {
                tracing::warn!(url, error = %e, "the provider's userinfo answer is not a JSON object; using the ID token's claims alone");
                return Ok(claims);
            }
        };
        if info.get("sub") != claims.get("sub") {
            tracing::warn!(
                url,
                "the provider's userinfo answer names another subject than the ID token; ignored"
            );
            return Ok(claims);
        }
        for (name, value) in info {
            claims.entry(name).or_insert(value);
        }
        Ok(claims)
    }
}
