//! The writing half of a connection: drains the client's [`Outbox`] into the socket, several
//! frames per flush, pings, closes a peer that takes nothing with `1013`, and ends with the close
//! frame. Generic over the socket's [`Sink`], so its timing is tested with a channel and paused
//! time.

use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes};
use futures_util::{Sink, SinkExt};

use super::close_not_reading;
use crate::infra::outbox::{CLOSE_TOO_SLOW, Outbox, OutboxReceiver};

/// How long a closing connection's writer tries to deliver its close frame (a peer that does not
/// read may never take it) before the socket is dropped.
const CLOSE_FRAME_WAIT: Duration = Duration::from_millis(500);
/// The same for a client closed because it read nothing: what its socket already holds (up to
/// the kernel's send buffer, megabytes) goes first, so it gets long enough for a client that
/// reads again to drain that and get the 1013. Its queue and sessions are released at once;
/// only the socket waits.
const SLOW_CLOSE_FRAME_WAIT: Duration = Duration::from_secs(30);
/// Most bytes written between two checks that the peer is reading.
const WRITE_CHUNK_BYTES: usize = 256 << 10;

/// Writes queued frames, several per flush, and pings every `ping_every`. A peer that takes
/// nothing for `slow_after` is closed with `1013`. When the outbox closes, sends the close frame
/// if the peer takes it in time, and returns (dropping its half of the socket and whatever was
/// still queued).
pub(super) async fn write_frames<S: Sink<Message> + Unpin>(
    mut sink: S,
    mut rx: OutboxReceiver,
    outbox: Outbox,
    ping_every: Duration,
    slow_after: Duration,
) {
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + ping_every, ping_every);
    // Grows to what the busiest burst needed; an idle connection holds none.
    let mut batch = Vec::new();
    let sent = async {
        loop {
            tokio::select! {
                n = rx.recv_many(&mut batch, 512) => {
                    if n == 0 {
                        return Written::Stopped;
                    }
                    outbox.writing(true);
                    let mut start = 0;
                    while start < batch.len() {
                        // Up to a chunk's worth of the peer's reading under one timer (not
                        // one per frame: a stream's frames are small and many), or up to
                        // `Outbox::close_when_written`'s mark (an empty frame).
                        let (mut end, mut bytes) = (start, 0);
                        while end < batch.len() && bytes < WRITE_CHUNK_BYTES && !batch[end].is_empty() {
                            bytes += batch[end].len();
                            end += 1;
                        }
                        let frames = &batch[start..end];
                        let written = tokio::time::timeout(slow_after, async {
                            for text in frames {
                                sink.feed(Message::Text(text.clone())).await?;
                            }
                            sink.flush().await
                        });
                        match written.await {
                            Ok(Ok(())) => {}
                            Ok(Err(_)) => return Written::Stopped,
                            Err(_) => return Written::PeerStuck,
                        }
                        if batch.get(end).is_some_and(|text| text.is_empty()) {
                            // What came before the mark is out.
                            outbox.close_at_mark();
                            return Written::Stopped;
                        }
                        start = end;
                    }
                    outbox.writing(false);
                    rx.written(&batch);
                    batch.clear();
                }
                _ = ping.tick() => {
                    outbox.writing(true);
                    match tokio::time::timeout(slow_after, sink.send(Message::Ping(bytes::Bytes::new()))).await {
                        Ok(Ok(())) => outbox.writing(false),
                        Ok(Err(_)) => return Written::Stopped,
                        Err(_) => return Written::PeerStuck,
                    }
                }
            }
        }
    };
    // A write blocked on a peer that does not read ends as soon as the outbox closes.
    let stuck = tokio::select! {
        written = sent => written == Written::PeerStuck,
        () = outbox.closed() => false,
    };
    if stuck && close_not_reading(&outbox) {
        tracing::warn!(
            after_secs = slow_after.as_secs(),
            "a client took nothing written to it for slow_client_timeout_secs; closed with 1013"
        );
    }
    // Its queue goes at once, whatever the close frame does.
    drop(rx);
    drop(batch);
    outbox.close(1000, "");
    if let Some(reason) = outbox.close_reason() {
        let frame = CloseFrame {
            code: reason.code,
            reason: Utf8Bytes::from_static(reason.reason),
        };
        let wait = if reason.code == CLOSE_TOO_SLOW {
            SLOW_CLOSE_FRAME_WAIT
        } else {
            CLOSE_FRAME_WAIT
        };
        let delivered = tokio::time::timeout(wait, async {
            // When the client closed first, the library has queued the reply to its close frame
            // and refuses a second one: closing the sink flushes that reply.
            if sink.send(Message::Close(Some(frame))).await.is_err() {
                let _ = sink.close().await;
            }
        })
        .await;
        if delivered.is_err() && reason.code == CLOSE_TOO_SLOW {
            tracing::info!(
                wait_secs = wait.as_secs(),
                "a client closed for reading nothing did not take what its socket held within the wait; dropped without its close frame"
            );
        }
    }
}

