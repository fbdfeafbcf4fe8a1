//! An agent's input: a line is written at once, on the sender's own thread, while nothing is
//! queued and the pipe takes it without waiting; otherwise it joins a bounded queue that one task
//! ([`write_lines`]) drains. Order holds either way: a line goes straight to the pipe only when
//! every line queued before it has been written and flushed.
//!
//! Measured on a prompt's round trip: the line no longer waits for the writer task to be woken,
//! and the sender no longer yields to it (a yield made tokio wake the other worker, once per
//! prompt, while the agent wanted that core).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};

use axum::extract::ws::Utf8Bytes;
use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use crate::infra::budget::ByteBudget;

/// Lines queued for one agent's stdin.
pub(super) const STDIN_QUEUE: usize = 1024;
/// The writer's buffer: a burst of queued lines is one system call.
const BUFFER: usize = 64 * 1024;

/// Where the lines go: the agent's stdin, or an in-memory pipe in tests.
pub(crate) type Stdin = Box<dyn AsyncWrite + Send + Unpin>;

/// What the senders and the writer task share.
struct Shared {
    /// Whoever holds it writes; `None` once the writer task has ended (the pipe is closed).
    out: tokio::sync::Mutex<Option<BufWriter<Stdin>>>,
    /// Lines handed to the queue and not yet written and flushed by the task, plus a flush the
    /// task owes: a line goes straight to the pipe only at zero.
    owed: AtomicUsize,
    /// A line written at once that the pipe did not take whole: the task flushes the rest.
    flush: Notify,
}

/// The senders' side.
pub(super) struct Lines {
    tx: mpsc::Sender<Utf8Bytes>,
    /// The queue's bound in bytes (in lines: the channel's).
    room: ByteBudget,
    shared: Arc<Shared>,
}

/// Why a line was not taken.
pub(super) enum Refused {
    /// The queue is full: the agent is not reading its input.
    Full,
    /// The writer task has ended.
    Closed,
}

/// The queue of an agent's input lines, as [`write_lines`] drains it.
pub(crate) struct Input {
    rx: mpsc::Receiver<Utf8Bytes>,
    room: ByteBudget,
    shared: Arc<Shared>,
}

/// Input for `stdin`, its queue bounded to `queue_bytes`.
pub(super) fn input(stdin: Stdin, queue_bytes: usize) -> (Lines, Input) {
    let (tx, rx) = mpsc::channel(STDIN_QUEUE);
    let room = ByteBudget::new(queue_bytes);
    let shared = Arc::new(Shared {
        out: tokio::sync::Mutex::new(Some(BufWriter::with_capacity(BUFFER, stdin))),
        owed: AtomicUsize::new(0),
        flush: Notify::new(),
    });
    (
        Lines {
            tx,
            room: room.clone(),
            shared: shared.clone(),
        },
        Input { rx, room, shared },
    )
}

impl Lines {
    /// Writes `line` (ending in `\n`) at once, or queues it; never waits.
    pub(super) fn try_send(&self, line: String) -> Result<(), Refused> {
        if self.write_now(line.as_bytes()) {
            return Ok(());
        }
        let len = line.len();
        if !self.room.try_take(len) {
            return Err(Refused::Full);
        }
        self.shared.owed.fetch_add(1, Ordering::AcqRel);
        self.tx.try_send(Utf8Bytes::from(line)).map_err(|e| {
            self.shared.owed.fetch_sub(1, Ordering::AcqRel);
            self.room.give_back([len]);
            match e {
                mpsc::error::TrySendError::Full(_) => Refused::Full,
                mpsc::error::TrySendError::Closed(_) => Refused::Closed,
            }
        })
    }

    /// Writes `line` at once, or queues it, waiting for room in the queue.
    pub(super) async fn send(&self, line: String) -> Result<(), Refused> {
        if self.write_now(line.as_bytes()) {
            return Ok(());
        }
        // Room in the queue first, then in the budget: both waits may be cancelled (a timeout)
        // without losing any of either.
        let slot = self.tx.reserve().await.map_err(|_| Refused::Closed)?;
        self.room.take(line.len()).await;
        self.shared.owed.fetch_add(1, Ordering::AcqRel);
        slot.send(Utf8Bytes::from(line));
        Ok(())
    }

    /// Whether `line` went to the pipe at once: nothing queued or owed, the writer free, the
    /// line shorter than the buffer. What the pipe does not take at once stays in the buffer, ahead of
    /// anything queued later, for the task to flush.
    fn write_now(&self, line: &[u8]) -> bool {
        // Shorter than the buffer: copied into it whole (a line as long goes to the pipe past
        // the buffer, and a part written then could not be taken back).
        if line.len() >= BUFFER || self.shared.owed.load(Ordering::Acquire) != 0 {
            return false;
        }
        let Ok(mut out) = self.shared.out.try_lock() else {
            return false;
        };
        // Checked again under the writer: the task lowers it only while holding it.
        if self.shared.owed.load(Ordering::Acquire) != 0 {
            return false;
        }
        let Some(out) = out.as_mut() else { return false };
        let mut cx = Context::from_waker(Waker::noop());
        // The buffer is empty (everything owed was flushed): the line is copied into it whole.
        match Pin::new(&mut *out).poll_write(&mut cx, line) {
            Poll::Ready(Ok(n)) if n == line.len() => {}
            // Never: the buffer is empty and the line shorter than it.
            Poll::Ready(Ok(_)) | Poll::Pending => return false,
            // The agent's stdin is closed: its death answers every request.
            Poll::Ready(Err(e)) => {
                tracing::debug!(error = %e, "writing to the agent's stdin failed");
                return true;
            }
        }
        match Pin::new(&mut *out).poll_flush(&mut cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => tracing::debug!(error = %e, "writing to the agent's stdin failed"),
            Poll::Pending => {
                self.shared.owed.fetch_add(1, Ordering::AcqRel);
                self.shared.flush.notify_one();
            }
        }
        true
    }
}

/// Drains the queue into the agent's input (and flushes what a sender left in the buffer) until
/// the queue closes, a write fails, or `stop` fires; then closes the pipe.
pub(crate) async fn write_lines(input: Input, stop: CancellationToken) {
    let Input { mut rx, room, shared } = input;
    loop {
        let line = tokio::select! {
            line = rx.recv() => match line {
                Some(line) => Some(line),
                None => break,
            },
            () = shared.flush.notified() => None,
            () = stop.cancelled() => break,
        };
        let mut guard = shared.out.lock().await;
        let Some(out) = guard.as_mut() else { break };
        let written = match &line {
            Some(line) => {
                let written = out.write_all(line.as_bytes()).await;
                room.give_back([line.len()]);
                // Flushed when nothing else is waiting: one system call per burst.
                if written.is_ok() && rx.is_empty() {
                    out.flush().await
                } else {
                    written
                }
            }
            None => out.flush().await,
        };
        shared.owed.fetch_sub(1, Ordering::AcqRel);
        if written.is_err() {
            break;
        }
    }
    // Closing stdin tells the agent no more comes; senders then queue, and are refused.
    *shared.out.lock().await = None;
}
