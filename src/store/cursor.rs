//! Opaque, tamper-proof `session/list` cursors.
//!
//! A cursor is `base64url(payload) "." base64url(hmac)`, where the payload names the last row of
//! the previous page, the user it was issued to, a hash of the filters and when it was issued.
//! A cursor that was altered, was issued to someone else, or is used with other filters or after
//! it expired is refused (`-32602`), so it can never reveal another user's rows.

use std::hash::{DefaultHasher, Hash, Hasher};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use super::ListFilter;

/// How long a cursor stays valid, in microseconds (one day).
const MAX_AGE_MICROS: i64 = 24 * 3600 * 1_000_000;

/// Signs and checks cursors with a key every replica shares (kept in the database).
#[derive(Clone)]
pub struct CursorCodec {
    /// The HMAC-SHA256 key.
    key: Vec<u8>,
}

impl std::fmt::Debug for CursorCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CursorCodec")
    }
}

#[derive(Serialize, Deserialize)]
struct Payload {
    /// `updated_at` of the last row returned.
    t: i64,
    /// Id of that row (ties on `t`).
    i: String,
    /// The user it was issued to.
    u: String,
    /// Hash of the filters: the cursor only continues the same query.
    f: u64,
    /// Issued at (epoch µs): the cursor expires.
    at: i64,
}

/// Where the next page starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// `updated_at` of the last row already returned.
    pub updated_at: i64,
    /// Id of that row, which breaks ties on `updated_at`.
    pub id: String,
}

impl CursorCodec {
    /// A codec with `key`.
    pub fn new(key: Vec<u8>) -> Self {
        Self { key }
    }

    fn mac(&self, data: &[u8]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        mac.update(data);
        mac
    }

    /// Makes the cursor that continues after the row `(updated_at, id)`.
    pub fn encode(&self, user: &str, filter: &ListFilter, updated_at: i64, id: &str, now: i64) -> String {
        let payload = Payload {
            t: updated_at,
            i: id.to_string(),
            u: user.to_string(),
            f: filter_hash(filter),
            at: now,
        };
        let json = serde_json::to_vec(&payload).unwrap_or_default();
        let tag = self.mac(&json).finalize().into_bytes();
        format!("{}.{}", URL_SAFE_NO_PAD.encode(&json), URL_SAFE_NO_PAD.encode(tag))
    }

    /// Checks a cursor for this user and these filters.
    pub fn decode(&self, cursor: &str, user: &str, filter: &ListFilter, now: i64) -> Option<Decoded> {
        let (body, tag) = cursor.split_once('.')?;
        let json = URL_SAFE_NO_PAD.decode(body).ok()?;
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        self.mac(&json).verify_slice(&tag).ok()?;
        let p: Payload = serde_json::from_slice(&json).ok()?;
        let fresh = now.saturating_sub(p.at) <= MAX_AGE_MICROS && p.at <= now + 60_000_000;
        (p.u == user && p.f == filter_hash(filter) && fresh).then_some(Decoded {
            updated_at: p.t,
            id: p.i,
        })
    }
}

/// A stable hash of the filters (SipHash with fixed keys: the same on every replica and build
/// of one version).
fn filter_hash(filter: &ListFilter) -> u64 {
    let mut h = DefaultHasher::new();
    filter.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_tampering() {
        let c = CursorCodec::new(b"k".to_vec());
        let f = ListFilter::default();
        let cur = c.encode("alice", &f, 42, "s1", 1000);
        assert_eq!(
            c.decode(&cur, "alice", &f, 2000),
            Some(Decoded {
                updated_at: 42,
                id: "s1".into()
            })
        );
        assert_eq!(c.decode(&cur, "bob", &f, 2000), None, "another user's cursor");
        let other = ListFilter {
            search: Some("x".into()),
            ..Default::default()
        };
        assert_eq!(c.decode(&cur, "alice", &other, 2000), None, "other filters");
        assert_eq!(c.decode(&cur, "alice", &f, 1000 + MAX_AGE_MICROS + 1), None, "expired");
        assert_eq!(
            CursorCodec::new(b"other".to_vec()).decode(&cur, "alice", &f, 2000),
            None,
            "other key"
        );
        let (body, tag) = cur.split_once('.').expect("two parts");
        let forged_body = URL_SAFE_NO_PAD.encode(br#"{"t":0,"i":"s9","u":"alice","f":0,"at":1000}"#);
        assert_eq!(c.decode(&format!("{forged_body}.{tag}"), "alice", &f, 2000), None);
        assert_eq!(c.decode(body, "alice", &f, 2000), None);
        assert_eq!(c.decode("garbage", "alice", &f, 2000), None);
    }
}