/// How the writing loop ended.
#[derive(Debug, PartialEq, Eq)]
enum Written {
    /// The outbox closed, or the socket failed.
    Stopped,
    /// The peer took nothing for the slow-client timeout.
    PeerStuck,
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;
    use tokio::time::Instant;
    use tokio_util::sync::PollSender;

    const PING: Duration = Duration::from_secs(20);
    const SLOW: Duration = Duration::from_secs(60);

    fn text(s: &str) -> Utf8Bytes {
        Utf8Bytes::from(s.to_string())
    }

    /// A writer whose peer is a channel with room for `room` messages.
    fn writer(room: usize) -> (Outbox, mpsc::Receiver<Message>, tokio::task::JoinHandle<()>) {
        let (outbox, rx) = crate::infra::outbox::outbox(64, 1 << 20);
        let (tx, peer) = mpsc::channel(room);
        #[expect(clippy::disallowed_methods, reason = "a test's own task, awaited")]
        let task = tokio::spawn(write_frames(PollSender::new(tx), rx, outbox.clone(), PING, SLOW));
        (outbox, peer, task)
    }

    fn code(message: Option<Message>) -> u16 {
        match message {
            Some(Message::Close(Some(frame))) => frame.code,
            other => panic!("expected a close frame, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn queued_frames_go_out_in_order_at_once_and_a_ping_follows_each_interval() {
        let (outbox, mut peer, task) = writer(16);
        let start = Instant::now();
        for f in ["a", "b", "c"] {
            assert!(outbox.push(text(f)));
        }
        for f in ["a", "b", "c"] {
            match peer.recv().await {
                Some(Message::Text(t)) => assert_eq!(t.as_str(), f),
                other => panic!("expected {f:?}, got {other:?}"),
            }
        }
        assert!(start.elapsed() < PING, "frames wait for no timer");
        assert!(matches!(peer.recv().await, Some(Message::Ping(_))));
        assert!(start.elapsed() >= PING, "{:?}", start.elapsed());
        assert!(matches!(peer.recv().await, Some(Message::Ping(_))));
        assert!(start.elapsed() >= PING * 2, "{:?}", start.elapsed());
        outbox.close(1000, "");
        assert_eq!(code(peer.recv().await), 1000);
        task.await.expect("the writer ends");
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_takes_nothing_is_closed_with_1013_after_the_slow_client_timeout() {
        let (outbox, _peer, task) = writer(1);
        let start = Instant::now();
        for f in ["a", "b", "c"] {
            assert!(outbox.push(text(f)));
        }
        task.await.expect("the writer ends");
        assert_eq!(outbox.close_reason().map(|r| r.code), Some(CLOSE_TOO_SLOW));
        // Stuck for the timeout, then the close frame waits its own while the socket is full.
        assert!(start.elapsed() >= SLOW + SLOW_CLOSE_FRAME_WAIT, "{:?}", start.elapsed());
        assert!(
            start.elapsed() < SLOW + SLOW_CLOSE_FRAME_WAIT + PING,
            "{:?}",
            start.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_writer_stuck_on_its_peer_ends_as_soon_as_the_outbox_closes() {
        let (outbox, _peer, task) = writer(1);
        for f in ["a", "b"] {
            assert!(outbox.push(text(f)));
        }
        // On the paused clock: the writer has written "a" and waits for room for "b".
        tokio::time::sleep(Duration::from_secs(1)).await;
        let closing = Instant::now();
        outbox.close(1001, "gateway shutting down");
        task.await.expect("the writer ends");
        assert_eq!(outbox.close_reason().map(|r| r.code), Some(1001));
        let took = closing.elapsed();
        assert!(took >= CLOSE_FRAME_WAIT && took < SLOW, "{took:?}");
    }
}
