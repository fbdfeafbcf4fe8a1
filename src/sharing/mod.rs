//! Sharing a session with a teammate: its owner lets named users, or whoever opens a link, reach
//! one session as an **observer** (sees it live and its history; cannot prompt, answer or cancel)
//! or a **controller** (may also prompt and answer). Shares live in the store, so every replica
//! sees them; a link's token is shown once and only its SHA-256 is stored. A share that is revoked
//! or expires answers like an unknown session, and the clients it let in are closed
//! ([`Shares::lost`] lists them for the watcher that closes them).
//!
//! A controller's prompt runs on the owner's agent process: it runs commands as the owner, with
//! their `HOME`, workspaces and agent logins. So the role is always named (never a default), a
//! controller link ends after [`CONTROLLER_LINK_SECS`] unless the owner says when, and what the
//! owner stored as secrets is withheld (see `connection::methods::withheld`).

mod store;
mod watch;

pub use store::{ACCESS_PAIRS_PER_STATEMENT, MemberAccess, NewShare, ShareAccess, ShareRow, ShareStore, SharedSession};
pub use watch::{Cadence, ShareWatch};

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};

use base64::Engine as _;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::protocol::{RpcError, codes};
use crate::session::Client;
use crate::store::now_micros;

/// Most shares one session may have.
pub const MAX_SHARES_PER_SESSION: i64 = 32;
/// Longest a share may last (a year); shares without an end are allowed too.
pub const MAX_SHARE_SECS: u64 = 365 * 24 * 3600;
/// How long a controller link lasts when its owner does not say (a day): whoever holds the link
/// runs commands as the owner, and links get forwarded.
pub const CONTROLLER_LINK_SECS: u64 = 24 * 3600;
/// Most ended shares one pass of [`Shares::purge_expired`] forgets at once.
const PURGE_BATCH: i64 = 1000;
/// Most entries `shared with me` lists.
const SHARED_WITH_LIMIT: i64 = 200;
/// The WebSocket close code for a client whose share ended (policy violation).
pub const CLOSE_SHARE_ENDED: u16 = 1008;
/// A link's token starts with this (so it is recognisable in a paste or a leak scanner).
const TOKEN_PREFIX: &str = "acpshare_";

/// What a share lets its holder do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Sees the session live and its history; nothing more.
    Observer,
    /// May also prompt, answer the agent's requests, change its controls and cancel.
    Controller,
}

impl Role {
    /// `observer` or `controller`; `None` for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "observer" => Some(Self::Observer),
            "controller" => Some(Self::Controller),
            _ => None,
        }
    }

    /// A share's role as stored (the table allows only the two; anything else gives the least).
    pub fn of(stored: &str) -> Self {
        Self::parse(stored).unwrap_or(Self::Observer)
    }

    /// As stored and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Observer => "observer",
            Self::Controller => "controller",
        }
    }
}

/// The error for an observer trying what only a controller may.
pub fn observer_refused(what: &str) -> RpcError {
    RpcError::new(
        codes::INVALID_REQUEST,
        format!("you observe this session: {what} is for its owner and controllers"),
    )
    .with_data(json!({ "reason": "observer" }))
}

/// The error for a controller's prompt on an agent that carries `owner`'s stored agent `keys`
/// or `mcp` servers' secrets, which their share does not lend.
pub fn owner_keys_refused(owner: &str, keys: bool, mcp: bool) -> RpcError {
    let what = match (keys, mcp) {
        (true, true) => format!("the agent keys {owner} stored and {owner}'s MCP servers' secret headers"),
        (true, false) => format!("the agent keys {owner} stored"),
        _ => format!("{owner}'s MCP servers' secret headers"),
    };
    RpcError::new(
        codes::INVALID_REQUEST,
        format!(
            "{owner}'s agent for this session runs with {what}, and your share does not lend them: \
             ask {owner} to send this prompt, or to share the session with you again allowing their keys"
        ),
    )
    .with_data(json!({ "reason": "owner_keys", "keys": keys, "mcpHeaders": mcp }))
}

