//! The WebSocket bridge: one task pair per connection. The reader parses each frame once and
//! dispatches it ([`methods`]); the writer drains the client's [`Outbox`], batching frames into
//! one flush, and sends keepalive pings. When the outbox closes (overflow, shutdown, expiry) the
//! writer stops at once, tries the close frame for a moment, and both halves of the socket are
//! dropped: the file descriptor and the queued frames are released.
//!
//! Protocol errors (bad JSON, batches, unknown methods, bad params) are answered and the
//! connection lives; transport errors, a keepalive timeout, an expired token or shutdown end it.

mod attachments;
mod errors;
mod methods;
mod quiet_sink;
mod reader;
pub mod remote;
mod request;
mod signin;
pub mod streamable;
mod writer;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message, Utf8Bytes, WebSocket};
use futures_util::StreamExt;

use crate::agents::pool::AgentPool;
use crate::gateway::Gateway;
use crate::identity::auth::Identity;
use crate::infra::clock::now_secs;
use crate::infra::outbox::{CLOSE_TOO_SLOW, Outbox};
use crate::protocol::{self, Incoming, Kind, ParseFailure, RpcError, codes};
use crate::session::Client;
use quiet_sink::QuietSink;

/// After the close frame, how long the peer has to answer with its own before the socket is
/// dropped (dropping a socket with unread input resets it, and the peer may lose the close frame).
const CLOSE_REPLY_WAIT: Duration = Duration::from_secs(1);
/// The same for a client closed for reading nothing, once its close frame is written: it may
/// still be reading a send buffer's worth (megabytes) before it gets there.
const SLOW_CLOSE_REPLY_WAIT: Duration = Duration::from_secs(10);

/// Closes a client that reads nothing with 1013 and counts it, when this close is the one that
/// wins; whether it was.
fn close_not_reading(outbox: &Outbox) -> bool {
    let closed = outbox.close(
        CLOSE_TOO_SLOW,
        "client read nothing; reconnect and resume with afterSeq",
    );
    if closed {
        metrics::counter!(crate::infra::metrics::SLOW_CLIENTS_DROPPED).increment(1);
    }
    closed
}

/// Serves one upgraded connection until it ends.
pub async fn serve(
    socket: WebSocket,
    gw: Gateway,
    identity: Identity,
    conn_id: Arc<str>,
    addr: Option<Arc<str>>,
    pool: Arc<AgentPool>,
) {
    let limits = &gw.config.limits;
    let (outbox, rx) = crate::infra::outbox::outbox(limits.client_queue, limits.client_queue_bytes);
    let client = Client::new(conn_id.clone(), Arc::from(identity.user.as_str()), addr, outbox.clone());
    let (sink, mut stream) = socket.split();
    let ping_every = Duration::from_secs(limits.ping_interval_secs.max(1));
    let slow_after = Duration::from_secs(limits.slow_client_timeout_secs.max(1));
    #[expect(
        clippy::disallowed_methods,
        reason = "the connection awaits its writer before it ends"
    )]
    let writer = tokio::spawn(writer::write_frames(
        QuietSink::new(sink),
        rx,
        outbox.clone(),
        ping_every,
        slow_after,
    ));
    metrics::gauge!(crate::infra::metrics::CONNECTIONS).increment(1.0);
    metrics::counter!(crate::infra::metrics::CONNECTIONS_OPENED).increment(1);
    tracing::info!(connection = %conn_id, user = %identity.user, agent = %pool.name, "client connected");

    let mut conn = methods::Connection::new(gw.clone(), client.clone(), pool);
    // A client that sends nothing, not even a pong, for two ping intervals is gone or reads
    // nothing; in the second case the contract closes it only after `slow_client_timeout_secs`
    // and with 1013, whatever the writer had to send it.
    let ends = ends(&gw, &identity, &conn, (ping_every * 2).max(slow_after));
    let draining =
        reader::read_frames(&mut stream, &mut conn, &outbox, ends, &conn_id).await == reader::Ended::Draining;
    if draining {
        close_draining(&gw, &outbox, &conn_id, &identity.user).await;
    }
    outbox.close(1000, "");
    conn.finish();
    // The closing handshake: the writer sends the close frame while the peer's input is read
    // (and dropped) until its own close frame, so the socket is not reset under the peer's
    // feet; then the peer has a moment to answer.
    let peer_closed = async {
        while let Some(Ok(message)) = stream.next().await {
            if matches!(message, Message::Close(_)) {
                break;
            }
        }
    };
    tokio::pin!(peer_closed);
    let mut writer = writer;
    let replied = tokio::select! {
        _ = &mut writer => false,
        () = &mut peer_closed => true,
    };
    if replied {
        let _ = writer.await;
    } else {
        // A client closed for reading nothing may still be draining megabytes before it reaches
        // the close frame: dropping the socket under it (with its pongs unread here) would reset
        // the connection and wipe what it has not read yet.
        // Its close frame is in the kernel's hands now, behind at most a send buffer's worth.
        let slow = outbox.close_reason().is_some_and(|r| r.code == CLOSE_TOO_SLOW);
        let until = tokio::time::Instant::now() + if slow { SLOW_CLOSE_REPLY_WAIT } else { CLOSE_REPLY_WAIT };
        let _ = tokio::time::timeout_at(until, peer_closed).await;
    }
    drop(stream);
    metrics::gauge!(crate::infra::metrics::CONNECTIONS).decrement(1.0);
    tracing::info!(connection = %conn_id, user = %identity.user, "client disconnected");
}

