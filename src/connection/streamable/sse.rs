//! A reader of one Streamable HTTP stream: the body of a `GET /acp`, as Server-Sent Events.
//! Each frame is one event (`data:`), a stored update's with `id:` = its `seq`; an idle stream
//! gets a keep-alive comment every ping interval. It gives the outbox its room back as it
//! takes frames, and lets go of its stream when the response ends (the client went, or another
//! reader of the same stream replaced it).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::Stream;
use futures_util::future::BoxFuture;

use super::streams::{Attached, Event, Take};
use super::{Conn, WRITE_BYTES};
use crate::infra::outbox::CLOSE_TOO_SLOW;
use crate::usage::quota::Slot;

/// What a keep-alive writes.
const KEEPALIVE: &[u8] = b": keep-alive\n\n";

/// The body of an SSE response.
pub struct Reader {
    state: Option<Arc<State>>,
    next: Option<BoxFuture<'static, Option<Bytes>>>,
}

struct State {
    conn: Arc<Conn>,
    session: Option<Arc<str>>,
    attached: Attached,
    _slot: Slot<Arc<str>>,
}

impl Drop for State {
    fn drop(&mut self) {
        self.conn
            .streams
            .lock()
            .detach(self.session.as_deref(), self.attached.reader);
    }
}

impl Reader {
    pub(super) fn new(conn: Arc<Conn>, session: Option<Arc<str>>, attached: Attached, slot: Slot<Arc<str>>) -> Self {
        Self {
            state: Some(Arc::new(State {
                conn,
                session,
                attached,
                _slot: slot,
            })),
            next: None,
        }
    }
}

/// The next write: frames, a keep-alive, or `None` when the stream is over.
async fn next(state: Arc<State>) -> Option<Bytes> {
    loop {
        let take = state
            .conn
            .streams
            .lock()
            .take(state.session.as_deref(), state.attached.reader, WRITE_BYTES);
        match take {
            Take::Frames(events) => {
                state.conn.give_back(events.iter());
                state.conn.touch();
                return Some(format(&events));
            }
            Take::Done => return None,
            Take::Empty => {
                tokio::select! {
                    () = state.attached.wake.notified() => {}
                    () = tokio::time::sleep(state.conn.keepalive) => {
                        state.conn.touch();
                        return Some(Bytes::from_static(KEEPALIVE));
                    }
                    // A connection closed for reading nothing ends its streams at once.
                    () = state.conn.outbox.closed(), if state.conn.outbox.close_reason().is_some_and(|r| r.code == CLOSE_TOO_SLOW) => return None,
                }
            }
        }
    }
}

impl Stream for Reader {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let Some(state) = &this.state else {
            return Poll::Ready(None);
        };
        let fut = this.next.get_or_insert_with(|| Box::pin(next(state.clone())));
        match fut.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(out) => {
                this.next = None;
                if out.is_none() {
                    this.state = None;
                }
                Poll::Ready(out.map(Ok))
            }
        }
    }
}

/// `events` as SSE: `id:` for a stored update, its frame as `data:` (a frame never holds a line
/// break outside a string, where JSON allows none, so one that does is split at it: the client
/// joins `data:` lines with line feeds, which JSON reads as white space).
pub(super) fn format(events: &[Event]) -> Bytes {
    let mut out = BytesMut::with_capacity(events.iter().map(|e| e.text.len() + 32).sum());
    for event in events {
        let id = match (event.seq, event.at) {
            (Some(seq), _) => Some(seq.to_string()),
            (None, Some((seq, n))) => Some(format!("{seq}.{n}")),
            (None, None) => None,
        };
        if let Some(id) = id {
            out.put_slice(b"id: ");
            out.put_slice(id.as_bytes());
            out.put_u8(b'\n');
        }
        for line in event.text.as_str().split(['\n', '\r']) {
            out.put_slice(b"data: ");
            out.put_slice(line.as_bytes());
            out.put_u8(b'\n');
        }
        out.put_u8(b'\n');
    }
    out.freeze()
}

/// The stored updates of `owner`'s session `sid` after `after` up to `upto`, as events.
pub(super) async fn stored(
    sessions: &crate::session::Sessions,
    owner: &str,
    sid: &str,
    after: u64,
    upto: u64,
) -> Result<Vec<Event>, crate::store::StoreError> {
    let mut id_json = String::new();
    crate::protocol::push_json_str(&mut id_json, sid);
    let mut out = Vec::new();
    let mut cursor = after;
    while cursor < upto {
        let chunks = crate::store::in_time(sessions.store().read_events(
            owner,
            sid,
            i64::try_from(cursor).unwrap_or(i64::MAX),
            crate::store::READ_PAGE_CHUNKS,
        ))
        .await?;
        let before = cursor;
        for chunk in chunks {
            for (seq, update) in chunk.updates() {
                if seq <= cursor || seq > upto {
                    continue;
                }
                out.push(Event {
                    seq: Some(seq),
                    text: crate::protocol::session_update_raw_id(&id_json, update, seq, None).into(),
                    counted: false,
                    at: None,
                });
                cursor = seq;
            }
        }
        if cursor == before {
            break;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_written_as_sse_with_seq_ids() {
        let events = [
            Event {
                seq: Some(7),
                text: "{\"a\":1}".into(),
                counted: true,
                at: None,
            },
            Event {
                seq: None,
                text: "{\"b\":\n2}".into(),
                counted: true,
                at: Some((7, 1)),
            },
        ];
        assert_eq!(
            &format(&events)[..],
            b"id: 7\ndata: {\"a\":1}\n\nid: 7.1\ndata: {\"b\":\ndata: 2}\n\n"
        );
    }
}
