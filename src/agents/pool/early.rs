//! Updates an agent sent for a session id that no route knows yet, held for a few seconds.
//!
//! Agents talk the moment they have answered `session/new` (claude-code-acp and codex-acp send
//! `available_commands_update`, sometimes `current_mode_update` or `config_option_update`, the
//! demo agent's `--showcase` its slash commands). The stdout reader reads those lines before the
//! task that asked has stored the session and bound the id to it. The other source of updates
//! for an unknown id is a restore: an agent that replays its history before answering
//! `session/load` (or resume) names an id no route has yet, and that replay must not be stored
//! twice (the gateway has its own transcript).
//!
//! So the reader parks whatever it cannot route here, and the binder decides: a new session
//! claims its id as soon as the agent's answer is in ([`Held::claim`]) and takes what was held
//! (then and later) once it is bound; any other binding forgets what was held for the id.
//! Unclaimed entries go after [`TTL`]; the whole buffer is capped at [`MAX_ENTRIES`] and
//! [`MAX_BYTES`] per process, the oldest unclaimed entry making room for a newer one, so an agent
//! writing for ids it never creates holds at most that much. A claimed id's update is never
//! dropped: when only claimed entries are left and no room, [`Held::park`] refuses it and the
//! reader waits for a claim to end (its client may already be prompting the session).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::value::RawValue;

/// Most updates held per process.
pub const MAX_ENTRIES: usize = 64;
/// Most bytes held per process (ids, updates and `_meta`, plus [`ENTRY_OVERHEAD`] each).
pub const MAX_BYTES: usize = 256 << 10;
/// How long an update for an id nobody claimed is kept.
pub const TTL: Duration = Duration::from_secs(5);
/// What an entry costs beyond its text (allocations, bookkeeping), for the byte cap.
const ENTRY_OVERHEAD: usize = 64;

/// One update held for an id.
#[derive(Debug)]
pub struct Entry {
    /// The agent's session id it names.
    sid: Box<str>,
    /// `params.update`, raw.
    pub update: Box<RawValue>,
    /// `params._meta`, raw.
    pub meta: Option<Box<RawValue>>,
    /// When it was read (unclaimed entries expire).
    at: Instant,
    /// What it counts against [`MAX_BYTES`].
    bytes: usize,
}

/// The held updates of one process, in the order they were read, and the ids claimed by
/// sessions being created.
#[derive(Debug, Default)]
pub struct Held {
    /// Oldest first.
    entries: VecDeque<Entry>,
    /// Sum of the entries' `bytes`.
    bytes: usize,
    /// Ids of sessions being created: their entries neither expire nor make room for others,
    /// and their later updates are held too until the session takes them. An id appears once
    /// per claim (an agent may give the same id twice; each claim ends on its own).
    claims: Vec<Claim>,
}

/// A session being created claims its agent session id.
#[derive(Debug)]
struct Claim {
    sid: Arc<str>,
    /// Its session is handing on what was held: later updates wait instead of being held.
    handing: bool,
}

impl Held {
    /// Whether a session being created claims `sid` (no work when nothing is claimed: the
    /// streaming path's only cost).
    pub fn is_claimed(&self, sid: &str) -> bool {
        !self.claims.is_empty() && self.claims.iter().any(|c| *c.sid == *sid)
    }

    /// Whether the session claiming `sid` is handing on what was held for it.
    pub fn handing(&self, sid: &str) -> bool {
        self.claims.iter().any(|c| c.handing && *c.sid == *sid)
    }

    /// Holds an update for `sid`; `false` when there is no room (the caller drops it, or for a
    /// claimed id waits for room). Expired entries go first, then the oldest unclaimed ones
    /// while room is short.
    pub fn park(&mut self, sid: &str, update: &RawValue, meta: Option<&RawValue>, now: Instant) -> bool {
        self.expire(now);
        let bytes = sid.len() + update.get().len() + meta.map_or(0, |m| m.get().len()) + ENTRY_OVERHEAD;
        if bytes > MAX_BYTES {
            return false;
        }
        while self.entries.len() >= MAX_ENTRIES || self.bytes + bytes > MAX_BYTES {
            let Some(oldest) = self.entries.iter().position(|e| !self.is_claimed(&e.sid)) else {
                return false;
            };
            self.remove(oldest);
        }
        self.bytes += bytes;
        self.entries.push_back(Entry {
            sid: sid.into(),
            update: update.to_owned(),
            meta: meta.map(RawValue::to_owned),
            at: now,
            bytes,
        });
        true
    }

    /// A session being created claims `sid`.
    pub fn claim(&mut self, sid: Arc<str>) {
        self.claims.push(Claim { sid, handing: false });
    }

    /// Ends one claim of `sid`, one that is `handing` if there is one (what is still held for
    /// the id is then unclaimed: it expires).
    pub fn unclaim(&mut self, sid: &str, handing: bool) {
        let mine = |c: &Claim| *c.sid == *sid;
        let found = self.claims.iter().position(|c| mine(c) && c.handing == handing);
        if let Some(i) = found.or_else(|| self.claims.iter().position(mine)) {
            self.claims.swap_remove(i);
        }
    }

    /// Takes what is held for `sid`, oldest first, for its claiming session to hand on: until
    /// it unclaims, [`Held::handing`] says so.
    pub fn take_for_handing(&mut self, sid: &str) -> Vec<Entry> {
        if let Some(c) = self.claims.iter_mut().find(|c| *c.sid == *sid) {
            c.handing = true;
        }
        self.take(sid)
    }