/// A new link token (shown once).
fn new_token() -> String {
    let bytes: [u8; 32] = rand::random();
    format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// What is stored of a link token.
pub fn token_hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A share as its owner's list shows it.
pub fn share_json(row: &ShareRow) -> Value {
    json!({
        "id": row.id,
        "sessionId": row.session_id,
        "role": row.role,
        "user": row.grantee,
        "link": row.link,
        "members": row.members,
        "createdAt": crate::store::iso8601(row.created_at),
        "expiresAt": row.expires_at.map(crate::store::iso8601),
        "ownerKeys": row.owner_keys,
    })
}

/// A session shared with the caller, as their list shows it.
pub fn shared_json(s: &SharedSession) -> Value {
    json!({
        "sessionId": s.session_id,
        "owner": s.owner,
        "role": s.role,
        "title": s.title,
        "agent": s.agent,
        "updatedAt": crate::store::iso8601(s.updated_at),
        "expiresAt": s.expires_at.map(crate::store::iso8601),
    })
}

/// What the owner asks for.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// What it lets its holder do.
    pub role: Role,
    /// A user by name, or `None` for a link.
    pub user: Option<&'a str>,
    /// How long it lasts, or `None` for until revoked (a controller link: a day).
    pub expires_in_secs: Option<u64>,
    /// Whether a controller's prompts may run on the owner's agent while it carries their stored
    /// keys or MCP servers' headers.
    pub owner_keys: bool,
}

/// A share just made: its row and, for a link, the token (never shown again).
#[derive(Debug)]
pub struct Made {
    /// As stored.
    pub row: ShareRow,
    /// The link's token.
    pub token: Option<String>,
}

/// A client let into a session by a share, checked until it leaves.
#[derive(Debug, Clone)]
pub struct Watched {
    /// The client (gone: nothing to check).
    pub client: Weak<Client>,
    /// The session.
    pub session: Arc<str>,
    /// The share it came in by.
    pub share: String,
    /// What that share let it do (a share now giving less ends its access too).
    pub role: String,
    /// When the share ends (epoch µs), if it does.
    pub expires_at: Option<i64>,
}

/// Shares: made, listed, revoked and opened through the store; the clients they let in, watched.
#[derive(Debug)]
pub struct Shares {
    store: ShareStore,
    watched: Mutex<Vec<Watched>>,
    /// Wakes the watcher when a share is revoked here.
    pub revoked: tokio::sync::Notify,
}

impl Shares {
    /// Shares kept in `store`.
    pub fn new(store: ShareStore) -> Self {
        Self {
            store,
            watched: Mutex::default(),
            revoked: tokio::sync::Notify::new(),
        }
    }

    /// `owner` shares their session `sid`; `-32002` when it is not theirs (or not there).
    pub async fn create(&self, owner: &str, sid: &str, r: &Request<'_>) -> Result<Made, RpcError> {
        if r.user == Some(owner) {
            return Err(RpcError::invalid_params("a session cannot be shared with its owner"));
        }
        if let Some(user) = r.user
            && (user.is_empty() || user.len() > 256)
        {
            return Err(RpcError::invalid_params("user must be 1 to 256 bytes"));
        }
        if r.owner_keys && r.role != Role::Controller {
            return Err(RpcError::invalid_params(
                "ownerKeys is for controller shares (an observer never prompts)",
            ));
        }
        let now = now_micros();
        let asked = match (r.expires_in_secs, r.role, r.user) {
            (None, Role::Controller, None) => Some(CONTROLLER_LINK_SECS),
            (asked, ..) => asked,
        };
        let expires_at = match asked {
            Some(0) => return Err(RpcError::invalid_params("expiresInSecs must be at least 1")),
            Some(s) if s > MAX_SHARE_SECS => {
                return Err(RpcError::invalid_params(format!(
                    "expiresInSecs must be at most {MAX_SHARE_SECS} (a year); leave it out for a share that lasts until revoked"
                )));
            }
            Some(s) => Some(now.saturating_add(i64::try_from(s).unwrap_or(i64::MAX).saturating_mul(1_000_000))),
            None => None,
        };
        let token = r.user.is_none().then(new_token);
        let hash = token.as_deref().map(token_hash);
        let id = format!("shr_{}", uuid::Uuid::new_v4().simple());
        let new = NewShare {
            id: &id,
            session_id: sid,
            owner,
            grantee: r.user,
            token_hash: hash.as_ref().map(<[u8; 32]>::as_slice),
            role: r.role.as_str(),
            created_at: now,
            expires_at,
            owner_keys: r.owner_keys,
        };
        if !self.store.create(&new, MAX_SHARES_PER_SESSION).await? {
            // Refused: not a session of theirs (it lists no shares of theirs), or the cap.
            if self.store.of_session(owner, sid, now).await?.is_empty() {
                return Err(RpcError::session_not_found());
            }
            return Err(RpcError::new(
                codes::CAP_REACHED,
                format!("a session may have at most {MAX_SHARES_PER_SESSION} shares; revoke one first"),
            )
            .with_data(json!({ "cap": "shares_per_session", "limit": MAX_SHARES_PER_SESSION })));
        }
        let row = ShareRow {
            id,
            session_id: sid.to_string(),
            owner: owner.to_string(),
            grantee: r.user.map(str::to_string),
            link: token.is_some(),
            role: r.role.as_str().to_string(),
            created_at: now,
            expires_at,
            members: 0,
            owner_keys: r.owner_keys,
        };
        Ok(Made { row, token })
    }

