//! The listener: accepts TCP connections and serves them with hyper, under the limits the socket
//! layer needs before any route runs (axum's own `serve` has no timers):
//! - HTTP/1.1 (the browsers' and the SDKs' WebSocket handshakes are HTTP/1.1), with a
//!   header-read timeout that runs from the moment a connection is accepted and again while a
//!   kept-alive connection waits for its next request, so silent or half-sent requests cannot hold
//!   sockets (hyper-util's auto builder first waits, with no timer, to tell HTTP/2 from HTTP/1);
//! - HTTP/2 with prior knowledge (h2c, for Streamable HTTP), told from HTTP/1.1 by its first
//!   bytes under the same timer ([`h2c`]), closed after the same idle time with no request open,
//!   with pings to find dead peers and a cap on streams and header bytes;
//! - a cap on connections that have not finished an upgrade (plain HTTP, handshakes);
//! - a cap on connections per client address (upgraded WebSockets included). A trusted proxy's
//!   connections are not capped as its own: each WebSocket through it counts against the address
//!   the proxy says its client has (`X-Forwarded-For`, else `Forwarded: for=`), see
//!   [`Peer::forwarded_slot`].

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::HeaderMap;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::h2c;
use crate::infra::config::Limits;
use crate::usage::quota::{Counted, Slot};

/// Requests one HTTP/2 connection may have open at once (its SSE streams included).
const H2_STREAMS: u32 = 256;
/// Most bytes of headers an HTTP/2 request may carry (HTTP/1.1's are bounded by hyper's buffer).
const H2_HEADER_BYTES: u32 = 64 << 10;

/// Open connections per client address.
type PeerCounts = Arc<Counted<IpAddr>>;

/// One of a client address's connection slots, held by its HTTP connection and by the WebSocket
/// it upgrades to; given back when the last holder lets go.
pub type PeerSlot = Slot<IpAddr>;

/// What a route knows of the connection it was called on.
#[derive(Debug, Clone)]
pub struct Peer {
    /// The address the connection comes from (a trusted proxy's, behind one).
    pub addr: SocketAddr,
    /// The client's address: `addr`'s, or behind a trusted proxy the client it names (set per
    /// request by `ratelimit::client_address`).
    pub client: IpAddr,
    /// Its per-address slot (`None` for a trusted proxy): held, never read.
    pub _slot: Option<Arc<PeerSlot>>,
    /// Set when the connection comes from a trusted proxy.
    proxy: Option<Arc<Proxied>>,
}

/// How the clients of trusted proxies are counted.
#[derive(Debug)]
struct Proxied {
    counts: PeerCounts,
    trusted: Vec<IpAddr>,
}

/// A client address the proxy in front has reached its cap.
#[derive(Debug)]
pub struct TooManyFromAddress(pub IpAddr);

impl Peer {
    /// For a request that came through a trusted proxy, a slot of the address of the proxy's
    /// client, to hold as long as what the request opens (a WebSocket). `Ok(None)` when the
    /// request came straight from its client (already counted when it connected) or the proxy
    /// named no client.
    pub fn forwarded_slot(&self, headers: &HeaderMap) -> Result<Option<PeerSlot>, TooManyFromAddress> {
        let Some(proxy) = &self.proxy else { return Ok(None) };
        let Some(ip) = forwarded_client(headers, &proxy.trusted) else {
            return Ok(None);
        };
        proxy.counts.take(&ip).map(Some).ok_or(TooManyFromAddress(ip))
    }

    /// The client's address: the connection's, or behind a trusted proxy the client it names
    /// (the proxy's own when it names none).
    pub fn client_ip(&self, headers: &HeaderMap) -> IpAddr {
        self.proxy
            .as_ref()
            .and_then(|proxy| forwarded_client(headers, &proxy.trusted))
            .unwrap_or(self.addr.ip())
    }
}

/// The client a chain of trusted proxies forwarded: the rightmost address of `X-Forwarded-For`
/// (else of the `for=` parameters of `Forwarded`) that is not itself a trusted proxy. Addresses
/// left of it were written by the client and prove nothing.
fn forwarded_client(headers: &HeaderMap, trusted: &[IpAddr]) -> Option<IpAddr> {
    let values = |name: &str| -> Vec<String> {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|v| v.trim().to_string())
            .collect()
    };
    let mut chain: Vec<String> = values("x-forwarded-for");
    if chain.is_empty() {
        chain = values("forwarded")
            .iter()
            .filter_map(|element| {
                element.split(';').find_map(|pair| {
                    let (k, v) = pair.trim().split_once('=')?;
                    k.trim().eq_ignore_ascii_case("for").then(|| v.trim().to_string())
                })
            })
            .collect();
    }
    chain
        .iter()
        .rev()
        .map(|v| parse_node(v))
        .find(|ip| ip.is_none_or(|ip| !trusted.contains(&ip)))
        .flatten()
}

/// An address as a proxy writes it: `192.0.2.1`, `192.0.2.1:4711`, `"[2001:db8::1]:4711"`,
/// `2001:db8::1`. `None` for anything else (`unknown`, obfuscated names).
fn parse_node(v: &str) -> Option<IpAddr> {
    let v = v.trim().trim_matches('"');
    if let Ok(ip) = v.parse() {
        return Some(ip);
    }
    if let Ok(addr) = v.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    v.strip_prefix('[')?.split(']').next()?.parse().ok()
}

fn refused(reason: &'static str) {
    crate::infra::metrics::connection_refused(reason);
}

