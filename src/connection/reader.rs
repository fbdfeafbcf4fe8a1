//! The reading half of a connection: takes the client's frames one at a time and hands each text
//! to the connection, until the client goes, falls silent, its token expires, its sign-in ends,
//! the gateway drains or shuts down. Generic over the socket's [`Stream`] and the frame handler,
//! so its timing is tested with a channel and paused time.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use axum::extract::ws::Message;
use futures_util::{Stream, StreamExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::close_not_reading;
use crate::infra::outbox::Outbox;

/// Close code when the token expires or the sign-in ends (RFC 6455 1008, policy violation).
pub(super) const CLOSE_TOKEN_EXPIRED: u16 = 1008;
/// Close code for a frame over the size cap (1009, message too big).
const CLOSE_TOO_BIG: u16 = 1009;
/// Close code for a text frame that is not UTF-8 (1007, invalid frame payload data).
const CLOSE_INVALID_DATA: u16 = 1007;
/// Close code on shutdown (1001, going away).
pub(super) const CLOSE_GOING_AWAY: u16 = 1001;

/// What a connection does with a client's text frame.
pub(super) trait OnText {
    /// Handles one text frame; the next is read when this returns.
    fn on_text(&mut self, text: &str) -> impl Future<Output = ()> + Send;
}

/// Why reading stopped.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ended {
    /// The connection is over: the client left, or the outbox was closed (with its reason).
    Closed,
    /// The gateway drains and nothing the client asked is in flight: it gets what is queued for
    /// it, then `1001`.
    Draining,
}

/// When a connection must end besides its client leaving.
pub(super) struct Ends<S, D> {
    /// A client that sends nothing, not even a pong, for this long is closed with `1013`
    /// (unless the writer is the one waiting on it: the writer's slow-client timer decides then).
    pub silent_after: Duration,
    /// The token's expiry.
    pub expires: Instant,
    /// Resolves when the person's sign-in ends (sign-out on any replica).
    pub signed_out: S,
    /// Resolves when the gateway drains and nothing this client asked is in flight.
    pub drained: D,
    /// The gateway's shutdown.
    pub shutdown: CancellationToken,
}

