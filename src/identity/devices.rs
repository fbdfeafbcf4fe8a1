//! Device sign-in (RFC 8628) for programs that have no browser of their own (`acp-gateway
//! login`): the codes and the devices they signed in (`device_codes`), with their statements
//! written once for both databases. A code is asked for, approved or denied by a signed-in person
//! who sees which device asks, and exchanged once for a token; the device is then listed with its
//! last use until its sign-in (`web_sessions`) ends. Every replica reads the same rows.

use base64::Engine;
use sha2::Digest;
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Postgres, Sqlite, Type};

use crate::infra::clock::now_secs;
use crate::store::{Db, StoreError, statement};

/// How often a program may poll (RFC 8628 `interval`).
pub const POLL_INTERVAL_SECS: i64 = 5;
/// How long codes that were never used are kept after they expire, for the approver's page to
/// say "expired" rather than "unknown".
const KEPT_SECS: i64 = 24 * 3600;
/// The letters of a user code: no vowels (no words), none that look alike (RFC 8628 §6.1).
const ALPHABET: &[u8] = b"BCDFGHJKLMNPQRSTVWXZ";

/// A code as stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct DeviceCode {
    /// Its public id (a device's, once issued: what the web UI lists and revokes).
    pub id: String,
    /// The code the person types or follows, `XXXX-XXXX`.
    pub user_code: String,
    /// The name the device gave (its host and program).
    pub client_name: String,
    /// The address it asked from.
    pub client_addr: String,
    /// When it was asked for, and until when it may be approved and exchanged.
    pub created_at: i64,
    pub expires_at: i64,
    /// `pending`, `approved`, `denied`, or `issued` (the token was handed out).
    pub state: String,
    /// Who approved or denied it.
    pub owner: Option<String>,
    /// The sign-in its token belongs to, once issued.
    pub sid: Option<String>,
    /// When its token was last used to connect.
    pub last_used_at: Option<i64>,
}

const COLUMNS: &str =
    "id, user_code, client_name, client_addr, created_at, expires_at, state, owner, sid, last_used_at";

/// What a program's poll comes to.
#[derive(Debug, PartialEq, Eq)]
pub enum Poll {
    /// Not approved yet.
    Pending,
    /// Polled sooner than [`POLL_INTERVAL_SECS`] after the last poll.
    SlowDown,
    /// Denied by the person.
    Denied,
    /// Expired, or exchanged already.
    Expired,
    /// Unknown code.
    Unknown,
    /// Approved by `owner`, and now taken: issue its token under sign-in `sid`.
    Issue { owner: String, id: String },
}

/// What an approval or denial came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Recorded.
    Done,
    /// No such code.
    Unknown,
    /// It expired.
    Expired,
    /// It was approved or denied already (by anyone).
    Decided,
}

