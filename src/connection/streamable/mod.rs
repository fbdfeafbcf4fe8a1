//! Streamable HTTP (the transport RFD's other half of `/acp`): one connection is an
//! `Acp-Connection-Id`, made by the `initialize` POST, that lives in this replica's memory. It is
//! the same bridge as a WebSocket's: the same [`methods::Connection`] takes the client's messages
//! in order (each POST's body is a frame), the same outbox bounds what waits for the client, and
//! the same ends close it (token expiry, sign-out, drain, shutdown, silence). What differs is the
//! writer: instead of one socket, frames are routed to SSE streams ([`streams`]), read by the
//! client's `GET`s ([`sse`]), which give the outbox its room back as they send.
//!
//! Silence: an open stream counts as traffic (its keep-alives, every `ping_interval_secs`), so a
//! connection expires when it has no stream open and posts nothing for as long as a WebSocket
//! may stay silent; `DELETE` ends it at once.

mod sse;
mod streams;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::ws::{Message, Utf8Bytes};
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use super::{close_draining, ends, methods, reader};
use crate::agents::pool::AgentPool;
use crate::gateway::Gateway;
use crate::identity::auth::Identity;
use crate::infra::outbox::{Outbox, OutboxReceiver, Returns};
use crate::session::Client;
use crate::usage::quota::{Counted, Slot};
pub use sse::Reader;
use streams::{Event, Streams};

/// Messages a connection holds before a POST waits for it to take them.
const INBOX: usize = 64;
/// How long `initialize`'s POST waits for the answer.
const INITIALIZE_WAIT: Duration = Duration::from_secs(30);
/// Most bytes of frames one SSE write carries.
const WRITE_BYTES: usize = 256 << 10;

/// This replica's Streamable HTTP connections.
pub struct Registry {
    connections: Mutex<HashMap<Arc<str>, Arc<Conn>>>,
    /// Open SSE streams per user.
    streams_per_user: Arc<Counted<Arc<str>>>,
    /// Session streams one connection may hold.
    streams_per_connection: usize,
}

impl Registry {
    /// A registry allowing `streams_per_user` open SSE streams to a user and
    /// `streams_per_connection` session streams to a connection.
    pub fn new(streams_per_user: usize, streams_per_connection: usize) -> Arc<Self> {
        Arc::new(Self {
            connections: Mutex::new(HashMap::new()),
            streams_per_user: Counted::new(streams_per_user),
            streams_per_connection: streams_per_connection.max(1),
        })
    }

    /// `user`'s connection `id`; `None` for an unknown one or another user's (both look the
    /// same from outside).
    pub fn get(&self, id: &str, user: &str) -> Option<Arc<Conn>> {
        self.connections
            .lock()
            .get(id)
            .filter(|c| &*c.user == user && !c.outbox.is_closed())
            .cloned()
    }
}

/// One Streamable HTTP connection, as the routes reach it.
pub struct Conn {
    /// `Acp-Connection-Id`.
    pub id: Arc<str>,
    /// Whose it is.
    pub user: Arc<str>,
    inbox: mpsc::Sender<Message>,
    streams: Mutex<Streams>,
    returns: Returns,
    outbox: Outbox,
    /// Keep-alive comments on an idle stream, this often.
    keepalive: Duration,
    /// When a stream last told the connection it is read (ms since it was made).
    touched: AtomicU64,
    born: std::time::Instant,
}

/// The connection ended.
#[derive(Debug)]
pub struct Gone;

impl Conn {
    /// Hands the body of a POST to the connection, after those posted before it; with `route`
    /// (its request id and session), its answer goes to that session's stream.
    pub async fn post(&self, text: String, route: Option<(&str, &str)>, session: Option<&str>) -> Result<(), Gone> {
        {
            let mut streams = self.streams.lock();
            if let Some(sid) = session {
                streams.ensure(sid);
            }
            if let Some((id, sid)) = route {
                streams.route(id, sid);
            }
        }
        // Refused once the connection's reading has ended (its receiver is gone).
        self.inbox
            .send(Message::Text(Utf8Bytes::from(text)))
            .await
            .map_err(|_| Gone)
    }

    /// Hands `initialize` (request `id`) to the connection and waits for its answer.
    async fn initialize(&self, id: &str, text: String) -> Option<Utf8Bytes> {
        let (tx, rx) = oneshot::channel();
        self.streams.lock().wait_for(id, tx);
        self.post(text, None, None).await.ok()?;
        tokio::time::timeout(INITIALIZE_WAIT, rx).await.ok()?.ok()
    }

