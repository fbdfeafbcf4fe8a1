//! Which provider account a user name belongs to.
//!
//! The user is a claim (`user_claim`): with `email` or `preferred_username`, the provider may one
//! day hand the same name to another account (an address reused after someone left, a username
//! changed, a second issuer on the API). So the first sign-in of a name through a provider binds
//! it to that account, `(iss, sub)`, in the store (`user_identities`, every replica), and a later
//! sign-in whose claims name the same user from another account is refused, by name. An operator
//! who means the name to move deletes its row.
//!
//! Names of the gateway's own users (`oidc.local_users`: tokens from `acp-gateway token`, the
//! login link `serve` prints, default `local`) are never given to a provider account: a provider
//! user whose claim says `local` does not become the operator's `local`. An operator maps such a
//! name to a provider account by taking it out of that list; its next sign-in through the
//! provider binds it.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use super::Oidc;
use super::policy::Refused;

/// How long a binding read from the store is trusted here without asking it again (an
/// operator's deletion reaches every replica within this).
const KEEP: Duration = Duration::from_secs(60);
/// Bindings kept here at most (then forgotten all at once: the store has them).
const KEEP_MAX: usize = 10_000;

/// Bindings confirmed lately, so that a provider token on the API costs no store round trip on
/// every request.
#[derive(Debug, Default)]
pub struct Bindings {
    /// user name → (issuer, subject, when read).
    seen: Mutex<HashMap<String, (String, String, Instant)>>,
}

/// Why an account may not be the user its claims name.
#[derive(Debug)]
pub enum BindError {
    /// It is not theirs (named in the refusal).
    Refused(Refused),
    /// The store could not say.
    Store(String),
}

impl Oidc {
    /// Whether the provider account of the verified `claims` may be `user`: binds the name on its
    /// first sign-in, refuses another account later, and never gives out a local user's name.
    pub async fn bind(&self, user: &str, claims: &Map<String, Value>) -> Result<(), BindError> {
        let text = |name: &str| claims.get(name).and_then(Value::as_str).unwrap_or_default().to_string();
        let (issuer, subject) = (text("iss"), text("sub"));
        let refuse = |why: String| {
            BindError::Refused(Refused {
                account: user.to_string(),
                why,
            })
        };
        if self.cfg.local_users.iter().any(|l| l == user) {
            return Err(refuse(format!(
                "{user:?} is a user of this gateway's own tokens (oidc.local_users), not a name the identity provider can give"
            )));
        }
        if issuer.is_empty() || subject.is_empty() {
            return Err(refuse(String::from(
                "the provider's token names no account (\"iss\" and \"sub\" are required)",
            )));
        }
        if self.bindings.holds(user, &issuer, &subject) {
            return Ok(());
        }
        let (bound_issuer, bound_subject) = self
            .store
            .bind_identity(user, &issuer, &subject)
            .await
            .map_err(|e| BindError::Store(e.to_string()))?;
        if bound_issuer == issuer && bound_subject == subject {
            self.bindings.keep(user, issuer, subject);
            return Ok(());
        }
        tracing::warn!(
            user,
            issuer,
            subject,
            bound_issuer,
            bound_subject,
            "a provider account asked for a user name bound to another account; refused"
        );
        Err(refuse(format!(
            "the name {user:?} belongs to another account at the identity provider (the first that signed in with it), and only an operator can move it"
        )))
    }
}

impl Bindings {
    /// Whether `user` was seen bound to `(issuer, subject)` lately.
    fn holds(&self, user: &str, issuer: &str, subject: &str) -> bool {
        let seen = self.seen.lock();
        seen.get(user)
            .is_some_and(|(i, s, at)| i == issuer && s == subject && at.elapsed() < KEEP)
    }

    fn keep(&self, user: &str, issuer: String, subject: String) {
        let mut seen = self.seen.lock();
        if seen.len() >= KEEP_MAX {
            seen.clear();
        }
        seen.insert(user.to_string(), (issuer, subject, Instant::now()));
    }
}
