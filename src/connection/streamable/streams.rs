//! Where each frame for a Streamable HTTP client goes, without I/O: the connection-scoped stream
//! or one session's stream (transport RFD), each a queue that keeps its frames until a reader
//! (an open `GET`) takes them. The frames stay counted against the client's outbox until taken,
//! so a client that reads nothing fills it and is fed from the store like a slow WebSocket.
//!
//! - An answer goes where its request was posted for: the stream of the session the request
//!   named, if that stream exists, else the connection's. `session/new`'s answer names a new
//!   session: its stream is made then, to hold what follows until the client opens it.
//! - A notification or request that names a session goes to that session's stream if there is
//!   one, else to the connection's (a client that opens a session's stream only once it sees the
//!   session named, as the Python SDK does after `session/load`, still gets everything).
//! - On a session's stream every event is numbered as it is taken: an update by its `seq`, what
//!   follows it (an answer, an agent's request) as `seq.n`, the n-th since. A reader that comes
//!   back with `Last-Event-ID` gets what was taken after it again, updates from the store and the
//!   rest from a bounded memory of what was taken lately, and no update at or below it.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use axum::extract::ws::Utf8Bytes;
use tokio::sync::{Notify, oneshot};

use crate::protocol::peek::peek_lenient;

/// Answers to requests posted for a session kept routed, at most (the rest go to the
/// connection's stream, which the client always reads).
const MAX_ROUTES: usize = 1024;
/// Events other than updates a session's stream remembers after they are taken, for a reader
/// that comes back with `Last-Event-ID` (updates are read from the store), and their bytes.
const REMEMBERED: usize = 256;
const REMEMBERED_BYTES: usize = 1 << 20;

/// Where an event stands on a session's stream: the last update's `seq` at or before it, and
/// how many other events came after that update (0 for the update itself).
pub(super) type Position = (u64, u32);

/// One frame on its way to a reader.
#[derive(Debug, Clone)]
pub(super) struct Event {
    /// Its `seq` when it is a stored update (the SSE event's `id:`).
    pub seq: Option<u64>,
    pub text: Utf8Bytes,
    /// Counted against the outbox (a live frame); not a replay read from the store.
    pub counted: bool,
    /// For an event other than an update on a session's stream, once taken: where it stands
    /// (its SSE `id:` is `seq.n`).
    pub at: Option<Position>,
}

/// One stream: its frames, its reader, and how far its updates were taken.
#[derive(Debug, Default)]
struct Queue {
    frames: VecDeque<Event>,
    /// The reader taking frames now (its number), and how to wake it.
    reader: Option<(u64, Arc<Notify>)>,
    /// A session's stream: its events are numbered and can be taken again.
    resumable: bool,
    /// Where the last event a reader took stands.
    taken: Position,
    /// Updates at or below this `seq` are not sent (the reader has them: `Last-Event-ID`).
    floor: u64,
    /// Events other than updates taken lately, oldest first, and their bytes.
    remembered: VecDeque<Event>,
    remembered_bytes: usize,
}

impl Queue {
    fn resumable() -> Self {
        Self {
            resumable: true,
            ..Self::default()
        }
    }

    /// Notes `event` as taken: numbers it, and remembers it if it is not an update.
    fn taken(&mut self, event: &mut Event) {
        if !self.resumable {
            return;
        }
        match event.seq {
            Some(seq) => self.taken = (seq, 0),
            None => {
                self.taken.1 = self.taken.1.saturating_add(1);
                event.at = Some(self.taken);
                self.remembered_bytes += event.text.len();
                self.remembered.push_back(Event {
                    counted: false,
                    ..event.clone()
                });
                while self.remembered.len() > REMEMBERED || self.remembered_bytes > REMEMBERED_BYTES {
                    let Some(old) = self.remembered.pop_front() else { break };
                    self.remembered_bytes -= old.text.len();
                }
            }
        }
    }

    fn push(&mut self, event: Event) -> Option<Event> {
        if event.seq.is_some_and(|seq| seq <= self.floor) {
            return Some(event);
        }
        self.frames.push_back(event);
        if let Some((_, wake)) = &self.reader {
            wake.notify_one();
        }
        None
    }
}

/// Which stream: the connection's, or a session's.
pub(super) type Scope<'a> = Option<&'a str>;

/// What [`Streams::attach`] gives a new reader.
#[derive(Debug)]
pub(super) struct Attached {
    /// The reader's number, for [`Streams::take`].
    pub reader: u64,
    /// Woken when frames arrive, the reader is replaced, or the connection ends.
    pub wake: Arc<Notify>,
    /// Updates after the first and up to the second were taken by an earlier reader after what
    /// this one says it has: read them from the store.
    pub replay: Option<(u64, u64)>,
    /// The other events taken after what this reader has, in order: to go back among the
    /// updates read from the store.
    pub again: Vec<Event>,
    /// Live frames dropped because the reader has them (give their room back).
    pub dropped: Vec<Event>,
}

