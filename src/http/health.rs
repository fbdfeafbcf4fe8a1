//! `/healthz` (the process runs), `/readyz` (it can serve), `/metrics` (Prometheus; behind a
//! bearer token when `metrics_token` is set).

use crate::agents::pool::Pools;
use crate::gateway::Identities;
use crate::gateway::Life;
use crate::infra::config::Config;
use crate::session::Sessions;
use crate::tenancy::Tenancy;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::gateway::Gateway;
use crate::infra::config::DEFAULT_AGENT;
use crate::tenancy::Confinement;

pub(super) fn router() -> Router<Gateway> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
}

async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

/// How often `/readyz` may ask the identity provider itself (its key set), and how long it waits.
const PROVIDER_PROBE_EVERY: Duration = Duration::from_secs(5);
const PROVIDER_PROBE_WAIT: Duration = Duration::from_secs(3);

/// The identity provider's check (`[oidc]`, or `jwt.jwks_url` alone), `None` when there is none.
/// Down is degraded, not unready: signed-in people keep working. The provider is asked (its key
/// set, at most every [`PROVIDER_PROBE_EVERY`], one request at a time) so that an outage shows
/// without waiting for someone to sign in or a token to need a key, and so does its end.
async fn identity_provider(ids: &Identities) -> Option<Value> {
    if ids.oidc.is_none() && ids.jwks.is_none() {
        return None;
    }
    let probe = async {
        if let Some(oidc) = &ids.oidc {
            // Discovery names the keys; once failed, it is tried again (at most every few
            // seconds) so that its failure ends when the provider is back.
            let failed = oidc.failure().is_some();
            if failed || oidc.api_keys().is_none() {
                let _ = oidc.provider(failed).await;
            }
        }
        let keys = ids.provider_keys()?;
        keys.probe(PROVIDER_PROBE_EVERY)
            .await
            .then(|| format!("cannot fetch the provider's keys from {}", keys.url()))
    };
    let degraded = match tokio::time::timeout(PROVIDER_PROBE_WAIT, probe).await {
        Err(_) => Some(format!(
            "the identity provider did not answer in {} s",
            PROVIDER_PROBE_WAIT.as_secs()
        )),
        Ok(keys) => match &ids.oidc {
            Some(oidc) => oidc.degraded().await.or(keys),
            None => keys,
        },
    };
    Some(match degraded {
        Some(why) => json!(format!("degraded: {why}")),
        None => json!("ok"),
    })
}

/// Ready when the database answers, the transcript writer's writes succeed (on SQLite a full disk
/// still answers `SELECT 1`), the default agent can be started, and we are not draining.
async fn readyz(
    State(ids): State<Arc<Identities>>,
    State(sessions): State<Arc<Sessions>>,
    State(pools): State<Arc<Pools>>,
    State(tenancy): State<Arc<Tenancy>>,
    State(life): State<Arc<Life>>,
    State(config): State<Arc<Config>>,
) -> impl IntoResponse {
    let database = match tokio::time::timeout(Duration::from_secs(3), sessions.store().ping()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(String::from("timed out")),
    };
    let writer = sessions.writer_health();
    let agent = match pools.get(DEFAULT_AGENT) {
        Some(pool) => match tokio::time::timeout(Duration::from_secs(30), pool.info()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.message.to_string()),
            Err(_) => Err(String::from("timed out starting the agent")),
        },
        None => Err(String::from("no default agent configured")),
    };
    let draining = life.is_draining();
    let oidc = identity_provider(&ids).await;
    let ready = database.is_ok() && writer.is_ok() && agent.is_ok() && !draining;
    fn check(r: &Result<(), impl std::fmt::Display>) -> Value {
        match r {
            Ok(()) => json!("ok"),
            Err(e) => json!(format!("error: {e}")),
        }
    }
    // Not failures, but never silent: agents without a sandbox, a configuration file whose
    // secrets something can read, roots that cannot be used (skipped, never stopping the others).
    let warnings: Vec<String> = tenancy.warnings(&config);
    let sandbox: serde_json::Map<String, Value> = config
        .agents
        .iter()
        .map(|(name, agent)| {
            let mode = match tenancy.confinement(agent.sandbox) {
                Confinement::Sandboxed => json!("bwrap"),
                Confinement::NoneByChoice => json!("none (single-tenant)"),
                // Who that one user is stays off this unauthenticated route.
                Confinement::SingleUser => json!("single-user: bubblewrap does not work here"),
            };
            (name.clone(), mode)
        })
        .collect();
    // What each agent's processes reach on the network (`network`).
    let network: serde_json::Map<String, Value> = config
        .agents
        .iter()
        .map(|(name, agent)| (name.clone(), json!(agent.network.as_str())))
        .collect();
    let mut body = json!({
        "status": if ready { "ready" } else { "unavailable" },
        "checks": {
            "database": check(&database),
            "transcriptWriter": check(&writer),
            "defaultAgent": check(&agent),
            "draining": draining,
        },
        "sandbox": sandbox,
        "network": network,
        "warnings": warnings,
    });
    if let Some(oidc) = oidc {
        body["checks"]["oidc"] = oidc;
    }
    (
        if ready {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        },
        Json(body),
    )
}

/// Whether `headers` carry `Authorization: Bearer <token>`. Compared as SHA-256 digests, byte by
/// byte to the end: the time taken tells nothing of the token, its length included.
fn bearer_matches(headers: &HeaderMap, token: &secrecy::SecretString) -> bool {
    use sha2::{Digest, Sha256};
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim());
    let Some(given) = given else {
        return false;
    };
    let expected = Sha256::digest(secrecy::ExposeSecret::expose_secret(token).as_bytes());
    let given = Sha256::digest(given.as_bytes());
    expected.iter().zip(given.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// Gauges that are a count of what the gateway holds are taken at each scrape, from the pools and
/// sessions themselves (nothing to keep in step on their paths). With `metrics_token` set, only
/// for its bearer: anything that reaches the port (an agent on this host) would otherwise read
/// every agent's and user's counts.
async fn metrics(
    State(sessions): State<Arc<Sessions>>,
    State(pools): State<Arc<Pools>>,
    State(config): State<Arc<Config>>,
    headers: HeaderMap,
) -> Response {
    use crate::infra::metrics::{AGENT_PROCESSES, SESSIONS_IN_MEMORY, SESSIONS_LIVE};
    if let Some(token) = &config.metrics_token
        && !bearer_matches(&headers, token)
    {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer realm=\"metrics\"")],
            "/metrics needs Authorization: Bearer <metrics_token>\n",
        )
            .into_response();
    }
    metrics::gauge!(SESSIONS_IN_MEMORY).set(sessions.in_memory() as f64);
    let mut live = 0;
    for (name, pool) in pools.iter() {
        let states = pool.process_states();
        live += states.sessions;
        for (state, n) in [
            ("starting", states.starting),
            ("idle", states.idle),
            ("busy", states.busy),
        ] {
            metrics::gauge!(AGENT_PROCESSES, "agent" => name.clone(), "state" => state).set(n as f64);
        }
    }
    metrics::gauge!(SESSIONS_LIVE).set(live as f64);
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        crate::infra::telemetry::render_metrics(),
    )
        .into_response()
}