/// Serves `router` on `listener` until `stop` fires, then lets open HTTP connections finish for
/// up to `grace` (upgraded WebSockets are the caller's to drain).
pub async fn serve(listener: TcpListener, router: Router, limits: &Limits, stop: CancellationToken, grace: Duration) {
    let pending = Arc::new(Semaphore::new(limits.max_pending_connections.max(1)));
    let per_ip: PeerCounts = Counted::new(limits.max_connections_per_ip);
    let proxied = Arc::new(Proxied {
        counts: per_ip.clone(),
        trusted: limits.trusted_proxies.clone(),
    });
    let connections = TaskTracker::new();
    let header_timeout = Duration::from_secs(limits.header_read_timeout_secs.max(1));
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(header_timeout);
    let mut h2 = http2::Builder::new(h2c::Tracked(connections.clone()));
    h2.timer(TokioTimer::new())
        // A peer that stops answering pings is gone, as a WebSocket's that sends no pong.
        .keep_alive_interval(Some(Duration::from_secs(limits.ping_interval_secs.max(1))))
        .keep_alive_timeout(Duration::from_secs(limits.ping_interval_secs.max(1)))
        .max_concurrent_streams(H2_STREAMS)
        .max_header_list_size(H2_HEADER_BYTES);
    loop {
        let (stream, addr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: do not spin on it.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stop.cancelled() => break,
        };
        // A prompt round trip must not wait on Nagle.
        let _ = stream.set_nodelay(true);
        let Ok(permit) = pending.clone().try_acquire_owned() else {
            refused("pending");
            continue;
        };
        let (slot, proxy) = if limits.trusted_proxies.contains(&addr.ip()) {
            (None, Some(proxied.clone()))
        } else {
            match per_ip.take(&addr.ip()) {
                Some(slot) => (Some(Arc::new(slot)), None),
                None => {
                    refused("per_ip");
                    continue;
                }
            }
        };
        let peer = Peer {
            addr,
            client: addr.ip(),
            _slot: slot,
            proxy,
        };
        let router = router.clone().layer(axum::Extension(peer));
        let (builder, h2, stop) = (builder.clone(), h2.clone(), stop.clone());
        connections.spawn(async move {
            // HTTP/2 with prior knowledge (h2c) or HTTP/1.1, told by the first bytes.
            let Ok((is_h2, stream)) = h2c::sniff(stream, header_timeout).await else {
                drop(permit);
                return;
            };
            if is_h2 {
                serve_h2(h2, stream, router, &stop, header_timeout).await;
                drop(permit);
                return;
            }
            let service = TowerToHyperService::new(router);
            let connection = builder.serve_connection(TokioIo::new(stream), service).with_upgrades();
            // Ends when the peer goes, or when the connection is upgraded (the WebSocket then
            // lives in a task of its own and no longer counts as pending). On shutdown a request
            // in progress finishes and the connection then closes.
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                () = stop.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            drop(permit);
        });
    }
    drop(listener);
    connections.close();
    if tokio::time::timeout(grace, connections.wait()).await.is_err() {
        tracing::warn!("some HTTP connections did not finish within the grace period");
    }
}

/// Serves an HTTP/2 connection: its requests counted until their bodies end, closed (GOAWAY,
/// requests in progress finish) when it has had none for `idle` or on shutdown.
async fn serve_h2(
    h2: http2::Builder<h2c::Tracked>,
    stream: h2c::Prefixed<tokio::net::TcpStream>,
    router: Router,
    stop: &CancellationToken,
    idle: Duration,
) {
    let flight = Arc::new(h2c::InFlight::default());
    let counted = flight.clone();
    let router = router.layer(axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| {
            let guard = counted.begin();
            async move { next.run(req).await.map(|body| h2c::guarded(body, guard)) }
        },
    ));
    let connection = h2.serve_connection(TokioIo::new(stream), TowerToHyperService::new(router));
    let mut connection = std::pin::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => return,
        () = stop.cancelled() => {}
        () = flight.idle_for(idle) => {}
    }
    connection.as_mut().graceful_shutdown();
    let _ = connection.await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn the_client_is_the_rightmost_untrusted_forwarded_address() {
        let proxy: IpAddr = "10.0.0.1".parse().expect("ip");
        let inner: IpAddr = "10.0.0.2".parse().expect("ip");
        let ip = |s: &str| s.parse::<IpAddr>().ok();
        let xff = |v| forwarded_client(&headers(&[("x-forwarded-for", v)]), &[proxy, inner]);
        assert_eq!(xff("203.0.113.7"), ip("203.0.113.7"));
        // What the client wrote itself (left) proves nothing; the proxies' own hops are skipped.
        assert_eq!(xff("1.2.3.4, 203.0.113.7, 10.0.0.2"), ip("203.0.113.7"));
        assert_eq!(xff("203.0.113.7:5555"), ip("203.0.113.7"));
        assert_eq!(xff("[2001:db8::1]:4711"), ip("2001:db8::1"));
        assert_eq!(xff("1.2.3.4, unknown"), None, "an unparsable hop is not skipped over");
        let fwd = |v| forwarded_client(&headers(&[("forwarded", v)]), &[proxy]);
        assert_eq!(
            fwd(r#"for=192.0.2.60;proto=http, for="[2001:db8:cafe::17]:4711""#),
            ip("2001:db8:cafe::17")
        );
        assert_eq!(fwd("for=198.51.100.17;by=10.0.0.1, for=10.0.0.1"), ip("198.51.100.17"));
        assert_eq!(forwarded_client(&HeaderMap::new(), &[proxy]), None);
    }
}
