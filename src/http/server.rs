//! The listener: accepts TCP connections and serves them with hyper, under the limits the socket
//! layer needs before any route runs (axum's own `serve` has no timers):
//! - a header-read timeout, so half-sent requests cannot hold sockets;
//! - a cap on connections that have not finished an upgrade (plain HTTP, handshakes);
//! - a cap on connections per client address (upgraded WebSockets included), except from
//!   trusted proxies, whose own clients are not told apart at this layer.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::config::Limits;

/// Open connections per client address.
type PeerCounts = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// One of a client address's connection slots, held by its HTTP connection and by the WebSocket
/// it upgrades to; given back when the last holder lets go.
#[derive(Debug)]
pub struct PeerSlot {
    ip: IpAddr,
    counts: PeerCounts,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = counts.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}

/// What a route knows of the connection it was called on.
#[derive(Debug, Clone)]
pub struct Peer {
    /// The client address (a trusted proxy's, behind one).
    pub addr: SocketAddr,
    /// Its per-address slot (`None` for a trusted proxy): held, never read.
    pub _slot: Option<Arc<PeerSlot>>,
}

fn take_slot(counts: &PeerCounts, ip: IpAddr, max: usize) -> Option<PeerSlot> {
    let mut map = counts.lock().unwrap_or_else(|e| e.into_inner());
    let n = map.entry(ip).or_insert(0);
    if *n >= max {
        return None;
    }
    *n += 1;
    Some(PeerSlot {
        ip,
        counts: counts.clone(),
    })
}

fn refused(reason: &'static str) {
    metrics::counter!("acp_gateway_connections_refused_total", "reason" => reason).increment(1);
}

/// Serves `router` on `listener` until `stop` fires, then lets open HTTP connections finish for
/// up to `grace` (upgraded WebSockets are the caller's to drain).
pub async fn serve(listener: TcpListener, router: Router, limits: &Limits, stop: CancellationToken, grace: Duration) {
    let pending = Arc::new(Semaphore::new(limits.max_pending_connections.max(1)));
    let per_ip: PeerCounts = Arc::default();
    let graceful = GracefulShutdown::new();
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
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
        let slot = if limits.trusted_proxies.contains(&addr.ip()) {
            None
        } else {
            match take_slot(&per_ip, addr.ip(), limits.max_connections_per_ip) {
                Some(slot) => Some(Arc::new(slot)),
                None => {
                    refused("per_ip");
                    continue;
                }
            }
        };
        let service = TowerToHyperService::new(router.clone().layer(axum::Extension(Peer { addr, _slot: slot })));
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            // Ends when the peer goes, or when the connection is upgraded (the WebSocket then
            // lives in a task of its own and no longer counts as pending).
            let _ = connection.await;
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
        tracing::warn!("some HTTP connections did not finish within the grace period");
    }
}