/// When a connection of `identity` ends besides its client leaving or falling silent for
/// `silent_after`: its token's expiry, its sign-in ending (sign-out on any replica, or the
/// provider no longer lets the person in), the gateway draining once nothing `conn` asked is in
/// flight, or shutting down.
fn ends(
    gw: &Gateway,
    identity: &Identity,
    conn: &methods::Connection,
    silent_after: Duration,
) -> reader::Ends<
    impl std::future::Future<Output = ()> + Send + 'static,
    impl std::future::Future<Output = ()> + Send + 'static,
> {
    let now = tokio::time::Instant::now();
    let expires = now
        .checked_add(Duration::from_secs(identity.expires_at.saturating_sub(now_secs())))
        .unwrap_or_else(|| now + Duration::from_secs(10 * 365 * 24 * 3600));
    let watch = identity.session.as_deref().map(|sid| gw.identity.watched.watch(sid));
    let signed_out = async move {
        match watch {
            Some(w) => w.ended.cancelled().await,
            None => std::future::pending().await,
        }
    };
    reader::Ends {
        silent_after,
        expires,
        signed_out,
        drained: conn.drained(),
        shutdown: gw.life.shutdown.clone(),
    }
}

/// The gateway drains: the client gets what was queued for it (its prompt's answer), then 1001;
/// one that does not read is cut when shutdown comes.
async fn close_draining(gw: &Gateway, outbox: &Outbox, conn_id: &str, user: &str) {
    tracing::info!(connection = %conn_id, user = %user, "gateway draining; closing the connection (1001)");
    let written = async {
        outbox
            .close_when_written(reader::CLOSE_GOING_AWAY, "gateway shutting down")
            .await;
        outbox.closed().await;
    };
    tokio::select! {
        () = written => {}
        () = gw.life.shutdown.cancelled() => {
            outbox.close(reader::CLOSE_GOING_AWAY, "gateway shutting down");
        }
    }
}

impl reader::OnText for methods::Connection {
    fn on_text(&mut self, text: &str) -> impl std::future::Future<Output = ()> + Send {
        methods::Connection::on_text(self, text)
    }
}

/// The error frame for a frame that is not a usable JSON-RPC message.
fn parse_failure_frame(failure: ParseFailure) -> String {
    match failure {
        ParseFailure::NotJson(detail) => protocol::error(
            None,
            &RpcError::new(codes::PARSE_ERROR, format!("parse error: {detail}")),
        ),
        ParseFailure::Batch => protocol::error(
            None,
            &RpcError::new(codes::INVALID_REQUEST, "batch requests are not supported"),
        ),
        ParseFailure::Invalid(id, why) => protocol::error(
            id.as_deref().map(|i| i.get()),
            &RpcError::new(codes::INVALID_REQUEST, why),
        ),
    }
}

/// Reads the message kind, answering the client directly when the frame is unusable.
async fn parse_or_answer<'a>(client: &Client, text: &'a str) -> Option<(Incoming<'a>, Kind)> {
    match Incoming::parse(text) {
        Ok(parsed) => Some(parsed),
        Err(failure) => {
            client.outbox.send(Utf8Bytes::from(parse_failure_frame(failure))).await;
            None
        }
    }
}