    /// The shares of `owner`'s session `sid` in force now.
    pub async fn list(&self, owner: &str, sid: &str) -> Result<Vec<ShareRow>, RpcError> {
        Ok(self.store.of_session(owner, sid, now_micros()).await?)
    }

    /// Revokes the share `id` of `owner`'s session `sid`: the clients it let in are closed.
    pub async fn revoke(&self, owner: &str, sid: &str, id: &str) -> Result<(), RpcError> {
        if !self.store.delete(owner, sid, id).await? {
            return Err(RpcError::new(codes::RESOURCE_NOT_FOUND, "share not found"));
        }
        self.revoked.notify_one();
        Ok(())
    }

    /// `user` opens a link: the share it names, now theirs to use; an unknown, revoked or
    /// expired link gets the same `-32002`.
    pub async fn redeem(&self, user: &str, token: &str) -> Result<ShareRow, RpcError> {
        if !token.starts_with(TOKEN_PREFIX) || token.len() > 128 {
            return Err(RpcError::new(codes::RESOURCE_NOT_FOUND, "share link not found"));
        }
        let now = now_micros();
        let share = self
            .store
            .link(&token_hash(token), now)
            .await?
            .ok_or_else(|| RpcError::new(codes::RESOURCE_NOT_FOUND, "share link not found"))?;
        // Its owner is not a member: the session is theirs anyway.
        if share.owner != user
            && let Err(e) = self.store.join(&share.id, user, now).await
        {
            // Revoked meanwhile (its row is gone): as unknown as any ended link.
            if self.store.link(&token_hash(token), now).await?.is_none() {
                return Err(RpcError::new(codes::RESOURCE_NOT_FOUND, "share link not found"));
            }
            return Err(e.into());
        }
        Ok(share)
    }

    /// What lets `user` reach session `sid`, which is not theirs, now.
    pub async fn access(&self, user: &str, sid: &str) -> Result<Option<ShareAccess>, RpcError> {
        Ok(self.store.access(user, sid, now_micros()).await?)
    }

    /// Whether a share lets `user` control session `sid` now (asked of the store, where a share
    /// revoked on any replica is gone). A store that cannot answer says no: nothing of a
    /// teammate's goes to the owner's agent unchecked.
    pub async fn controls(&self, user: &str, sid: &str) -> bool {
        match self.access(user, sid).await {
            Ok(access) => access.is_some_and(|a| Role::of(&a.role) == Role::Controller),
            Err(e) => {
                tracing::warn!(session = %sid, user, error = %e.message, "cannot check a teammate's share; refused");
                false
            }
        }
    }

