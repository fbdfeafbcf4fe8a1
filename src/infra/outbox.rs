//! One client's outgoing queue: bounded in frames and in bytes, at the bottom of the stack.
//!
//! Three ways in, chosen by the caller (the shape of jsonrpsee's `MethodSink`):
//! - [`Outbox::offer`] never waits and never closes: it is how a session's live updates go out.
//!   When the queue is full it says no, and the session feeds that client from the store instead,
//!   at its own pace, until it has caught up (every update is stored before it is offered).
//! - [`Outbox::push`] never waits and is never refused for room: answers and agent requests,
//!   which cannot be read back from anywhere. What is pushed beyond the room is debt, repaid
//!   first; past [`Outbox::push`]'s hard cap (four times the byte budget) the client is closed
//!   with `1013` (try again later).
//! - [`Outbox::send`] waits for room: what a client asked for itself (the answer to its own
//!   request, a replay or catch-up from the store): only that client's own task waits.
//!
//! The connection's writer drains the queue with [`OutboxReceiver`] and gives bytes back once
//! they are written; while a write waits on the peer it says so ([`Outbox::writing`]), which is
//! how a client that reads nothing is told from one that is merely behind. Closing (for any
//! reason) wakes the writer at once, so the socket and its queue are released without waiting
//! for the peer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::ws::Utf8Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::infra::budget::ByteBudget;

/// Close code for a client that reads nothing, or whose unread answers pass the hard cap
/// (RFC 6455 1013, "try again later").
pub const CLOSE_TOO_SLOW: u16 = 1013;

/// How many times the byte budget pushed frames may hold before the client is closed.
const PUSH_CAP_BUDGETS: usize = 4;

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
    /// Frames in order; bounded by `frames` and `room`, not by the channel.
    tx: mpsc::UnboundedSender<Utf8Bytes>,
    /// Frames that may still be queued (one unit each).
    frames: ByteBudget,
    /// Bytes that may still be queued; a queued frame holds its length until written.
    room: ByteBudget,
    /// Debt in bytes past which a push closes the client.
    push_cap: usize,
    /// The budgets' sizes, for [`Outbox::send_all`]'s runs.
    max_frames: usize,
    max_bytes: usize,
    /// Fired when the connection is closing.
    closed: CancellationToken,
    /// The first close reason given.
    reason: OnceLock<CloseReason>,
    /// The close [`Outbox::close_when_written`] asked for, once its mark is written.
    closing: OnceLock<CloseReason>,
    /// While the writer waits on the peer: since when (ms after [`epoch`], plus one); else 0.
    writing_since: AtomicU64,
}

/// The writer's side.
#[derive(Debug)]
pub struct OutboxReceiver {
    rx: mpsc::UnboundedReceiver<Utf8Bytes>,
    frames: ByteBudget,
    room: ByteBudget,
    closed: CancellationToken,
}

/// A new outbox holding at most `max_frames` frames and `max_bytes` bytes.
pub fn outbox(max_frames: usize, max_bytes: usize) -> (Outbox, OutboxReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let frames = ByteBudget::new(max_frames.max(1));
    let room = ByteBudget::new(max_bytes);
    let closed = CancellationToken::new();
    let inner = Inner {
        tx,
        frames: frames.clone(),
        room: room.clone(),
        push_cap: max_bytes.saturating_mul(PUSH_CAP_BUDGETS).max(1 << 20),
        max_frames: max_frames.max(1),
        max_bytes: max_bytes.max(1),
        closed: closed.clone(),
        reason: OnceLock::new(),
        closing: OnceLock::new(),
        writing_since: AtomicU64::new(0),
    };
    let rx = OutboxReceiver {
        rx,
        frames,
        room,
        closed,
    };
    (Outbox { inner: Arc::new(inner) }, rx)
}

