//! The WebSocket bridge: one task pair per connection. The reader parses each frame once and
//! dispatches it ([`methods`]); the writer drains the client's bounded queue, batching frames into
//! one flush, and sends keepalive pings.
//!
//! Protocol errors (bad JSON, batches, unknown methods, bad params) are answered and the
//! connection lives; transport errors, a keepalive timeout, an expired token or shutdown end it.

pub mod client;
mod methods;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;

use crate::app::Gateway;
use crate::auth::{Identity, now_secs};
use crate::pool::AgentPool;
use crate::protocol::{self, Incoming, Kind, ParseFailure, RpcError, codes};
use client::{ClientHandle, Outbound};

/// Close code when the token expires (RFC 6455 1008, policy violation).
const CLOSE_TOKEN_EXPIRED: u16 = 1008;
/// Close code for a frame over the size cap (1009, message too big).
const CLOSE_TOO_BIG: u16 = 1009;
/// Close code on shutdown (1001, going away).
const CLOSE_GOING_AWAY: u16 = 1001;

/// Serves one upgraded connection until it ends.
pub async fn serve(socket: WebSocket, gw: Arc<Gateway>, identity: Identity, conn_id: Arc<str>, pool: Arc<AgentPool>) {
    let limits = &gw.config.limits;
    let (client, rx) = ClientHandle::new(
        conn_id.clone(),
        Arc::from(identity.user.as_str()),
        limits.client_queue,
        Duration::from_secs(limits.slow_client_timeout_secs),
    );
    let (sink, mut stream) = socket.split();
    let ping_every = Duration::from_secs(limits.ping_interval_secs.max(1));
    let writer = tokio::spawn(write_frames(sink, rx, ping_every));
    metrics::gauge!("acp_gateway_connections").increment(1.0);
    tracing::info!(connection = %conn_id, user = %identity.user, agent = %pool.name, "client connected");

    let mut conn = methods::Connection::new(gw.clone(), client.clone(), pool);
    let expires = tokio::time::Instant::now() + Duration::from_secs(identity.expires_at.saturating_sub(now_secs()));
    let expiry = tokio::time::sleep_until(expires);
    tokio::pin!(expiry);
    loop {
        let frame = tokio::select! {
            frame = tokio::time::timeout(ping_every * 2, stream.next()) => frame,
            () = client.closed() => break,
            () = &mut expiry => {
                tracing::info!(connection = %conn_id, user = %identity.user, "token expired; closing connection");
                client.close(CLOSE_TOKEN_EXPIRED, "token expired");
                break;
            }
            () = gw.shutdown.cancelled() => {
                client.close(CLOSE_GOING_AWAY, "gateway shutting down");
                break;
            }
        };
        match frame {
            Err(_) => {
                tracing::info!(connection = %conn_id, "no traffic or pong for two ping intervals; closing");
                client.close(CLOSE_GOING_AWAY, "keepalive timeout");
                break;
            }
            Ok(Some(Err(e))) => {
                // The one read error worth answering: a frame over the cap (1009, message too big).
                if e.to_string().contains("too long") {
                    tracing::info!(connection = %conn_id, "frame over max_frame_bytes; closing");
                    client.close(CLOSE_TOO_BIG, "message too big");
                }
                break;
            }
            Ok(None) | Ok(Some(Ok(Message::Close(_)))) => break,
            Ok(Some(Ok(Message::Text(text)))) => conn.on_text(text.as_str()).await,
            // Binary frames are ignored (transport RFD); pings are answered by the library.
            Ok(Some(Ok(_))) => {}
        }
    }
    client.close(1000, "");
    conn.finish().await;
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
    metrics::gauge!("acp_gateway_connections").decrement(1.0);
    tracing::info!(connection = %conn_id, user = %identity.user, "client disconnected");
}

/// Writes queued frames, several per flush, and pings every `ping_every`.
async fn write_frames(
    mut sink: futures_util::stream::SplitSink<WebSocket, Message>,
    mut rx: mpsc::Receiver<Outbound>,
    ping_every: Duration,
) {
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + ping_every, ping_every);
    let mut batch = Vec::with_capacity(512);
    loop {
        tokio::select! {
            n = rx.recv_many(&mut batch, 512) => {
                if n == 0 {
                    break;
                }
                for out in batch.drain(..) {
                    match out {
                        Outbound::Text(text) => {
                            if sink.feed(Message::Text(text)).await.is_err() {
                                return;
                            }
                        }
                        Outbound::Close(code, reason) => {
                            let frame = CloseFrame { code, reason: Utf8Bytes::from_static(reason) };
                            let _ = sink.send(Message::Close(Some(frame))).await;
                            return;
                        }
                    }
                }
                if sink.flush().await.is_err() {
                    return;
                }
            }
            _ = ping.tick() => {
                if sink.send(Message::Ping(bytes::Bytes::new())).await.is_err() {
                    return;
                }
            }
        }
    }
    let _ = sink.close().await;
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
async fn parse_or_answer<'a>(client: &ClientHandle, text: &'a str) -> Option<(Incoming<'a>, Kind)> {
    match Incoming::parse(text) {
        Ok(parsed) => Some(parsed),
        Err(failure) => {
            client.send(Utf8Bytes::from(parse_failure_frame(failure))).await;
            None
        }
    }
}
