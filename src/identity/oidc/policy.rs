//! Who may use the gateway, from the claims of a verified provider token: the user is one claim
//! (`user_claim`), and with `allowed_groups` or `allowed_domains` set, only members of one of
//! those groups, or people with a verified e-mail address (`email_verified: true`) in one of
//! those domains, get in. A user named by their e-mail address (`user_claim = "email"`) must
//! have it verified too: many providers let people type any address into their profile.

use serde_json::{Map, Value};

use crate::infra::config::OidcConfig;

/// The rules.
#[derive(Debug, Clone)]
pub struct Policy {
    user_claim: String,
    groups_claim: String,
    allowed_groups: Vec<String>,
    allowed_domains: Vec<String>,
}

/// A person the rules keep out: who they signed in as, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The account they used (the user claim, else `sub`, else `email`).
    pub account: String,
    /// Why, for them and for the log.
    pub why: String,
}

impl Policy {
    /// The rules of `cfg`.
    pub fn from_config(cfg: &OidcConfig) -> Self {
        Self {
            user_claim: cfg.user_claim.clone(),
            groups_claim: cfg.groups_claim.clone(),
            allowed_groups: cfg.allowed_groups.clone(),
            allowed_domains: cfg.allowed_domains.iter().map(|d| d.to_ascii_lowercase()).collect(),
        }
    }

    /// The user the claims name, if the rules let them in.
    pub fn admit(&self, claims: &Map<String, Value>) -> Result<String, Refused> {
        let named = |claim: &str| {
            claims
                .get(claim)
                .and_then(Value::as_str)
                .filter(|s| !s.trim().is_empty())
        };
        let account = named(&self.user_claim)
            .or_else(|| named("sub"))
            .or_else(|| named("email"))
            .unwrap_or("(unnamed account)")
            .to_string();
        let refuse = |why: String| Refused {
            account: account.clone(),
            why,
        };
        let Some(user) = named(&self.user_claim) else {
            return Err(refuse(format!(
                "the provider did not send the claim {:?} that names users here",
                self.user_claim
            )));
        };
        // Only an address the provider says it verified (`email_verified: true`) counts.
        let verified = claims.get("email_verified").and_then(Value::as_bool) == Some(true);
        if self.user_claim == "email" && !verified {
            return Err(refuse(String::from(
                "users here are named by the claim \"email\", and the provider did not say it verified this address (\"email_verified\" is not true)",
            )));
        }
        // Either rule lets a person in (a group, or a verified address in a domain).
        if self.allowed_groups.is_empty() && self.allowed_domains.is_empty() {
            return Ok(user.to_string());
        }
        let groups = groups_of(claims.get(&self.groups_claim));
        let in_group = groups.iter().any(|g| self.allowed_groups.iter().any(|a| a == g));
        let domain = named("email")
            .filter(|_| verified)
            .and_then(|e| e.rsplit_once('@'))
            .map(|(_, d)| d.to_ascii_lowercase());
        let in_domain = domain.as_ref().is_some_and(|d| self.allowed_domains.contains(d));
        if !in_group && !in_domain {
            let mut why = Vec::new();
            if !self.allowed_groups.is_empty() {
                why.push(format!(
                    "not in an allowed group (allowed: {}; yours: {})",
                    self.allowed_groups.join(", "),
                    if groups.is_empty() {
                        String::from("none")
                    } else {
                        groups.join(", ")
                    }
                ));
            }
            if !self.allowed_domains.is_empty() {
                why.push(format!(
                    "no verified e-mail address in an allowed domain (allowed: {})",
                    self.allowed_domains.join(", ")
                ));
            }
            return Err(refuse(why.join("; and ")));
        }
        Ok(user.to_string())
    }
}

impl Policy {
    /// Whether the rules read a claim `claims` lacks: the user claim; the groups claim when
    /// groups are allowed (or `admin_groups` are set); `email` and `email_verified` when
    /// domains are allowed or users are named by their address.
    pub fn lacks_claims(&self, claims: &Map<String, Value>, admin_groups: &[String]) -> bool {
        let has = |name: &str| claims.get(name).is_some_and(|v| !v.is_null());
        let reads_groups = !self.allowed_groups.is_empty() || !admin_groups.is_empty();
        let reads_email = !self.allowed_domains.is_empty() || self.user_claim == "email";
        let has_email = has("email") && has("email_verified");
        !has(&self.user_claim) || (reads_groups && !has(&self.groups_claim)) || (reads_email && !has_email)
    }