    /// Forgets every share that has ended, [`PURGE_BATCH`] to a statement; how many. A store
    /// that fails is logged and asked again at the next pass.
    pub async fn purge_expired(&self) -> u64 {
        let now = now_micros();
        let mut total = 0;
        loop {
            match self.store.purge_expired(now, PURGE_BATCH).await {
                Ok(n) => {
                    total += n;
                    if n < PURGE_BATCH.unsigned_abs() {
                        return total;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot purge ended shares; trying again later");
                    return total;
                }
            }
        }
    }

    /// Sessions shared with `user` now, one entry per session (the share giving the most).
    pub async fn shared_with(&self, user: &str) -> Result<Vec<SharedSession>, RpcError> {
        let rows = self.store.shared_with(user, now_micros(), SHARED_WITH_LIMIT).await?;
        let mut out: Vec<SharedSession> = Vec::with_capacity(rows.len());
        for row in rows {
            match out.iter_mut().find(|s| s.session_id == row.session_id) {
                Some(seen) if seen.role == "observer" && row.role == "controller" => *seen = row,
                Some(_) => {}
                None => out.push(row),
            }
        }
        Ok(out)
    }

    /// Watches `client`, let into `session` by `access`, until it leaves or the share ends.
    pub fn watch(&self, client: &Arc<Client>, access: &ShareAccess) {
        let mut w = self.lock();
        w.retain(|x| x.client.strong_count() > 0);
        let entry = Watched {
            client: Arc::downgrade(client),
            session: Arc::from(access.session_id.as_str()),
            share: access.share_id.clone(),
            role: access.role.clone(),
            expires_at: access.expires_at,
        };
        match w
            .iter_mut()
            .find(|x| x.session == entry.session && std::ptr::eq(x.client.as_ptr(), Arc::as_ptr(client)))
        {
            Some(x) => *x = entry,
            None => w.push(entry),
        }
    }

    /// Stops watching `client` for `session` (it detached).
    pub fn unwatch(&self, client: &Client, session: &str) {
        self.lock()
            .retain(|x| !(&*x.session == session && std::ptr::eq(x.client.as_ptr(), client)));
    }

    /// The watched clients still connected (forgetting the others).
    pub fn watched(&self) -> Vec<Watched> {
        let mut w = self.lock();
        w.retain(|x| x.client.upgrade().is_some_and(|c| !c.is_closed()));
        w.clone()
    }

    /// Whether a watched client's share has passed its end by the clock.
    pub fn any_expired(&self) -> bool {
        let now = now_micros();
        self.lock().iter().any(|w| w.expires_at.is_some_and(|e| e <= now))
    }

    /// Forgets `gone` (their share ended and they were closed).
    pub fn forget(&self, gone: &[Watched]) {
        self.lock().retain(|x| {
            !gone
                .iter()
                .any(|g| g.session == x.session && std::ptr::eq(g.client.as_ptr(), x.client.as_ptr()))
        });
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Vec<Watched>> {
        self.watched.lock()
    }

    /// Of the watched clients, those whose share no longer lets them in: expired by the clock,
    /// or (`recheck`) no longer giving them access in the store (revoked, or the session gone).
    /// A share still in force that gives as much is enough: a client kept by another share
    /// has its watch moved to it. A store that fails keeps the clients it could not check (they
    /// are checked again next time) and never keeps one whose share expired by the clock.
    pub async fn lost(&self, recheck: bool) -> Vec<Watched> {
        let now = now_micros();
        let expired = |w: &Watched| w.expires_at.is_some_and(|e| e <= now);
        let watched = self.watched();
        if !recheck {
            return watched.into_iter().filter(expired).collect();
        }
        let clients: Vec<(Watched, Arc<Client>)> = watched
            .into_iter()
            .filter_map(|w| w.client.upgrade().map(|c| (w, c)))
            .collect();
        // One question per user and session, many to a statement.
        let mut pairs: Vec<(&str, &str)> = clients.iter().map(|(w, c)| (&*c.user, &*w.session)).collect();
        pairs.sort_unstable();
        pairs.dedup();
        let mut found: HashMap<(String, String), ShareAccess> = HashMap::new();
        let mut unknown: HashSet<(String, String)> = HashSet::new();
        for chunk in pairs.chunks(ACCESS_PAIRS_PER_STATEMENT) {
            match self.store.accesses(chunk, now).await {
                Ok(rows) => {
                    for r in rows {
                        found.insert((r.member, r.access.session_id.clone()), r.access);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, clients = chunk.len(), "cannot check shares");
                    unknown.extend(chunk.iter().map(|(u, s)| ((*u).to_string(), (*s).to_string())));
                }
            }
        }
        let mut lost = Vec::new();
        for (w, client) in clients {
            let pair = (client.user.to_string(), w.session.to_string());
            if unknown.contains(&pair) {
                if expired(&w) {
                    lost.push(w);
                }
                continue;
            }
            match found.get(&pair) {
                Some(a) if Role::of(&a.role) >= Role::of(&w.role) => {
                    if a.share_id != w.share || a.expires_at != w.expires_at {
                        self.watch(
                            &client,
                            &ShareAccess {
                                role: w.role.clone(),
                                ..a.clone()
                            },
                        );
                    }
                }
                _ => lost.push(w),
            }
        }
        lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_read_and_order() {
        assert_eq!(Role::parse("observer"), Some(Role::Observer));
        assert_eq!(Role::parse("controller"), Some(Role::Controller));
        assert_eq!(Role::parse("owner"), None);
        assert_eq!(
            Role::of("owner"),
            Role::Observer,
            "an unknown stored role gives the least"
        );
        assert!(Role::Controller > Role::Observer);
    }

    #[test]
    fn tokens_are_unique_and_only_their_hash_is_kept() {
        let (a, b) = (new_token(), new_token());
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX) && a.len() > 40);
        assert_eq!(token_hash(&a), token_hash(&a));
        assert_ne!(token_hash(&a), token_hash(&b));
    }
}