/// The `device_codes` statements, for any database that can run them.
pub(crate) trait DeviceSql: Database
where
    for<'q> Self::Arguments<'q>: IntoArguments<'q, Self>,
    for<'c> &'c mut Self::Connection: Executor<'c, Database = Self>,
    for<'q> &'q str: Encode<'q, Self> + Type<Self>,
    for<'q> i64: Encode<'q, Self> + Type<Self>,
    for<'r> DeviceCode: FromRow<'r, Self::Row>,
{
    async fn insert_device_code<'c>(
        e: impl Executor<'c, Database = Self>,
        code: &DeviceCode,
        code_hash: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO device_codes (id, code_hash, user_code, client_name, client_addr, created_at, expires_at, state)
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending')",
        )
        .bind(code.id.as_str())
        .bind(code_hash)
        .bind(code.user_code.as_str())
        .bind(code.client_name.as_str())
        .bind(code.client_addr.as_str())
        .bind(code.created_at)
        .bind(code.expires_at)
        .execute(e)
        .await?;
        Ok(())
    }

    async fn device_code_by_user_code<'c>(
        e: impl Executor<'c, Database = Self>,
        user_code: &str,
    ) -> Result<Option<DeviceCode>, sqlx::Error> {
        sqlx::query_as(&format!("SELECT {COLUMNS} FROM device_codes WHERE user_code = $1"))
            .bind(user_code)
            .fetch_optional(e)
            .await
    }

    async fn device_code_by_hash<'c>(
        e: impl Executor<'c, Database = Self>,
        code_hash: &str,
    ) -> Result<Option<DeviceCode>, sqlx::Error> {
        sqlx::query_as(&format!("SELECT {COLUMNS} FROM device_codes WHERE code_hash = $1"))
            .bind(code_hash)
            .fetch_optional(e)
            .await
    }

    /// Approves (`approved`) or denies (`denied`) a pending, unexpired code; whether it was.
    async fn decide_device_code<'c>(
        e: impl Executor<'c, Database = Self>,
        user_code: &str,
        state: &str,
        owner: &str,
        now: i64,
    ) -> Result<bool, sqlx::Error> {
        let done: Vec<DeviceCode> = sqlx::query_as(&format!(
            "UPDATE device_codes SET state = $2, owner = $3
             WHERE user_code = $1 AND state = 'pending' AND expires_at > $4 RETURNING {COLUMNS}"
        ))
        .bind(user_code)
        .bind(state)
        .bind(owner)
        .bind(now)
        .fetch_all(e)
        .await?;
        Ok(done.len() == 1)
    }

    /// Records a poll at `now` unless the last was under the interval ago; whether it counts.
    async fn poll_device_code<'c>(
        e: impl Executor<'c, Database = Self>,
        code_hash: &str,
        now: i64,
    ) -> Result<bool, sqlx::Error> {
        let done: Vec<DeviceCode> = sqlx::query_as(&format!(
            "UPDATE device_codes SET polled_at = $2 WHERE code_hash = $1 AND polled_at <= $3 RETURNING {COLUMNS}"
        ))
        .bind(code_hash)
        .bind(now)
        .bind(now - POLL_INTERVAL_SECS + 1)
        .fetch_all(e)
        .await?;
        Ok(done.len() == 1)
    }

    /// Takes an approved code for its token (once: `issued`, under sign-in `sid`); whether this
    /// call took it.
    async fn issue_device_code<'c>(
        e: impl Executor<'c, Database = Self>,
        code_hash: &str,
        sid: &str,
        now: i64,
    ) -> Result<bool, sqlx::Error> {
        let done: Vec<DeviceCode> = sqlx::query_as(&format!(
            "UPDATE device_codes SET state = 'issued', sid = $2, last_used_at = $3
             WHERE code_hash = $1 AND state = 'approved' AND expires_at > $3 RETURNING {COLUMNS}"
        ))
        .bind(code_hash)
        .bind(sid)
        .bind(now)
        .fetch_all(e)
        .await?;
        Ok(done.len() == 1)
    }

    /// `owner`'s devices whose sign-in is live, newest first.
    async fn devices_of<'c>(
        e: impl Executor<'c, Database = Self>,
        owner: &str,
        now: i64,
    ) -> Result<Vec<DeviceCode>, sqlx::Error> {
        let columns = COLUMNS
            .split(", ")
            .map(|c| format!("d.{c}"))
            .collect::<Vec<_>>()
            .join(", ");
        sqlx::query_as(&format!(
            "SELECT {columns} FROM device_codes d JOIN web_sessions w ON w.id = d.sid
             WHERE d.owner = $1 AND d.state = 'issued' AND w.revoked_at IS NULL AND w.expires_at > $2
             ORDER BY d.created_at DESC"
        ))
        .bind(owner)
        .bind(now)
        .fetch_all(e)
        .await
    }

    /// Notes that the device of sign-in `sid` connected (at most once a minute).
    async fn device_used<'c>(e: impl Executor<'c, Database = Self>, sid: &str, now: i64) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE device_codes SET last_used_at = $2 WHERE sid = $1 AND (last_used_at IS NULL OR last_used_at < $3)",
        )
        .bind(sid)
        .bind(now)
        .bind(now - 60)
        .execute(e)
        .await?;
        Ok(())
    }

    /// Forgets codes never exchanged that expired before `before`.
    async fn prune_device_codes<'c>(e: impl Executor<'c, Database = Self>, before: i64) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM device_codes WHERE state <> 'issued' AND expires_at < $1")
            .bind(before)
            .execute(e)
            .await?;
        Ok(())
    }
}

impl DeviceSql for Sqlite {}
impl DeviceSql for Postgres {}

/// The device codes and signed-in devices, in the database.
#[derive(Debug, Clone)]
pub struct Devices {
    db: Db,
}

/// A new code: what the program keeps (the device code) and what the person sees.
#[derive(Debug)]
pub struct NewCode {
    pub device_code: String,
    pub code: DeviceCode,
}

/// The SHA-256 of a device code, as stored.
fn hash(device_code: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(device_code.as_bytes()))
}