    /// Whether the claims put the person in one of `groups` (e.g. `[admin].groups`).
    pub fn in_any_group(&self, claims: &Map<String, Value>, groups: &[String]) -> bool {
        !groups.is_empty()
            && groups_of(claims.get(&self.groups_claim))
                .iter()
                .any(|g| groups.iter().any(|a| a == g))
    }
}

/// A groups claim as a list (an array of strings, or one string).
fn groups_of(value: Option<&Value>) -> Vec<String> {
    match value {
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).map(String::from).collect(),
        Some(Value::String(s)) => vec![s.clone()],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claims(v: Value) -> Map<String, Value> {
        v.as_object().cloned().expect("object")
    }

    #[test]
    fn groups_and_domains_decide() {
        let cfg = OidcConfig {
            user_claim: "email".into(),
            allowed_groups: vec!["devs".into()],
            allowed_domains: vec!["Example.com".into()],
            ..OidcConfig::default()
        };
        let p = Policy::from_config(&cfg);
        let alice = claims(json!({"sub":"a1","email":"alice@example.com","email_verified":true,"groups":["devs"]}));
        assert_eq!(p.admit(&alice), Ok("alice@example.com".into()), "in the group");
        // The same member with an address the provider did not verify: it names nobody here.
        for unverified in [json!(false), json!("true"), serde_json::Value::Null] {
            let mut c = alice.clone();
            c.insert("email_verified".into(), unverified.clone());
            let refused = p.admit(&c).expect_err("an unverified address names nobody");
            assert!(
                refused.why.contains("\"email\"") && refused.why.contains("email_verified"),
                "{unverified}: {}",
                refused.why
            );
        }
        let mut absent = alice.clone();
        absent.remove("email_verified");
        assert!(p.admit(&absent).is_err(), "no email_verified at all");
        let dana = claims(json!({"sub":"d1","email":"dana@example.com","email_verified":true,"groups":"sales"}));
        assert_eq!(
            p.admit(&dana),
            Ok("dana@example.com".into()),
            "a verified address in the domain"
        );
        let carol = claims(json!({"sub":"c1","email":"carol@other.example","email_verified":true,"groups":"sales"}));
        let refused = p.admit(&carol).expect_err("neither");
        assert_eq!(refused.account, "carol@other.example");
        assert!(refused.why.contains("yours: sales"), "{}", refused.why);
        for unverified in [json!(false), json!("true"), serde_json::Value::Null] {
            let c = claims(json!({"sub":"e","email":"eve@example.com","email_verified":unverified,"groups":[]}));
            assert!(
                p.admit(&c).is_err(),
                "email_verified {unverified} is not a verified address"
            );
        }
        let nameless = claims(json!({"sub":"x","groups":["devs"]}));
        assert_eq!(p.admit(&nameless).expect_err("no email").account, "x");
        // Named by `sub`, an unverified address changes nothing (it names nobody).
        let by_sub = Policy::from_config(&OidcConfig {
            allowed_groups: vec!["devs".into()],
            ..OidcConfig::default()
        });
        let unverified =
            claims(json!({"sub":"a1","email":"alice@example.com","email_verified":false,"groups":["devs"]}));
        assert_eq!(by_sub.admit(&unverified), Ok("a1".into()));
    }

    #[test]
    fn the_claims_the_rules_read_are_looked_for() {
        let by_sub = Policy::from_config(&OidcConfig::default());
        assert!(!by_sub.lacks_claims(&claims(json!({"sub":"a"})), &[]));
        assert!(
            by_sub.lacks_claims(&claims(json!({"sub":"a"})), &["admins".into()]),
            "admin groups read the groups claim"
        );
        let cfg = OidcConfig {
            user_claim: "email".into(),
            allowed_groups: vec!["devs".into()],
            allowed_domains: vec!["example.com".into()],
            ..OidcConfig::default()
        };
        let p = Policy::from_config(&cfg);
        assert!(p.lacks_claims(&claims(json!({"sub":"a"})), &[]));
        let by_email = Policy::from_config(&OidcConfig {
            user_claim: "email".into(),
            ..OidcConfig::default()
        });
        assert!(
            by_email.lacks_claims(&claims(json!({"sub":"a","email":"a@example.com"})), &[]),
            "named by the address: whether it is verified is read too"
        );
        assert!(p.lacks_claims(&claims(json!({"sub":"a","email":"a@example.com","groups":[]})), &[]));
        assert!(!p.lacks_claims(
            &claims(json!({"sub":"a","email":"a@example.com","email_verified":true,"groups":[]})),
            &[]
        ));
    }
}