/// Reads frames from `stream` into `conn` until the connection ends; closes `outbox` with the
/// reason, where there is one, and says whether the gateway is draining.
pub(super) async fn read_frames<St, E, H, S, D>(
    stream: &mut St,
    conn: &mut H,
    outbox: &Outbox,
    ends: Ends<S, D>,
    who: &str,
) -> Ended
where
    St: Stream<Item = Result<Message, E>> + Unpin,
    E: Display,
    H: OnText,
    S: Future<Output = ()>,
    D: Future<Output = ()>,
{
    let expiry = tokio::time::sleep_until(ends.expires);
    let (signed_out, drained) = (ends.signed_out, ends.drained);
    tokio::pin!(expiry, signed_out, drained);
    loop {
        let frame = tokio::select! {
            frame = tokio::time::timeout(ends.silent_after, stream.next()) => frame,
            () = outbox.closed() => return Ended::Closed,
            () = &mut expiry => {
                tracing::info!(connection = who, "token expired; closing connection");
                outbox.close(CLOSE_TOKEN_EXPIRED, "token expired");
                return Ended::Closed;
            }
            () = &mut signed_out => {
                tracing::info!(connection = who, "sign-in ended; closing connection");
                outbox.close(CLOSE_TOKEN_EXPIRED, "signed out");
                return Ended::Closed;
            }
            () = &mut drained => return Ended::Draining,
            () = ends.shutdown.cancelled() => {
                outbox.close(CLOSE_GOING_AWAY, "gateway shutting down");
                return Ended::Closed;
            }
        };
        match frame {
            // A client that does not read gets no pings to answer: the writer's slow-client
            // timer decides about it.
            Err(_) if outbox.write_stalled_for().is_some() => {}
            Err(_) => {
                tracing::info!(
                    connection = who,
                    silent_secs = ends.silent_after.as_secs(),
                    "no traffic or pong from the client; closed with 1013"
                );
                close_not_reading(outbox);
                return Ended::Closed;
            }
            Ok(Some(Err(e))) => {
                // Read errors worth answering (RFC 6455 7.4.1): a frame over the cap (1009,
                // message too big) and a text frame that is not UTF-8 (1007, invalid data).
                // axum hides tungstenite's error type: its messages are what is left to tell.
                let e = e.to_string();
                if e.contains("too long") {
                    tracing::info!(connection = who, "frame over max_frame_bytes; closing");
                    outbox.close(CLOSE_TOO_BIG, "message too big");
                } else if e.contains("UTF-8") {
                    tracing::info!(connection = who, "text frame is not UTF-8; closing");
                    outbox.close(CLOSE_INVALID_DATA, "text frame is not UTF-8");
                }
                return Ended::Closed;
            }
            Ok(None) | Ok(Some(Ok(Message::Close(_)))) => return Ended::Closed,
            Ok(Some(Ok(Message::Text(text)))) => conn.on_text(text.as_str()).await,
            // Binary frames are ignored (transport RFD); pings are answered by the library.
            Ok(Some(Ok(_))) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infra::outbox::CLOSE_TOO_SLOW;
    use tokio::sync::mpsc;

    const SILENT: Duration = Duration::from_secs(40);

    /// Keeps the texts it was handed.
    #[derive(Default)]
    struct Texts(Vec<String>);

    impl OnText for Texts {
        async fn on_text(&mut self, text: &str) {
            self.0.push(text.to_string());
        }
    }

    type Frame = Result<Message, String>;

    struct Reader {
        outbox: Outbox,
        client: mpsc::Sender<Frame>,
        shutdown: CancellationToken,
        signed_out: CancellationToken,
        drain: CancellationToken,
        task: tokio::task::JoinHandle<(Ended, Vec<String>)>,
    }

    /// A reader of a channel's frames whose token expires after `expires_in`.
    fn reader(expires_in: Duration) -> Reader {
        let (outbox, _rx) = crate::infra::outbox::outbox(16, 1 << 16);
        let (client, mut frames) = mpsc::channel::<Frame>(16);
        let (shutdown, signed_out, drain) = (
            CancellationToken::new(),
            CancellationToken::new(),
            CancellationToken::new(),
        );
        let ends = Ends {
            silent_after: SILENT,
            expires: Instant::now() + expires_in,
            signed_out: signed_out.clone().cancelled_owned(),
            drained: drain.clone().cancelled_owned(),
            shutdown: shutdown.clone(),
        };
        let out = outbox.clone();
        #[expect(clippy::disallowed_methods, reason = "a test's own task, awaited")]
        let task = tokio::spawn(async move {
            let _keep = _rx;
            let mut stream = futures_util::stream::poll_fn(move |cx| frames.poll_recv(cx));
            let mut texts = Texts::default();
            let ended = read_frames(&mut stream, &mut texts, &out, ends, "test").await;
            (ended, texts.0)
        });
        Reader {
            outbox,
            client,
            shutdown,
            signed_out,
            drain,
            task,
        }
    }

    const DAY: Duration = Duration::from_secs(86_400);

    fn code(outbox: &Outbox) -> Option<u16> {
        outbox.close_reason().map(|r| r.code)
    }

    #[tokio::test(start_paused = true)]
    async fn texts_reach_the_connection_in_order_and_other_frames_do_not() {
        let r = reader(DAY);
        for f in [
            Ok(Message::Text("a".into())),
            Ok(Message::Binary(vec![1u8].into())),
            Ok(Message::Ping(vec![].into())),
            Ok(Message::Text("b".into())),
            Ok(Message::Close(None)),
            Ok(Message::Text("after close".into())),
        ] {
            r.client.send(f).await.unwrap();
        }
        let (ended, texts) = r.task.await.unwrap();
        assert_eq!(ended, Ended::Closed);
        assert_eq!(texts, ["a", "b"]);
        assert_eq!(code(&r.outbox), None, "a client's own close needs no reason of ours");
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_client_is_closed_with_1013_after_the_silence_and_not_before() {
        let r = reader(DAY);
        let start = Instant::now();
        // Traffic just inside the silence restarts it.
        tokio::time::sleep(SILENT - Duration::from_secs(1)).await;
        r.client.send(Ok(Message::Pong(vec![].into()))).await.unwrap();
        let (ended, _) = r.task.await.unwrap();
        assert_eq!(ended, Ended::Closed);
        assert_eq!(code(&r.outbox), Some(CLOSE_TOO_SLOW));
        assert_eq!(start.elapsed(), SILENT * 2 - Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_client_the_writer_waits_on_is_left_to_the_writer() {
        let r = reader(DAY);
        r.outbox.writing(true);
        tokio::time::sleep(SILENT * 3).await;
        assert!(
            !r.task.is_finished(),
            "closed for silence while the writer was the one waiting"
        );
        r.outbox.writing(false);
        let (ended, _) = r.task.await.unwrap();
        assert_eq!((ended, code(&r.outbox)), (Ended::Closed, Some(CLOSE_TOO_SLOW)));
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_token_closes_with_1008_when_it_expires() {
        let r = reader(Duration::from_secs(25));
        let start = Instant::now();
        // The client keeps talking: the expiry does not wait for a quiet moment.
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_secs(10)).await;
            if r.client.send(Ok(Message::Text("x".into()))).await.is_err() {
                break;
            }
        }
        let (ended, texts) = r.task.await.unwrap();
        assert_eq!((ended, code(&r.outbox)), (Ended::Closed, Some(CLOSE_TOKEN_EXPIRED)));
        assert_eq!(texts.len(), 2, "two frames came before the expiry at 25 s");
        assert!(start.elapsed() >= Duration::from_secs(25));
    }

    #[tokio::test(start_paused = true)]
    async fn sign_out_and_shutdown_close_with_their_codes() {
        let r = reader(DAY);
        r.signed_out.cancel();
        let (ended, _) = r.task.await.unwrap();
        assert_eq!((ended, code(&r.outbox)), (Ended::Closed, Some(CLOSE_TOKEN_EXPIRED)));

        let r = reader(DAY);
        r.shutdown.cancel();
        let (ended, _) = r.task.await.unwrap();
        assert_eq!((ended, code(&r.outbox)), (Ended::Closed, Some(CLOSE_GOING_AWAY)));
    }

    #[tokio::test(start_paused = true)]
    async fn draining_stops_reading_without_closing() {
        let r = reader(DAY);
        r.drain.cancel();
        let (ended, _) = r.task.await.unwrap();
        assert_eq!((ended, code(&r.outbox)), (Ended::Draining, None));
    }

    #[tokio::test(start_paused = true)]
    async fn read_errors_close_with_the_code_that_names_them() {
        for (error, want) in [
            (
                "Space limit exceeded: Message too long: 70000 > 65536",
                Some(CLOSE_TOO_BIG),
            ),
            ("Could not decode UTF-8", Some(CLOSE_INVALID_DATA)),
            ("Connection reset without closing handshake", None),
        ] {
            let r = reader(DAY);
            r.client.send(Err(error.to_string())).await.unwrap();
            let (ended, _) = r.task.await.unwrap();
            assert_eq!((ended, code(&r.outbox)), (Ended::Closed, want), "{error}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_outbox_stops_reading() {
        let r = reader(DAY);
        r.client.send(Ok(Message::Text("a".into()))).await.unwrap();
        tokio::task::yield_now().await;
        r.outbox.close(4000, "test");
        let (ended, _) = r.task.await.unwrap();
        assert_eq!((ended, code(&r.outbox)), (Ended::Closed, Some(4000)));
    }
}