    /// Whether session `sid` has a stream on this connection (it was named in a request's
    /// header or an answer).
    pub fn has_stream(&self, sid: &str) -> bool {
        self.streams.lock().has(sid)
    }

    /// Ends the connection (`DELETE`).
    pub fn delete(&self) {
        self.outbox.close(1000, "connection deleted");
    }

    /// A stream was read: the connection is not silent.
    fn touch(&self) {
        let now = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        if now.saturating_sub(self.touched.swap(now, Ordering::Relaxed)) >= 1000 {
            // A full inbox is traffic enough.
            let _ = self.inbox.try_send(Message::Pong(bytes::Bytes::new()));
        }
    }

    fn give_back<'a>(&self, events: impl Iterator<Item = &'a Event> + Clone) {
        self.returns.written(events.filter(|e| e.counted).map(|e| e.text.len()));
    }
}

/// Why a connection could not be made.
#[derive(Debug)]
pub enum Refused {
    /// `initialize` was not answered in time, or the connection ended first.
    NoAnswer,
    /// `initialize` was answered with an error (the answer).
    Failed(Utf8Bytes),
}

/// Everything a new connection holds for as long as it lives (caps' slots and the like).
pub type Held = Box<dyn Send + Sync>;

/// Makes `identity`'s connection `id` to `pool`, hands it `initialize` (request `init_id`,
/// frame `text`) and returns it with the answer. The connection runs in a tracked task until it
/// ends; `held` is dropped then.
#[expect(clippy::too_many_arguments, reason = "what a connection is made of, each used once")]
pub async fn open(
    registry: &Arc<Registry>,
    gw: &Gateway,
    identity: Identity,
    id: Arc<str>,
    addr: Option<Arc<str>>,
    pool: Arc<AgentPool>,
    (init_id, text): (&str, String),
    held: Held,
) -> Result<(Arc<Conn>, Utf8Bytes), Refused> {
    let limits = &gw.config.limits;
    let (outbox, rx) = crate::infra::outbox::outbox(limits.client_queue, limits.client_queue_bytes);
    let user: Arc<str> = Arc::from(identity.user.as_str());
    let client = Client::new(id.clone(), user.clone(), addr, outbox.clone());
    let (inbox, inbox_rx) = mpsc::channel(INBOX);
    let conn = Arc::new(Conn {
        id: id.clone(),
        user,
        inbox,
        streams: Mutex::new(Streams::new(registry.streams_per_connection)),
        returns: rx.returns(),
        outbox: outbox.clone(),
        keepalive: Duration::from_secs(limits.ping_interval_secs.max(1)),
        touched: AtomicU64::new(0),
        born: std::time::Instant::now(),
    });
    registry.connections.lock().insert(id.clone(), conn.clone());
    metrics::gauge!(crate::infra::metrics::CONNECTIONS).increment(1.0);
    metrics::counter!(crate::infra::metrics::CONNECTIONS_OPENED).increment(1);
    tracing::info!(connection = %id, user = %identity.user, agent = %pool.name, "client connected (Streamable HTTP)");
    let dispatch = methods::Connection::new(gw.clone(), client, pool);
    gw.life.tracker.spawn(run(
        registry.clone(),
        conn.clone(),
        gw.clone(),
        identity,
        dispatch,
        (rx, inbox_rx),
        held,
    ));
    let answer = conn.initialize(init_id, text).await;
    match answer {
        Some(answer) if !is_error(&answer) => Ok((conn, answer)),
        other => {
            conn.delete();
            Err(other.map_or(Refused::NoAnswer, Refused::Failed))
        }
    }
}

/// Whether an answer is a JSON-RPC error.
fn is_error(answer: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Shape<'a> {
        #[serde(borrow, default)]
        error: Option<&'a serde_json::value::RawValue>,
    }
    serde_json::from_str::<Shape<'_>>(answer).is_ok_and(|s| s.error.is_some())
}

