//! Who a request comes from, and how often an address may knock on `/auth/*`.
//!
//! [`client_address`] runs on every request: it puts the client's address in the connection's
//! [`Peer`] (behind a trusted proxy, the client the proxy names, not the proxy), so the audit log
//! and the limit below see the person, not the load balancer. On `/auth/*` (sign-in, sign-out, the
//! identity provider's legs, device codes), which anyone may call without a token, each address
//! gets `limits.auth_requests_per_minute_per_ip` requests a minute, as a burst that refills
//! evenly (GCRA, `governor`: the crate the per-user request rate already uses); more get `429`
//! with `Retry-After`. IPv6 addresses count per /64, the block one host usually holds. The
//! limiter forgets quiet addresses once it holds [`SWEEP_ABOVE`] of them, so a spray of
//! addresses cannot grow it without bound.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use super::server::Peer;

/// Addresses held before quiet ones are forgotten.
const SWEEP_ABOVE: usize = 10_000;

/// The `/auth/*` limit (none when `limits.auth_requests_per_minute_per_ip` is 0).
#[derive(Debug)]
pub(super) struct AuthLimit {
    limiter: Option<DefaultKeyedRateLimiter<IpAddr>>,
}

impl AuthLimit {
    pub(super) fn new(per_minute: u32) -> Arc<Self> {
        Arc::new(Self {
            limiter: NonZeroU32::new(per_minute).map(|n| RateLimiter::keyed(Quota::per_minute(n))),
        })
    }

    /// `Err(seconds to wait)` when `ip` is over the limit.
    fn check(&self, ip: IpAddr) -> Result<(), u64> {
        let Some(limiter) = &self.limiter else { return Ok(()) };
        if limiter.len() > SWEEP_ABOVE {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
        limiter.check_key(&block_of(ip)).map_err(|not_until| {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
        })
    }
}

/// The key an address is counted under: IPv4 as it is, IPv6 by its /64.
fn block_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
    }
}

/// Records the client's address on the request's [`Peer`], and limits `/auth/*` per address.
pub(super) async fn client_address(State(limit): State<Arc<AuthLimit>>, mut req: Request, next: Next) -> Response {
    let ip = req.extensions().get::<Peer>().map(|peer| peer.client_ip(req.headers()));
    if let (Some(ip), Some(peer)) = (ip, req.extensions_mut().get_mut::<Peer>()) {
        peer.client = ip;
    }
    if let Some(ip) = ip
        && req.uri().path().starts_with("/auth/")
        && let Err(wait) = limit.check(ip)
    {
        crate::infra::metrics::connection_refused("auth_rate");
        tracing::info!(client = %ip, path = req.uri().path(), "too many sign-in requests from one address");
        let body = axum::Json(serde_json::json!({
            "error": format!("too many sign-in requests from your address; try again in {wait} s")
        }));
        let mut response = (StatusCode::TOO_MANY_REQUESTS, body).into_response();
        let h = response.headers_mut();
        h.insert(header::RETRY_AFTER, HeaderValue::from(wait.max(1)));
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        return response;
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_counts_per_64_and_mapped_ipv4_as_ipv4() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().expect("ip");
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().expect("ip");
        let c: IpAddr = "2001:db8:1:3::1".parse().expect("ip");
        assert_eq!(block_of(a), block_of(b));
        assert_ne!(block_of(a), block_of(c));
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().expect("ip");
        assert_eq!(block_of(mapped), "192.0.2.7".parse::<IpAddr>().expect("ip"));
    }

    #[test]
    fn an_address_over_the_limit_is_told_when_to_come_back() {
        let limit = AuthLimit::new(3);
        let (one, two): (IpAddr, IpAddr) = ("192.0.2.1".parse().expect("ip"), "192.0.2.2".parse().expect("ip"));
        for _ in 0..3 {
            assert_eq!(limit.check(one), Ok(()));
        }
        let wait = limit.check(one).expect_err("the fourth in a minute");
        assert!((1..=20).contains(&wait), "{wait}");
        assert_eq!(limit.check(two), Ok(()), "another address is not affected");
        assert_eq!(AuthLimit::new(0).check(one), Ok(()), "0: no limit");
    }
}