    /// Takes what is held for `sid`, oldest first.
    pub fn take(&mut self, sid: &str) -> Vec<Entry> {
        if !self.entries.iter().any(|e| *e.sid == *sid) {
            return Vec::new();
        }
        let (mine, rest): (Vec<Entry>, Vec<Entry>) = self.entries.drain(..).partition(|e| *e.sid == *sid);
        self.entries = rest.into();
        self.bytes -= mine.iter().map(|e| e.bytes).sum::<usize>();
        mine
    }

    /// Drops what is held for `sid`; returns how many.
    pub fn forget(&mut self, sid: &str) -> usize {
        self.take(sid).len()
    }

    /// Drops every entry (the process ended); claims stay with their sessions.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// Drops unclaimed entries older than [`TTL`].
    fn expire(&mut self, now: Instant) {
        let due = |e: &Entry| now.saturating_duration_since(e.at) >= TTL;
        if !self.entries.iter().any(due) {
            return;
        }
        let mut i = 0;
        while i < self.entries.len() {
            if due(&self.entries[i]) && !self.is_claimed(&self.entries[i].sid) {
                self.remove(i);
            } else {
                i += 1;
            }
        }
    }

    fn remove(&mut self, i: usize) {
        if let Some(e) = self.entries.remove(i) {
            self.bytes -= e.bytes;
        }
    }
}

#[cfg(test)]
impl Held {
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_string()).expect("raw")
    }

    fn texts(entries: &[Entry]) -> Vec<&str> {
        entries.iter().map(|e| e.update.get()).collect()
    }

    #[test]
    fn what_is_held_for_an_id_comes_back_in_order_and_only_for_it() {
        let mut held = Held::default();
        let now = Instant::now();
        for (sid, u) in [("a", "1"), ("b", "9"), ("a", "2"), ("a", "3")] {
            assert!(held.park(sid, &raw(u), None, now));
        }
        let a = held.take("a");
        assert_eq!(texts(&a), ["1", "2", "3"]);
        assert_eq!(held.len(), 1);
        assert!(held.take("a").is_empty());
        assert_eq!(held.forget("b"), 1);
        assert!(held.is_empty());
        assert_eq!(held.bytes(), 0);
    }

    #[test]
    fn meta_is_kept_with_its_update() {
        let mut held = Held::default();
        held.park("a", &raw(r#"{"k":1}"#), Some(&raw(r#"{"m":2}"#)), Instant::now());
        let a = held.take("a");
        assert_eq!(a[0].meta.as_deref().map(RawValue::get), Some(r#"{"m":2}"#));
    }

    #[test]
    fn unclaimed_entries_expire_and_claimed_ones_do_not() {
        let mut held = Held::default();
        let then = Instant::now();
        held.park("ghost", &raw("1"), None, then);
        held.park("mine", &raw("2"), None, then);
        held.claim(Arc::from("mine"));
        held.park("other", &raw("3"), None, then + TTL);
        assert_eq!(held.len(), 2, "the ghost's went");
        assert_eq!(texts(&held.take("mine")), ["2"]);
        assert!(!held.handing("mine"));
        held.park("mine", &raw("4"), None, then + TTL);
        assert_eq!(texts(&held.take_for_handing("mine")), ["4"]);
        assert!(held.handing("mine"));
        held.unclaim("mine", true);
        assert!(!held.is_claimed("mine"));
        assert!(!held.handing("mine"));
    }

    #[test]
    fn an_agent_writing_for_ids_it_never_creates_holds_at_most_the_caps() {
        let mut held = Held::default();
        let now = Instant::now();
        for i in 0..10 * MAX_ENTRIES {
            assert!(held.park(&format!("ghost-{i}"), &raw("{}"), None, now));
        }
        assert_eq!(held.len(), MAX_ENTRIES);
        assert_eq!(
            texts(&held.take(&format!("ghost-{}", 10 * MAX_ENTRIES - 1))),
            ["{}"],
            "the newest stay"
        );
        let big = format!("\"{}\"", "x".repeat(MAX_BYTES / 8));
        for i in 0..100 {
            held.park(&format!("big-{i}"), &raw(&big), None, now);
        }
        assert!(held.bytes() <= MAX_BYTES, "{}", held.bytes());
        let huge = format!("\"{}\"", "x".repeat(MAX_BYTES));
        assert!(
            !held.park("huge", &raw(&huge), None, now),
            "one update over the byte cap is not held"
        );
    }

    #[test]
    fn claimed_entries_are_not_pushed_out_and_a_full_claimed_buffer_refuses() {
        let mut held = Held::default();
        let now = Instant::now();
        held.claim(Arc::from("mine"));
        for i in 0..MAX_ENTRIES {
            assert!(held.park("mine", &raw(&i.to_string()), None, now));
        }
        assert!(!held.park("ghost", &raw("{}"), None, now), "no room for others");
        assert_eq!(held.take("mine").len(), MAX_ENTRIES);
    }

    #[test]
    fn each_claim_ends_on_its_own() {
        let mut held = Held::default();
        held.claim(Arc::from("a"));
        held.claim(Arc::from("a"));
        held.unclaim("a", false);
        assert!(held.is_claimed("a"));
        held.unclaim("a", false);
        assert!(!held.is_claimed("a"));
        held.unclaim("a", false);
    }
}
