//! HTTP/2 without TLS (h2c, "prior knowledge"), which the transport RFD asks of Streamable HTTP
//! (TLS stays the proxy's job, as for everything else): a connection whose first bytes are the
//! HTTP/2 preface is served as HTTP/2, any other as HTTP/1.1. What it takes:
//! - [`sniff`]: reads the first bytes (under the header-read timeout) and hands them back in
//!   front of the stream ([`Prefixed`]), so neither protocol's server misses any;
//! - [`Tracked`]: hyper's HTTP/2 streams run as tasks of the gateway's tracker;
//! - [`InFlight`]: counts a connection's requests until their response bodies end (an SSE stream
//!   is in flight as long as it is read), so an HTTP/2 connection with none for the idle time is
//!   closed as a kept-alive HTTP/1.1 one is.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio_util::task::TaskTracker;

/// What an HTTP/2 client sends first (RFC 9113 3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A stream with bytes already read put back in front of it.
pub struct Prefixed<S> {
    prefix: Vec<u8>,
    at: usize,
    inner: S,
}

/// Reads what the peer sends first, until it is or cannot be the HTTP/2 preface, within
/// `within`: whether it is, and the stream with those bytes in front again. `Err` when the peer
/// sent nothing in time or went.
pub async fn sniff<S: AsyncRead + Unpin>(mut inner: S, within: Duration) -> io::Result<(bool, Prefixed<S>)> {
    let mut prefix = Vec::with_capacity(PREFACE.len());
    let read = async {
        let mut buf = [0u8; 24];
        loop {
            let want = PREFACE.len() - prefix.len();
            let n = inner.read(&mut buf[..want]).await?;
            if n == 0 {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
            }
            prefix.extend_from_slice(&buf[..n]);
            if !PREFACE.starts_with(&prefix) {
                return Ok(false);
            }
            if prefix.len() == PREFACE.len() {
                return Ok(true);
            }
        }
    };
    let h2 = tokio::time::timeout(within, read)
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
    Ok((h2, Prefixed { prefix, at: 0, inner }))
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.at < this.prefix.len() {
            let n = (this.prefix.len() - this.at).min(buf.remaining());
            buf.put_slice(&this.prefix[this.at..this.at + n]);
            this.at += n;
            if this.at == this.prefix.len() {
                this.prefix = Vec::new();
                this.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// hyper's executor for HTTP/2 streams: the gateway's task tracker.
#[derive(Clone)]
pub struct Tracked(pub TaskTracker);

impl<F> hyper::rt::Executor<F> for Tracked
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        self.0.spawn(fut);
    }
}

/// A connection's requests in flight (until their response bodies end).
#[derive(Default)]
pub struct InFlight {
    count: AtomicUsize,
    changed: Notify,
}

impl InFlight {
    /// A request begins; in flight until the guard is dropped.
    pub fn begin(self: &Arc<Self>) -> Guard {
        self.count.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_waiters();
        Guard(self.clone())
    }

    /// Resolves once the connection has had no request in flight for `idle` straight.
    pub async fn idle_for(&self, idle: Duration) {
        loop {
            let changed = self.changed.notified();
            if self.count.load(Ordering::Acquire) == 0 {
                if tokio::time::timeout(idle, changed).await.is_err() && self.count.load(Ordering::Acquire) == 0 {
                    return;
                }
            } else {
                changed.await;
            }
        }
    }
}

/// One request in flight.
pub struct Guard(Arc<InFlight>);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::AcqRel);
        self.0.changed.notify_waiters();
    }
}

/// A response body that keeps its request in flight until it ends or is dropped.
pub fn guarded(body: Body, guard: Guard) -> Body {
    Body::new(GuardedBody {
        inner: body,
        _guard: guard,
    })
}

struct GuardedBody {
    inner: Body,
    _guard: Guard,
}

impl HttpBody for GuardedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn the_preface_is_told_from_http1_and_nothing_read_is_lost() {
        let (mut a, b) = tokio::io::duplex(64);
        a.write_all(b"GET / HTTP/1.1\r\n").await.expect("write");
        let (h2, mut s) = sniff(b, Duration::from_secs(1)).await.expect("sniffed");
        assert!(!h2);
        let mut got = [0u8; 16];
        s.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"GET / HTTP/1.1\r\n");

        let (mut a, b) = tokio::io::duplex(64);
        a.write_all(&PREFACE[..10]).await.expect("write");
        let sniffing = TaskTracker::new().spawn(sniff(b, Duration::from_secs(5)));
        a.write_all(&PREFACE[10..]).await.expect("write");
        a.write_all(b"frames").await.expect("write");
        let (h2, mut s) = sniffing.await.expect("task").expect("sniffed");
        assert!(h2);
        let mut got = vec![0u8; PREFACE.len() + 6];
        s.read_exact(&mut got).await.expect("read");
        assert_eq!(&got[..PREFACE.len()], PREFACE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_peer_is_given_up_on_and_idleness_is_counted() {
        let (_a, b) = tokio::io::duplex(64);
        assert!(sniff(b, Duration::from_secs(10)).await.is_err());
        let flight = Arc::new(InFlight::default());
        let guard = flight.begin();
        let idle = TaskTracker::new().spawn({
            let flight = flight.clone();
            async move { flight.idle_for(Duration::from_secs(10)).await }
        });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!idle.is_finished(), "not idle while a request is in flight");
        drop(guard);
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert!(idle.is_finished());
    }
}