/// A user code as people type it: letters only, upper case, `XXXX-XXXX`.
pub fn normalize_user_code(typed: &str) -> String {
    let letters: String = typed
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_uppercase())
        .collect();
    match letters.len() {
        8 => format!("{}-{}", &letters[..4], &letters[4..]),
        _ => letters,
    }
}

fn user_code() -> String {
    let letters: String = (0..8)
        .map(|_| char::from(ALPHABET[rand::random_range(0..ALPHABET.len())]))
        .collect();
    normalize_user_code(&letters)
}

impl Devices {
    /// The device tables in `db`.
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    /// A new code for the program `client_name` asking from `client_addr`, valid `ttl` seconds.
    pub async fn start(&self, client_name: &str, client_addr: &str, ttl: u64) -> Result<NewCode, StoreError> {
        let now = now_secs() as i64;
        statement!(self.db, prune_device_codes(now - KEPT_SECS))?;
        let random = |n: usize| {
            let bytes: Vec<u8> = (0..n).map(|_| rand::random::<u8>()).collect();
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
        };
        let device_code = random(32);
        let code = DeviceCode {
            id: random(16),
            user_code: user_code(),
            client_name: client_name.chars().take(100).collect(),
            client_addr: client_addr.to_string(),
            created_at: now,
            expires_at: now + ttl as i64,
            state: "pending".into(),
            owner: None,
            sid: None,
            last_used_at: None,
        };
        statement!(self.db, insert_device_code(&code, &hash(&device_code)))?;
        Ok(NewCode { device_code, code })
    }

    /// The code a person typed or followed.
    pub async fn by_user_code(&self, typed: &str) -> Result<Option<DeviceCode>, StoreError> {
        let user_code = normalize_user_code(typed);
        statement!(self.db, device_code_by_user_code(&user_code))
    }

    /// `owner` approves (or denies) the code `typed`.
    pub async fn decide(&self, typed: &str, owner: &str, approve: bool) -> Result<Decision, StoreError> {
        let user_code = normalize_user_code(typed);
        let now = now_secs() as i64;
        let state = if approve { "approved" } else { "denied" };
        if statement!(self.db, decide_device_code(&user_code, state, owner, now))? {
            return Ok(Decision::Done);
        }
        Ok(match statement!(self.db, device_code_by_user_code(&user_code))? {
            None => Decision::Unknown,
            Some(c) if c.state != "pending" => Decision::Decided,
            Some(_) => Decision::Expired,
        })
    }

    /// A program polls with its device code; an approved code is taken at once (once), under
    /// the new sign-in `sid`.
    pub async fn poll(&self, device_code: &str, sid: &str) -> Result<Poll, StoreError> {
        let code_hash = hash(device_code);
        let now = now_secs() as i64;
        let Some(code) = statement!(self.db, device_code_by_hash(&code_hash))? else {
            return Ok(Poll::Unknown);
        };
        if code.state == "issued" || code.expires_at <= now {
            return Ok(Poll::Expired);
        }
        if !statement!(self.db, poll_device_code(&code_hash, now))? {
            return Ok(Poll::SlowDown);
        }
        match code.state.as_str() {
            "denied" => Ok(Poll::Denied),
            "approved" => {
                if !statement!(self.db, issue_device_code(&code_hash, sid, now))? {
                    return Ok(Poll::Expired);
                }
                Ok(Poll::Issue {
                    owner: code.owner.unwrap_or_default(),
                    id: code.id,
                })
            }
            _ => Ok(Poll::Pending),
        }
    }

    /// `owner`'s signed-in devices, newest first.
    pub async fn list(&self, owner: &str) -> Result<Vec<DeviceCode>, StoreError> {
        statement!(self.db, devices_of(owner, now_secs() as i64))
    }

    /// Notes that the device of sign-in `sid` connected.
    pub async fn used(&self, sid: &str) -> Result<(), StoreError> {
        statement!(self.db, device_used(sid, now_secs() as i64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_codes_are_eight_letters_of_the_alphabet_and_typed_codes_are_read_forgivingly() {
        for _ in 0..100 {
            let code = user_code();
            assert_eq!(code.len(), 9, "{code}");
            assert!(
                code.chars()
                    .filter(|c| *c != '-')
                    .all(|c| ALPHABET.contains(&(c as u8))),
                "{code}"
            );
            assert_eq!(normalize_user_code(&code.to_lowercase().replace('-', " ")), code);
        }
        assert_eq!(normalize_user_code("bcdf-ghjk"), "BCDF-GHJK");
        assert_eq!(normalize_user_code(" BCDFGHJK "), "BCDF-GHJK");
    }
}
