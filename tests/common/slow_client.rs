//! A [`Client`] on a socket with a small kernel receive buffer, for clients that stop reading, and
//! the reads that end such a client's story (everything in flight, then the close frame).

use std::net::SocketAddr;

use futures_util::StreamExt;
use tokio_tungstenite::MaybeTlsStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

use super::{Client, WAIT};

/// How a connection ended, as the client saw it.
#[derive(Debug, Default)]
pub struct Ending {
    /// Text frames read before the end.
    pub texts: usize,
    /// Bytes of those frames.
    pub bytes: usize,
    /// The close frame's code, if a close frame came.
    pub close_code: Option<u16>,
    /// The close frame's reason.
    pub close_reason: String,
    /// Whether a close frame came at all (it may carry no code).
    pub closed_by_frame: bool,
    /// The transport error or timeout that ended it instead, if any.
    pub error: Option<String>,
}

impl Client {
    /// Connects to `addr` (`url` is its `ws://…/acp`) with `Authorization: Bearer token`, on a TCP
    /// socket whose receive buffer is `recv_buffer` bytes (the kernel doubles it), so that a
    /// client that stops reading makes the gateway's writes back up quickly.
    pub async fn connect_with_recv_buffer(url: &str, addr: SocketAddr, token: &str, recv_buffer: u32) -> Self {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(recv_buffer).expect("SO_RCVBUF");
        let stream = socket.connect(addr).await.expect("TCP connect");
        stream.set_nodelay(true).expect("TCP_NODELAY");
        let mut req = url.into_client_request().expect("request");
        req.headers_mut()
            .insert("authorization", format!("Bearer {token}").parse().expect("header"));
        let (ws, resp) = tokio_tungstenite::client_async(req, MaybeTlsStream::Plain(stream))
            .await
            .expect("WebSocket handshake");
        let connection_id = resp
            .headers()
            .get("acp-connection-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        Self {
            ws,
            next_id: 0,
            inbox: Default::default(),
            connection_id,
            root: String::new(),
        }
    }

    /// This client's end of the TCP connection.
    pub fn local_addr(&self) -> SocketAddr {
        match self.ws.get_ref() {
            MaybeTlsStream::Plain(s) => s.local_addr().expect("local addr"),
            _ => panic!("plain TCP only"),
        }
    }

    /// The next text frame as it came, without parsing it (for readers that must keep up with a
    /// fast stream), or `None` once the connection ended; panics after [`WAIT`] without either.
    pub async fn recv_text(&mut self) -> Option<Utf8Bytes> {
        loop {
            match tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("a frame in time")
            {
                Some(Ok(Message::Text(t))) => return Some(t),
                Some(Ok(Message::Close(_)) | Err(_)) | None => return None,
                Some(Ok(_)) => {}
            }
        }
    }

    /// Reads every remaining frame until the connection ends; each frame must come within
    /// [`WAIT`] of the previous one.
    pub async fn read_to_end(&mut self) -> Ending {
        let mut end = Ending::default();
        loop {
            match tokio::time::timeout(WAIT, self.ws.next()).await {
                Err(_) => {
                    end.error = Some(format!("no frame and no end for {WAIT:?}"));
                    return end;
                }
                Ok(None) => return end,
                Ok(Some(Err(e))) => {
                    end.error = Some(e.to_string());
                    return end;
                }
                Ok(Some(Ok(Message::Text(t)))) => {
                    end.texts += 1;
                    end.bytes += t.len();
                }
                Ok(Some(Ok(Message::Close(frame)))) => {
                    end.closed_by_frame = true;
                    if let Some(f) = frame {
                        end.close_code = Some(f.code.into());
                        end.close_reason = f.reason.to_string();
                    }
                    return end;
                }
                Ok(Some(Ok(_))) => {}
            }
        }
    }
}