/// The instant `writing_since` counts from.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl Outbox {
    /// Queues a live update if there is room for it now; `false` (and nothing queued, nothing
    /// closed) when there is not: the caller feeds the client from the store instead.
    pub fn offer(&self, frame: Utf8Bytes) -> bool {
        if self.is_closed() {
            return false;
        }
        let len = frame.len();
        if !self.inner.frames.try_take(1) {
            return false;
        }
        if !self.inner.room.try_take(len) {
            self.inner.frames.give_back([1]);
            return false;
        }
        self.enqueue(frame, len)
    }

    /// Queues `frame` without waiting, room or not (an answer or an agent request, which cannot
    /// be fetched again); `false` when the client is closing, or this frame takes what it holds
    /// past the hard cap (then it is closed with `1013`).
    pub fn push(&self, frame: Utf8Bytes) -> bool {
        if self.is_closed() {
            return false;
        }
        let len = frame.len();
        self.inner.frames.take_anyway(1);
        if self.inner.room.take_anyway(len) > self.inner.push_cap {
            if self.close(
                CLOSE_TOO_SLOW,
                "too many unread answers; reconnect and resume with afterSeq",
            ) {
                metrics::counter!(crate::infra::metrics::SLOW_CLIENTS_DROPPED).increment(1);
                tracing::warn!("a client's unread answers passed four times its queue; closed with 1013");
            }
            return false;
        }
        self.enqueue(frame, len)
    }

    /// Queues `frame`, waiting for room; `false` when the client is closing.
    pub async fn send(&self, frame: Utf8Bytes) -> bool {
        let len = frame.len();
        self.reserve(1, len).await && self.enqueue(frame, len)
    }

    /// Waits until `frames` places and `bytes` bytes are taken from the budgets; `false` (and
    /// nothing taken) when the client closes first. Either wait may be cancelled (the client
    /// closing, or the caller giving up) without losing any of either.
    async fn reserve(&self, frames: usize, bytes: usize) -> bool {
        tokio::select! {
            () = self.inner.frames.take(frames) => {}
            () = self.inner.closed.cancelled() => return false,
        };
        tokio::select! {
            () = self.inner.room.take(bytes) => true,
            () = self.inner.closed.cancelled() => {
                self.inner.frames.give_back(std::iter::repeat_n(1, frames));
                false
            }
        }
    }

    /// Queues `frames` in order, waiting for room as it goes, several frames per wait (runs of
    /// at most a quarter of the budget), so the writer takes them in one go; `false` when the
    /// client is closing (what was not queued is dropped).
    pub async fn send_all(&self, frames: &mut Vec<Utf8Bytes>) -> bool {
        let (max_frames, max_bytes) = ((self.inner.max_frames / 4).max(1), (self.inner.max_bytes / 4).max(1));
        let mut rest = frames.drain(..).peekable();
        while rest.peek().is_some() {
            let mut run = Vec::new();
            let mut bytes = 0;
            while let Some(next) = rest.peek() {
                let len = next.len().max(1);
                if !run.is_empty() && (run.len() >= max_frames || bytes + len > max_bytes) {
                    break;
                }
                bytes += len;
                run.extend(rest.next());
            }
            if !self.reserve(run.len(), bytes).await {
                return false;
            }
            for frame in run {
                let len = frame.len();
                if !self.enqueue(frame, len) {
                    return false;
                }
            }
        }
        true
    }

    /// Puts a frame whose room is taken on the queue.
    fn enqueue(&self, frame: Utf8Bytes, len: usize) -> bool {
        if self.inner.tx.send(frame).is_ok() {
            return true;
        }
        self.inner.frames.give_back([1]);
        self.inner.room.give_back([len]);
        false
    }

    /// For the writer: whether it is waiting on the peer to take what it writes.
    pub fn writing(&self, busy: bool) {
        let since = if busy {
            u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
        } else {
            0
        };
        self.inner.writing_since.store(since, Ordering::Release);
    }

    /// How long the writer has been waiting on the peer, if it is.
    pub fn write_stalled_for(&self) -> Option<Duration> {
        match self.inner.writing_since.load(Ordering::Acquire) {
            0 => None,
            since => Some(epoch().elapsed().saturating_sub(Duration::from_millis(since - 1))),
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

    /// Gives the places and bytes of written frames back to the budget.
    pub fn written(&self, frames: &[Utf8Bytes]) {
        self.frames.give_back(frames.iter().map(|_| 1));
        self.room.give_back(frames.iter().map(|f| f.len()));
    }

    /// A handle that gives written frames back from elsewhere: for a writer whose frames leave
    /// through several streams (Streamable HTTP), each giving back what it wrote.
    pub fn returns(&self) -> Returns {
        Returns {
            frames: self.frames.clone(),
            room: self.room.clone(),
        }
    }
}

/// [`OutboxReceiver::returns`]: gives the places and bytes of written frames back.
#[derive(Debug, Clone)]
pub struct Returns {
    frames: ByteBudget,
    room: ByteBudget,
}

impl Returns {
    /// Gives back the places and bytes of frames of these lengths, written.
    pub fn written(&self, lens: impl Iterator<Item = usize> + Clone) {
        self.frames.give_back(lens.clone().map(|_| 1));
        self.room.give_back(lens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_outbox_refuses_live_updates_without_closing() {
        let (tx, mut rx) = outbox(4, 100);
        assert!(tx.offer(Utf8Bytes::from("a".repeat(60))));
        assert!(!tx.offer(Utf8Bytes::from("b".repeat(60))), "over the byte budget");
        assert!(!tx.is_closed(), "a client that is behind is not cut off");
        assert!(tx.push(Utf8Bytes::from("answer")), "answers go in whatever the room");
        let mut got = Vec::new();
        assert_eq!(rx.recv_many(&mut got, 8).await, 2);
        assert_eq!(got, ["a".repeat(60), "answer".to_string()]);
        rx.written(&got);
        assert!(tx.offer(Utf8Bytes::from("b".repeat(60))), "room is back once written");
    }

    #[tokio::test]
    async fn frames_count_too_and_written_bytes_come_back() {
        let (tx, mut rx) = outbox(2, 1000);
        assert!(tx.offer(Utf8Bytes::from("1")) && tx.offer(Utf8Bytes::from("2")));
        assert!(!tx.offer(Utf8Bytes::from("3")), "a third queued frame is one too many");
        let mut got = Vec::new();
        assert_eq!(rx.recv_many(&mut got, 8).await, 2);
        rx.written(&got);
        assert!(tx.offer(Utf8Bytes::from("3")) && tx.offer(Utf8Bytes::from("4")));
        assert!(!tx.is_closed());
    }

    #[tokio::test]
    async fn pushes_past_the_hard_cap_close_with_1013() {
        let (tx, _rx) = outbox(8, 1 << 20);
        let big = Utf8Bytes::from("x".repeat(1 << 20));
        for _ in 0..(PUSH_CAP_BUDGETS + 1) {
            assert!(tx.push(big.clone()));
        }
        assert!(!tx.push(big), "past four budgets of debt");
        assert_eq!(tx.close_reason().map(|r| r.code), Some(CLOSE_TOO_SLOW));
    }

    #[tokio::test]
    async fn send_all_queues_in_order_in_runs_as_room_comes_back() {
        let (tx, mut rx) = outbox(8, 1000);
        let mut frames: Vec<Utf8Bytes> = (0..20).map(|i| Utf8Bytes::from(format!("f{i}"))).collect();
        let sending = tokio::spawn(async move {
            let ok = tx.send_all(&mut frames).await;
            (ok, tx)
        });
        let mut got = Vec::new();
        while got.len() < 20 {
            let mut batch = Vec::new();
            assert!(rx.recv_many(&mut batch, 64).await > 0);
            assert!(batch.len() <= 8, "never more than the budget at once");
            rx.written(&batch);
            got.extend(batch);
        }
        let (ok, tx) = sending.await.expect("join");
        assert!(ok);
        let want: Vec<String> = (0..20).map(|i| format!("f{i}")).collect();
        assert_eq!(got, want);
        assert!(tx.offer(Utf8Bytes::from("room is all back")));
    }

    #[test]
    fn the_writer_says_how_long_it_waits() {
        let (tx, _rx) = outbox(8, 100);
        assert_eq!(tx.write_stalled_for(), None);
        tx.writing(true);
        assert!(tx.write_stalled_for().is_some());
        tx.writing(false);
        assert_eq!(tx.write_stalled_for(), None);
    }

    #[tokio::test]
    async fn a_close_when_written_comes_after_what_was_queued() {
        let (tx, mut rx) = outbox(8, 1000);
        assert!(tx.offer(Utf8Bytes::from("1")) && tx.offer(Utf8Bytes::from("2")));
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
