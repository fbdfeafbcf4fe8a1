//! One client's outgoing queue: bounded in frames and in bytes, at the bottom of the stack.
//!
//! Two ways in, chosen by the caller (the shape of jsonrpsee's `MethodSink`):
//! - [`Outbox::push`] never waits. It is what fan-out uses (a session's updates, an agent's
//!   requests): when the queue is full, the client is closed with `1013` (try again later) at
//!   once, its queued frames are dropped, and it catches up with `session/load` + `afterSeq`.
//!   One client that stops reading therefore never slows anyone else.
//! - [`Outbox::send`] waits for room. It is for what a client asked for itself (the answer to
//!   its own request, the replay of its own `session/load`): only that client's own task waits.
//!
//! The connection's writer drains the queue with [`OutboxReceiver`] and gives bytes back once
//! they are written. Closing (for any reason) wakes the writer at once, so the socket and its
//! queue are released without waiting for the peer.

use std::sync::{Arc, OnceLock};

use axum::extract::ws::Utf8Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::budget::ByteBudget;

/// Close code for a client whose queue overflowed (RFC 6455 1013, "try again later").
pub const CLOSE_TOO_SLOW: u16 = 1013;

/// Why a connection is being closed: the close frame the writer sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloseReason {
    /// WebSocket close code.
    pub code: u16,
    /// Short text for the close frame.
    pub reason: &'static str,
}

/// The sending side, shared by everything that sends to one client. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Outbox {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Frames, bounded by count.
    tx: mpsc::Sender<Utf8Bytes>,
    /// Bytes that may still be queued; a queued frame holds its length until written.
    room: ByteBudget,
    /// Fired when the connection is closing.
    closed: CancellationToken,
    /// The first close reason given.
    reason: OnceLock<CloseReason>,
    /// The close [`Outbox::close_when_written`] asked for, once its mark is written.
    closing: OnceLock<CloseReason>,
}

/// The writer's side.
#[derive(Debug)]
pub struct OutboxReceiver {
    rx: mpsc::Receiver<Utf8Bytes>,
    room: ByteBudget,
    closed: CancellationToken,
}

/// A new outbox holding at most `max_frames` frames and `max_bytes` bytes.
pub fn outbox(max_frames: usize, max_bytes: usize) -> (Outbox, OutboxReceiver) {
    let (tx, rx) = mpsc::channel(max_frames.max(1));
    let room = ByteBudget::new(max_bytes);
    let closed = CancellationToken::new();
    let inner = Inner {
        tx,
        room: room.clone(),
        closed: closed.clone(),
        reason: OnceLock::new(),
        closing: OnceLock::new(),
    };
    (Outbox { inner: Arc::new(inner) }, OutboxReceiver { rx, room, closed })
}

impl Outbox {
    /// Queues `frame` without waiting; a full queue closes the client with `1013` (its queued
    /// frames are dropped). `false` when the frame was not queued.
    pub fn push(&self, frame: Utf8Bytes) -> bool {
        if self.is_closed() {
            return false;
        }
        let len = frame.len();
        if !self.inner.room.try_take(len) {
            self.overflow();
            return false;
        }
        match self.inner.tx.try_send(frame) {
            Ok(()) => true,
            Err(e) => {
                self.inner.room.give_back([len]);
                if matches!(e, mpsc::error::TrySendError::Full(_)) {
                    self.overflow();
                }
                false
            }
        }
    }

    /// Queues `frame`, waiting for room; `false` when the client is closing.
    pub async fn send(&self, frame: Utf8Bytes) -> bool {
        // A place in the queue, then bytes in the budget: either wait may be cancelled (the
        // client closing, or the caller giving up) without losing any of either.
        let slot = tokio::select! {
            slot = self.inner.tx.reserve() => match slot {
                Ok(slot) => slot,
                Err(_) => return false,
            },
            () = self.inner.closed.cancelled() => return false,
        };
        tokio::select! {
            () = self.inner.room.take(frame.len()) => {}
            () = self.inner.closed.cancelled() => return false,
        };
        slot.send(frame);
        true
    }

    fn overflow(&self) {
        if self.close(CLOSE_TOO_SLOW, "client too slow; reconnect and resume with afterSeq") {
            metrics::counter!(crate::metrics::SLOW_CLIENTS_DROPPED).increment(1);
            tracing::warn!("a client's queue is full; closed with 1013");
        }
    }

    /// Closes the connection with `code`; the first reason given wins. `true` if this call
    /// closed it.
    pub fn close(&self, code: u16, reason: &'static str) -> bool {
        let first = self.inner.reason.set(CloseReason { code, reason }).is_ok();
        self.inner.closed.cancel();
        first
    }

