//! The listener: accepts TCP connections and serves them with hyper, under the limits the socket
//! layer needs before any route runs (axum's own `serve` has no timers):
//! - HTTP/1.1 only (the browser's and the SDKs' WebSocket handshakes are HTTP/1.1), with a
//!   header-read timeout that runs from the moment a connection is accepted and again while a
//!   kept-alive connection waits for its next request, so silent or half-sent requests cannot hold
//!   sockets (hyper-util's auto builder first waits, with no timer, to tell HTTP/2 from HTTP/1);
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
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::infra::config::Limits;
use crate::usage::quota::{Counted, Slot};

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
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(limits.header_read_timeout_secs.max(1)));
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
        let service = TowerToHyperService::new(router.clone().layer(axum::Extension(peer)));
        let connection = builder.serve_connection(TokioIo::new(stream), service).with_upgrades();
        let stop = stop.clone();
        connections.spawn(async move {
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
