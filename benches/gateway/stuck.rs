//! Section 6: what a stuck tab costs the others. One tab of the bench user starts a
//! 200,000-update stream and never reads a byte of it (its queue fills, it is switched to
//! catch-up from the store, and it stays stuck: it would be closed only after
//! `slow_client_timeout_secs`, 60 s by default). Meanwhile two other tabs take turns with small
//! prompts: the same user's other session (same agent process, whose output the stream floods)
//! and another user's (only the gateway in common). Their round trips are compared with the same
//! tabs' just before, without the stuck one. The target: the worst round trip of a tab
//! while another is stuck is at most 50 ms above its usual (p50 before).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use acp_gateway::app::Gateway;
use anyhow::Result;
use serde_json::json;

use super::stats::{Stats, stats};
use super::transport::{Rpc, Transport, WsClient};
use super::{GATEWAY_EXTRAS, Path, metric_total, stored_last_seq};

/// Prompts each tab makes before the stuck tab starts (its baseline).
const BASELINE_PROMPTS: u64 = 300;
/// How long the tabs keep prompting at least, once the stuck tab's stream started.
const AT_LEAST: Duration = Duration::from_secs(3);
/// And at most (well under the default 60 s after which the stuck tab is closed).
const AT_MOST: Duration = Duration::from_secs(40);
/// The target: a tab's worst round trip while another is stuck, above its usual.
const TARGET_MS: f64 = 50.0;
/// Each turn of the two tabs starts at most this often: each user stays under the default
/// per-user rate (`requests_per_second_per_user`, 1,000), which a fast store's round trips
/// (two tabs' turns in ~0.9 ms on SQLite) would otherwise pass and be refused with -32029.
const TURN: Duration = Duration::from_micros(1250);

/// `token(user)` mints a token; `same` is the bench user's tab the latency sections used.
pub async fn section(
    gw_rt: &tokio::runtime::Runtime,
    gw: &Gateway,
    addr: std::net::SocketAddr,
    token: impl Fn(&str) -> Result<String>,
    same: &mut Path<WsClient>,
    n_updates: u64,
    md: &mut String,
) -> Result<()> {
    println!();
    println!(
        "== 6. a stuck tab's cost to other tabs: one tab of the same user streams [chunks={n_updates}] and never reads ==",
    );
    let mut other = Path::new(
        "other user",
        WsClient::connect(addr, "/acp", Some(&token("bench-other")?)).await?,
        GATEWAY_EXTRAS,
    )
    .await?;
    let mut turns = tokio::time::interval(TURN);
    turns.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut before = (Vec::new(), Vec::new());
    for _ in 0..BASELINE_PROMPTS {
        turns.tick().await;
        before.0.push(same.rpc.small_prompt(&same.session, same.extras).await?);
        before
            .1
            .push(other.rpc.small_prompt(&other.session, other.extras).await?);
    }

    let mut stuck = Rpc::new(WsClient::connect(addr, "/acp", Some(&token("bench")?)).await?);
    let stuck_session = stuck.setup().await?;
    let prompt = json!({
        "jsonrpc": "2.0", "id": "stuck", "method": "session/prompt",
        "params": Rpc::<WsClient>::prompt_params(&stuck_session, &format!("stuck [chunks={n_updates}] [delay_us=0]")),
    });
    let catch_ups = metric_total("acp_gateway_client_catch_ups_total");
    stuck.t.send(&prompt.to_string()).await?;
    let started = Instant::now();
    let whole = (n_updates + GATEWAY_EXTRAS) as i64;
    let mut during = (Vec::new(), Vec::new());
    let mut stored_after = None;
    while started.elapsed() < AT_MOST {
        for _ in 0..20 {
            turns.tick().await;
            during.0.push(same.rpc.small_prompt(&same.session, same.extras).await?);
            during
                .1
                .push(other.rpc.small_prompt(&other.session, other.extras).await?);
        }
        if stored_after.is_none() && stored_last_seq(gw_rt, gw, &stuck_session).await? >= whole {
            stored_after = Some(started.elapsed());
        }
        if stored_after.is_some() && started.elapsed() >= AT_LEAST {
            break;
        }
    }
    let stored = stored_after.map_or("not yet (the stream outlasted the measurement)".to_string(), |d| {
        format!("{:.2} s", d.as_secs_f64())
    });
    println!(
        "the stuck tab's stream was stored in {stored} (the tab was switched to catch-up {} time(s), acp_gateway_client_catch_ups_total); the other tabs prompted for {:.1} s meanwhile",
        metric_total("acp_gateway_client_catch_ups_total") - catch_ups,
        started.elapsed().as_secs_f64()
    );
    println!(
        "{:<26} {:>7} {:>10} {:>10} {:>10}   {:>7} {:>10} {:>10} {:>10}",
        "tab", "before", "p50 µs", "p99 µs", "max µs", "during", "p50 µs", "p99 µs", "max µs"
    );
    let mut worst_added: f64 = 0.0;
    for (name, b, d) in [
        ("same user, other session", &before.0, &during.0),
        ("another user", &before.1, &during.1),
    ] {
        let (b, d): (Stats, Stats) = (stats(b), stats(d));
        println!(
            "{name:<26} {:>7} {:>10.1} {:>10.1} {:>10.1}   {:>7} {:>10.1} {:>10.1} {:>10.1}",
            b.n, b.p50, b.p99, b.max, d.n, d.p50, d.p99, d.max
        );
        worst_added = worst_added.max(d.max - b.p50);
        let _ = writeln!(
            md,
            "| | a stuck tab's cost to a tab of {name}: round trip p50 / p99 / worst while it is stuck (before: p50), ms | – | – | {:.2} / {:.2} / {:.1} ({:.2}) | – |",
            d.p50 / 1e3,
            d.p99 / 1e3,
            d.max / 1e3,
            b.p50 / 1e3
        );
    }
    println!(
        "target: a stuck tab costs another tab <= {TARGET_MS} ms worst ({:.1} ms above its p50 before): {}",
        worst_added / 1e3,
        if worst_added <= TARGET_MS * 1e3 {
            "MEETS"
        } else {
            "MISSES"
        }
    );
    // The stuck tab goes (its socket closes); the bench user's tab goes on in section 1's shape.
    drop(stuck);
    Ok(())
}
