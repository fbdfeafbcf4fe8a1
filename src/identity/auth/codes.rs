//! One-time login codes: what `acp-gateway serve` prints instead of a long-lived token.
//!
//! A code is 256 random bits, lives in this process's memory only, names one user, expires after
//! a few minutes and is gone after its first use. `GET /auth/login?code=` trades it for the web
//! UI's cookie. Codes are kept by their SHA-256, so the table holds nothing a memory dump could
//! replay, and lookups do not compare secret strings byte by byte.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use base64::Engine;
use sha2::{Digest, Sha256};

/// How long a code printed at start-up stays valid, unless [`LoginCodes::new`] says otherwise.
pub const DEFAULT_CODE_TTL: Duration = Duration::from_secs(10 * 60);

/// Most codes outstanding at once; issuing beyond it drops the oldest. Codes are only minted by
/// the operator (start-up), so this is a bound, not a limit anyone should meet.
const MAX_CODES: usize = 1024;

/// Outstanding one-time login codes.
#[derive(Debug)]
pub struct LoginCodes {
    /// Lifetime of a code from [`LoginCodes::issue`].
    ttl: Duration,
    /// SHA-256 of each code → who it signs in and until when.
    codes: Mutex<HashMap<[u8; 32], Entry>>,
}

/// What one code stands for.
#[derive(Debug, Clone)]
struct Entry {
    /// The user it signs in.
    user: String,
    /// Unusable from this instant on.
    expires: Instant,
}

impl LoginCodes {
    /// An empty table whose codes live `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            codes: Mutex::default(),
        }
    }

    /// Mints a code for `user`, valid for the table's lifetime.
    pub fn issue(&self, user: &str) -> String {
        self.issue_at(user, self.ttl, Instant::now())
    }

    /// Mints a code for `user` valid for `ttl` from `now`.
    pub fn issue_at(&self, user: &str, ttl: Duration, now: Instant) -> String {
        let bytes: [u8; 32] = rand::random();
        let code = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        let mut codes = self.lock();
        codes.retain(|_, e| e.expires > now);
        if codes.len() >= MAX_CODES
            && let Some(oldest) = codes.iter().min_by_key(|(_, e)| e.expires).map(|(k, _)| *k)
        {
            codes.remove(&oldest);
        }
        codes.insert(
            digest(&code),
            Entry {
                user: user.to_string(),
                expires: now + ttl,
            },
        );
        code
    }

    /// Uses up `code`: the user it signs in, or `None` for an unknown, used or expired code.
    pub fn redeem(&self, code: &str) -> Option<String> {
        self.redeem_at(code, Instant::now())
    }

    /// [`LoginCodes::redeem`] at a given instant.
    pub fn redeem_at(&self, code: &str, now: Instant) -> Option<String> {
        let entry = self.lock().remove(&digest(code))?;
        (entry.expires > now).then_some(entry.user)
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, HashMap<[u8; 32], Entry>> {
        self.codes.lock()
    }
}

impl Default for LoginCodes {
    fn default() -> Self {
        Self::new(DEFAULT_CODE_TTL)
    }
}

fn digest(code: &str) -> [u8; 32] {
    Sha256::digest(code.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_code_works_once() {
        let codes = LoginCodes::default();
        let code = codes.issue("local");
        assert!(code.len() >= 43, "256 bits, base64url: {code}");
        assert_ne!(code, codes.issue("local"), "every code is fresh");
        assert_eq!(codes.redeem(&code).as_deref(), Some("local"));
        assert_eq!(codes.redeem(&code), None, "second use");
        assert_eq!(codes.redeem("made-up"), None);
        assert_eq!(codes.redeem(""), None);
    }

    #[test]
    fn a_code_expires() {
        let codes = LoginCodes::new(Duration::from_secs(600));
        let t0 = Instant::now();
        let code = codes.issue_at("alice", Duration::from_secs(600), t0);
        let late = t0 + Duration::from_secs(600);
        assert_eq!(codes.redeem_at(&code, late), None, "expired at its deadline");
        assert_eq!(codes.redeem_at(&code, t0), None, "an expired code is gone, not parked");
        let code = codes.issue_at("alice", Duration::from_secs(600), t0);
        assert_eq!(
            codes.redeem_at(&code, t0 + Duration::from_secs(599)).as_deref(),
            Some("alice")
        );
    }

    #[test]
    fn the_table_is_bounded() {
        let codes = LoginCodes::default();
        let (t0, ttl) = (Instant::now(), Duration::from_secs(60));
        let first = codes.issue_at("u", ttl, t0);
        for i in 1..=MAX_CODES as u64 {
            codes.issue_at("u", ttl, t0 + Duration::from_millis(i));
        }
        assert_eq!(codes.lock().len(), MAX_CODES);
        assert_eq!(codes.redeem_at(&first, t0), None, "the oldest went first");
    }
}