/// What a reader gets from [`Streams::take`].
#[derive(Debug)]
pub(super) enum Take {
    /// Frames, in order.
    Frames(Vec<Event>),
    /// Nothing yet: wait on the reader's `wake`.
    Empty,
    /// Another reader took this stream over, or the connection ended: stop.
    Done,
}

/// Why a stream cannot be opened.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct TooManyStreams;

/// A connection's streams.
#[derive(Debug)]
pub(super) struct Streams {
    connection: Queue,
    sessions: HashMap<Arc<str>, Queue>,
    /// Requests posted for a session, by raw id: their answers go to its stream.
    routes: HashMap<Box<str>, Arc<str>>,
    /// Answers someone waits for in person (`initialize`'s, returned in the POST's body).
    waiting: HashMap<Box<str>, oneshot::Sender<Utf8Bytes>>,
    max_sessions: usize,
    readers: u64,
    ended: bool,
}

impl Streams {
    /// Streams for a connection that may hold `max_sessions` session streams.
    pub fn new(max_sessions: usize) -> Self {
        Self {
            connection: Queue::default(),
            sessions: HashMap::new(),
            routes: HashMap::new(),
            waiting: HashMap::new(),
            max_sessions,
            readers: 0,
            ended: false,
        }
    }

    fn queue(&mut self, scope: Scope<'_>) -> Option<&mut Queue> {
        match scope {
            None => Some(&mut self.connection),
            Some(sid) => self.sessions.get_mut(sid),
        }
    }

    /// Makes session `sid`'s stream if it has none; whether it has one now.
    pub fn ensure(&mut self, sid: &str) -> bool {
        if self.sessions.contains_key(sid) {
            return true;
        }
        if self.sessions.len() >= self.max_sessions {
            return false;
        }
        self.sessions.insert(Arc::from(sid), Queue::resumable());
        true
    }

    /// The client posted request `id` for session `sid`: its answer goes to that stream.
    pub fn route(&mut self, id: &str, sid: &str) {
        if self.routes.len() >= MAX_ROUTES {
            return;
        }
        let sid = self
            .sessions
            .get_key_value(sid)
            .map_or_else(|| Arc::from(sid), |(k, _)| k.clone());
        self.routes.insert(id.into(), sid);
    }

    /// The answer to request `id` is handed to `tx` instead of a stream.
    pub fn wait_for(&mut self, id: &str, tx: oneshot::Sender<Utf8Bytes>) {
        self.waiting.insert(id.into(), tx);
    }

    /// Sends `text` where it goes; what was not queued (an answer someone waited for, an
    /// update a reader already has) is returned, for its room to be given back.
    pub fn deliver(&mut self, text: Utf8Bytes) -> Option<Event> {
        let (seq, scope): (Option<u64>, Option<Arc<str>>) = match peek_lenient(text.as_str()) {
            None => (None, None),
            Some(p) if p.is_answer() => {
                let id = p.id.map(|id| id.get()).unwrap_or_default();
                let routed = self.routes.remove(id);
                if let Some(tx) = self.waiting.remove(id) {
                    let event = Event {
                        seq: None,
                        text: text.clone(),
                        counted: true,
                        at: None,
                    };
                    let _ = tx.send(text);
                    return Some(event);
                }
                // `session/new` (and fork, resume) name a new session: its stream is made now,
                // and holds what follows until the client opens it.
                if let Some(sid) = p.session_id.as_deref() {
                    self.ensure(sid);
                }
                (None, routed.filter(|sid| self.sessions.contains_key(sid)))
            }
            Some(p) => {
                let sid = p.session_id.as_deref().and_then(|sid| self.sessions.get_key_value(sid));
                (p.seq.filter(|_| p.is_update()), sid.map(|(k, _)| k.clone()))
            }
        };
        let event = Event {
            seq,
            text,
            counted: true,
            at: None,
        };
        let queue = match scope {
            Some(sid) => self.sessions.get_mut(&sid),
            None => Some(&mut self.connection),
        };
        match queue {
            Some(q) => q.push(event),
            None => Some(event),
        }
    }