    /// Closes the connection with `code` once every frame queued before this call has been
    /// written (draining: nothing already queued for the client is dropped). Queues a mark, an
    /// empty frame (no other frame is empty), waiting for room like [`Outbox::send`]; the writer
    /// calls [`Outbox::close_at_mark`] when it gets there. Any other close meanwhile stands.
    pub async fn close_when_written(&self, code: u16, reason: &'static str) {
        let _ = self.inner.closing.set(CloseReason { code, reason });
        self.send(Utf8Bytes::from_static("")).await;
    }

    /// For the writer: the mark of [`Outbox::close_when_written`] is written; closes as it asked.
    pub fn close_at_mark(&self) {
        let reason = self
            .inner
            .closing
            .get()
            .copied()
            .unwrap_or(CloseReason { code: 1000, reason: "" });
        self.close(reason.code, reason.reason);
    }

    /// Whether the connection is closing.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.is_cancelled()
    }

    /// Resolves when the connection is closing.
    pub async fn closed(&self) {
        self.inner.closed.cancelled().await;
    }

    /// Why it is closing, once it is.
    pub fn close_reason(&self) -> Option<CloseReason> {
        self.inner.reason.get().copied()
    }

    /// Whether `self` and `other` are the same client's outbox.
    pub fn same(&self, other: &Outbox) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl OutboxReceiver {
    /// Takes up to `limit` queued frames into `out`; 0 when the outbox is closing (or every
    /// sender is gone). What is left in the queue is dropped when the receiver is.
    pub async fn recv_many(&mut self, out: &mut Vec<Utf8Bytes>, limit: usize) -> usize {
        if self.closed.is_cancelled() {
            return 0;
        }
        tokio::select! {
            biased;
            () = self.closed.cancelled() => 0,
            n = self.rx.recv_many(out, limit) => n,
        }
    }

    /// Gives the bytes of written frames back to the budget.
    pub fn written(&self, frames: &[Utf8Bytes]) {
        self.room.give_back(frames.iter().map(|f| f.len()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_outbox_closes_with_1013_instead_of_waiting() {
        let (tx, mut rx) = outbox(4, 100);
        assert!(tx.push(Utf8Bytes::from("a".repeat(60))));
        assert!(!tx.push(Utf8Bytes::from("b".repeat(60))), "over the byte budget");
        assert_eq!(tx.close_reason().map(|r| r.code), Some(CLOSE_TOO_SLOW));
        assert!(!tx.push(Utf8Bytes::from("c")), "closed stays closed");
        let mut got = Vec::new();
        assert_eq!(rx.recv_many(&mut got, 8).await, 0, "the writer stops at once");
    }

    #[tokio::test]
    async fn frames_count_too_and_written_bytes_come_back() {
        let (tx, mut rx) = outbox(2, 1000);
        assert!(tx.push(Utf8Bytes::from("1")) && tx.push(Utf8Bytes::from("2")));
        let mut got = Vec::new();
        assert_eq!(rx.recv_many(&mut got, 8).await, 2);
        rx.written(&got);
        assert!(tx.push(Utf8Bytes::from("3")) && tx.push(Utf8Bytes::from("4")));
        assert!(!tx.push(Utf8Bytes::from("5")), "a third queued frame is one too many");
        assert!(tx.is_closed());
    }

    #[tokio::test]
    async fn a_close_when_written_comes_after_what_was_queued() {
        let (tx, mut rx) = outbox(8, 1000);
        assert!(tx.push(Utf8Bytes::from("1")) && tx.push(Utf8Bytes::from("2")));
        tx.close_when_written(1001, "going away").await;
        assert!(!tx.is_closed(), "not before the frames queued ahead of it are written");
        let mut got = Vec::new();
        assert_eq!(rx.recv_many(&mut got, 8).await, 3);
        assert_eq!(got, ["1", "2", ""], "the queued frames, then the mark");
        tx.close_at_mark();
        assert_eq!(
            tx.close_reason().map(|r| (r.code, r.reason)),
            Some((1001, "going away"))
        );
    }

    #[tokio::test]
    async fn send_waits_for_room_and_gives_up_when_closed() {
        let (tx, mut rx) = outbox(8, 10);
        assert!(tx.send(Utf8Bytes::from("0123456789")).await);
        let waiting = {
            let tx = tx.clone();
            tokio::spawn(async move { tx.send(Utf8Bytes::from("x")).await })
        };
        let mut got = Vec::new();
        rx.recv_many(&mut got, 8).await;
        rx.written(&got);
        assert!(waiting.await.expect("join"), "room came back");
        let stuck = {
            let tx = tx.clone();
            tokio::spawn(async move { tx.send(Utf8Bytes::from("0123456789")).await })
        };
        tx.close(1000, "");
        assert!(!stuck.await.expect("join"));
    }
}