/// The connection's life: its messages handed to the bridge in order, its frames routed to
/// its streams, until it ends like a WebSocket would.
async fn run(
    registry: Arc<Registry>,
    conn: Arc<Conn>,
    gw: Gateway,
    identity: Identity,
    mut dispatch: methods::Connection,
    (rx, inbox_rx): (OutboxReceiver, mpsc::Receiver<Message>),
    held: Held,
) {
    let limits = &gw.config.limits;
    let ping_every = Duration::from_secs(limits.ping_interval_secs.max(1));
    let slow_after = Duration::from_secs(limits.slow_client_timeout_secs.max(1));
    let outbox = conn.outbox.clone();
    let reading = async {
        let ends = ends(&gw, &identity, &dispatch, (ping_every * 2).max(slow_after));
        let mut posted = Box::pin(futures_util::stream::unfold(inbox_rx, |mut rx| async move {
            rx.recv().await.map(|m| (Ok::<_, Infallible>(m), rx))
        }));
        let draining =
            reader::read_frames(&mut posted, &mut dispatch, &outbox, ends, &conn.id).await == reader::Ended::Draining;
        if draining {
            close_draining(&gw, &outbox, &conn.id, &identity.user).await;
        }
        outbox.close(1000, "");
        dispatch.finish();
    };
    tokio::join!(reading, route_frames(&conn, rx));
    registry.connections.lock().remove(&conn.id);
    drop(held);
    metrics::gauge!(crate::infra::metrics::CONNECTIONS).decrement(1.0);
    tracing::info!(connection = %conn.id, user = %identity.user, "client disconnected (Streamable HTTP)");
}

/// The writer of a Streamable HTTP connection: takes what the outbox holds and hands each frame
/// to its stream, until the outbox closes (or its drain mark comes); then the streams end once
/// their readers have what was queued.
async fn route_frames(conn: &Conn, mut rx: OutboxReceiver) {
    let mut batch = Vec::new();
    loop {
        if rx.recv_many(&mut batch, 512).await == 0 {
            break;
        }
        let mut back = Vec::new();
        let mut marked = false;
        {
            let mut streams = conn.streams.lock();
            for text in batch.drain(..) {
                if text.is_empty() {
                    // `Outbox::close_when_written`'s mark: what came before it is queued.
                    marked = true;
                    break;
                }
                back.extend(streams.deliver(text));
            }
        }
        batch.clear();
        conn.give_back(back.iter());
        if marked {
            conn.outbox.close_at_mark();
            break;
        }
    }
    let left = conn.streams.lock().end();
    conn.give_back(left.iter());
}

/// Opens a reader of `conn`'s stream `session` (the connection's when `None`) for `user`, who
/// has everything up to `last_event_id`; what an earlier reader took after it is read from
/// `sessions`' store first.
pub async fn read(
    registry: &Registry,
    conn: Arc<Conn>,
    sessions: &crate::session::Sessions,
    session: Option<Arc<str>>,
    last_event_id: Option<&str>,
) -> Result<Reader, ReadRefused> {
    // `seq` (an update) or `seq.n` (the n-th event after it); anything else resumes nothing.
    let last_event_id = last_event_id.and_then(|id| {
        let (seq, n) = id.split_once('.').unwrap_or((id, "0"));
        Some((seq.parse::<u64>().ok()?, n.parse::<u32>().ok()?))
    });
    let slot: Slot<Arc<str>> = registry
        .streams_per_user
        .take(&conn.user)
        .ok_or(ReadRefused::TooManyStreams)?;
    let mut attached = conn
        .streams
        .lock()
        .attach(session.as_deref(), last_event_id)
        .map_err(|_| ReadRefused::TooManyStreams)?;
    conn.give_back(attached.dropped.iter());
    if let Some(sid) = session.as_deref()
        && (attached.replay.is_some() || !attached.again.is_empty())
    {
        let updates = match attached.replay {
            Some((after, upto)) => sse::stored(sessions, &conn.user, sid, after, upto)
                .await
                .map_err(|_| ReadRefused::Store)?,
            None => Vec::new(),
        };
        tracing::info!(
            connection = %conn.id,
            session = %sid,
            from_store = updates.len(),
            again = attached.again.len(),
            "stream resumed after Last-Event-ID"
        );
        let events = streams::merge(updates, std::mem::take(&mut attached.again));
        conn.streams.lock().prepend(Some(sid), attached.reader, events);
    }
    Ok(Reader::new(conn, session, attached, slot))
}

/// Why a stream cannot be read.
#[derive(Debug)]
pub enum ReadRefused {
    /// The user's or the connection's streams are at their cap.
    TooManyStreams,
    /// What an earlier reader lost could not be read from the store.
    Store,
}