    /// A new reader for the stream `scope`, which has everything up to `last_event_id`; it
    /// replaces the one there was. A session's stream is made if there is none.
    pub fn attach(&mut self, scope: Scope<'_>, last_event_id: Option<Position>) -> Result<Attached, TooManyStreams> {
        if let Some(sid) = scope
            && !self.ensure(sid)
        {
            return Err(TooManyStreams);
        }
        self.readers += 1;
        let reader = self.readers;
        let ended = self.ended;
        let q = self.queue(scope).ok_or(TooManyStreams)?;
        let wake = Arc::new(Notify::new());
        if let Some((_, old)) = q.reader.replace((reader, wake.clone())) {
            old.notify_one();
        }
        let mut dropped = Vec::new();
        let mut replay = None;
        let mut again = Vec::new();
        // Only a session's stream resumes: the connection's carries several sessions' updates.
        if let (Some(last), true) = (last_event_id, q.resumable) {
            if last < q.taken {
                // What was taken after `last` is taken again, numbered as it was.
                replay = (last.0 < q.taken.0).then_some((last.0, q.taken.0));
                let (keep, after): (VecDeque<Event>, VecDeque<Event>) =
                    q.remembered.drain(..).partition(|e| e.at.is_some_and(|at| at <= last));
                q.remembered = keep;
                q.remembered_bytes = q.remembered.iter().map(|e| e.text.len()).sum();
                again = after.into();
                q.taken = last;
            }
            q.floor = q.floor.max(last.0);
            let floor = q.floor;
            let (keep, drop): (VecDeque<Event>, VecDeque<Event>) =
                q.frames.drain(..).partition(|e| e.seq.is_none_or(|seq| seq > floor));
            q.frames = keep;
            dropped.extend(drop.into_iter().filter(|e| e.counted));
        }
        if ended {
            wake.notify_one();
        }
        Ok(Attached {
            reader,
            wake,
            replay,
            again,
            dropped,
        })
    }

    /// Puts `events` (taken before and lost: updates read from the store, the rest remembered)
    /// before what the stream holds, if `reader` is still its reader; updates already queued or
    /// at or below the floor are left out.
    pub fn prepend(&mut self, scope: Scope<'_>, reader: u64, events: Vec<Event>) {
        let Some(q) = self.queue(scope) else { return };
        if q.reader.as_ref().is_none_or(|(r, _)| *r != reader) {
            return;
        }
        let first_queued = q.frames.iter().find_map(|e| e.seq).unwrap_or(u64::MAX);
        let floor = q.floor;
        for event in events.into_iter().rev() {
            if event.seq.is_none_or(|seq| seq > floor && seq < first_queued) {
                q.frames.push_front(event);
            }
        }
        if let Some((_, wake)) = &q.reader {
            wake.notify_one();
        }
    }

    /// Up to `max_bytes` of frames (at least one) for `reader` of `scope`.
    pub fn take(&mut self, scope: Scope<'_>, reader: u64, max_bytes: usize) -> Take {
        let ended = self.ended;
        let Some(q) = self.queue(scope) else { return Take::Done };
        if q.reader.as_ref().is_none_or(|(r, _)| *r != reader) {
            return Take::Done;
        }
        if q.frames.is_empty() {
            return if ended { Take::Done } else { Take::Empty };
        }
        let mut out = Vec::new();
        let mut bytes = 0;
        while let Some(event) = q.frames.front() {
            if !out.is_empty() && bytes + event.text.len() > max_bytes {
                break;
            }
            bytes += event.text.len();
            let Some(mut event) = q.frames.pop_front() else { break };
            q.taken(&mut event);
            out.push(event);
        }
        Take::Frames(out)
    }

    /// `reader` of `scope` is gone (its response ended); the stream keeps its frames.
    pub fn detach(&mut self, scope: Scope<'_>, reader: u64) {
        if let Some(q) = self.queue(scope)
            && q.reader.as_ref().is_some_and(|(r, _)| *r == reader)
        {
            q.reader = None;
        }
    }

    /// Whether session `sid` has a stream.
    pub fn has(&self, sid: &str) -> bool {
        self.sessions.contains_key(sid)
    }

    /// The connection ended: readers finish what is queued and stop; what was queued with no
    /// reader is returned (its room given back).
    pub fn end(&mut self) -> Vec<Event> {
        self.ended = true;
        self.waiting.clear();
        let mut left = Vec::new();
        for q in std::iter::once(&mut self.connection).chain(self.sessions.values_mut()) {
            match &q.reader {
                Some((_, wake)) => wake.notify_one(),
                None => left.extend(q.frames.drain(..).filter(|e| e.counted)),
            }
        }
        left
    }
}

/// `updates` read from the store and `again`, the other events taken with them (numbered), in
/// the order they were taken, unnumbered (they are numbered again as they are taken again).
pub(super) fn merge(updates: Vec<Event>, again: Vec<Event>) -> Vec<Event> {
    let key = |e: &Event| e.at.or(e.seq.map(|seq| (seq, 0))).unwrap_or_default();
    let mut out: Vec<Event> = updates.into_iter().chain(again).collect();
    out.sort_by_key(key);
    for e in &mut out {
        e.at = None;
    }
    out
}

#[cfg(test)]
#[path = "streams_tests.rs"]
mod tests;
