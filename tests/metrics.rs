//! `/metrics`: every series is exported before the first connection (described, at zero, with
//! the label sets known at start), and driving a real gateway moves the series that say so: a
//! prompt with a permission request on the demo agent, refused connections, bad and missing
//! tokens, a `session/load` replay, an agent crash and the restore that follows, an agent that
//! cannot start.
//!
//! The recorder is the test process's own (one per process), so this binary has one test and
//! one gateway; the checks are on differences between scrapes all the same.

// Tests and benchmarks spawn freely: their runtime ends with them.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::Duration;

use common::{Client, Db, TestGateway, WAIT, agent};
use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// Every series and its Prometheus type.
const SERIES: &[(&str, &str)] = &[
    ("acp_gateway_connections", "gauge"),
    ("acp_gateway_connections_opened_total", "counter"),
    ("acp_gateway_connections_refused_total", "counter"),
    ("acp_gateway_auth_failures_total", "counter"),
    ("acp_gateway_cap_hits_total", "counter"),
    ("acp_gateway_slow_clients_dropped_total", "counter"),
    ("acp_gateway_client_catch_ups_total", "counter"),
    ("acp_gateway_sessions_live", "gauge"),
    ("acp_gateway_sessions_in_memory", "gauge"),
    ("acp_gateway_sessions_created_total", "counter"),
    ("acp_gateway_session_restores_total", "counter"),
    ("acp_gateway_agent_processes", "gauge"),
    ("acp_gateway_agent_spawns_total", "counter"),
    ("acp_gateway_agent_spawn_failures_total", "counter"),
    ("acp_gateway_agent_crashes_total", "counter"),
    ("acp_gateway_messages_in_total", "counter"),
    ("acp_gateway_messages_out_total", "counter"),
    ("acp_gateway_updates_total", "counter"),
    ("acp_gateway_prompts_total", "counter"),
    ("acp_gateway_prompt_seconds", "histogram"),
    ("acp_gateway_prompt_first_update_seconds", "histogram"),
    ("acp_gateway_agent_request_seconds", "histogram"),
    ("acp_gateway_transcript_batch_updates", "histogram"),
    ("acp_gateway_transcript_commit_seconds", "histogram"),
    ("acp_gateway_transcript_commit_lag_seconds", "histogram"),
    ("acp_gateway_transcript_updates_stored_total", "counter"),
    ("acp_gateway_transcript_write_errors_total", "counter"),
    ("acp_gateway_transcript_writes_dropped_total", "counter"),
    ("acp_gateway_transcript_updates_dropped_total", "counter"),
    ("acp_gateway_replay_seconds", "histogram"),
];

/// One scrape of `/metrics`.
struct Scrape(String);

impl Scrape {
    async fn of(gw: &TestGateway) -> Self {
        let r = reqwest::get(gw.http_url("/metrics")).await.expect("/metrics answers");
        assert!(r.status().is_success(), "/metrics: {}", r.status());
        Self(r.text().await.expect("a body"))
    }

    /// The value of the series `name` whose labels are exactly `labels` (in any order).
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples(name).find_map(|(l, v)| {
            let exact = l.len() == labels.len()
                && labels
                    .iter()
                    .all(|(k, want)| l.iter().any(|(lk, lv)| lk == k && lv == want));
            exact.then_some(v)
        })
    }

    /// The sum of every series `name` carrying at least `labels`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples(name)
            .filter(|(l, _)| {
                labels
                    .iter()
                    .all(|(k, want)| l.iter().any(|(lk, lv)| lk == k && lv == want))
            })
            .map(|(_, v)| v)
            .sum()
    }

    /// `(labels, value)` of every sample of `name`.
    fn samples<'a>(&'a self, name: &'a str) -> impl Iterator<Item = (Vec<(String, String)>, f64)> + 'a {
        self.0.lines().filter(|l| !l.starts_with('#')).filter_map(move |line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (series_name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.strip_suffix('}')?),
                None => (series, ""),
            };
            if series_name != name {
                return None;
            }
            let labels = labels
                .split("\",")
                .filter(|kv| !kv.is_empty())
                .filter_map(|kv| {
                    let (k, v) = kv.split_once('=')?;
                    Some((k.to_string(), v.trim_matches('"').to_string()))
                })
                .collect();
            Some((labels, value.parse().ok()?))
        })
    }

    fn has(&self, line_start: &str) -> bool {
        self.0.lines().any(|l| l.starts_with(line_start))
    }
}

/// How much the series `name` with at least `labels` rose between two scrapes.
fn rise(before: &Scrape, after: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    after.sum(name, labels) - before.sum(name, labels)
}

/// Scrapes until `cond` holds of a scrape (for what happens after the event a test can wait on,
/// such as an agent process being reaped); panics after [`WAIT`].
async fn scrape_until(gw: &TestGateway, what: &str, cond: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let s = Scrape::of(gw).await;
        if cond(&s) {
            return s;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_series_is_there_from_the_start_and_moves_with_the_load() {
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.limits.max_connections_per_user = 1;
        c.agents.insert("broken".into(), agent("/nonexistent/acp-agent", &[]));
    })
    .await;

    // Before any connection: every series, described, at zero, with the label sets known at start.
    let before = Scrape::of(&gw).await;
    for (name, kind) in SERIES {
        assert!(
            before.has(&format!("# TYPE {name} {kind}")),
            "{name} is not a {kind}:\n{}",
            before.0
        );
        assert!(before.has(&format!("# HELP {name} ")), "{name} has no help text");
        let total = if *kind == "histogram" {
            format!("{name}_count")
        } else {
            name.to_string()
        };
        assert_eq!(before.sum(&total, &[]), 0.0, "{name} starts at zero");
    }
    let zero = |name: &str, labels: &[(&str, &str)]| {
        assert_eq!(
            before.get(name, labels),
            Some(0.0),
            "{name}{labels:?} at zero from the start"
        );
    };
    for reason in [
        "per_ip",
        "pending",
        "max_connections",
        "per_user",
        "draining",
        "unauthenticated",
        "unknown_agent",
    ] {
        zero("acp_gateway_connections_refused_total", &[("reason", reason)]);
    }
    for reason in ["missing", "malformed", "expired", "wrong_audience", "cross_origin"] {
        zero("acp_gateway_auth_failures_total", &[("reason", reason)]);
    }
    for cap in [
        "connections",
        "agent_processes",
        "live_sessions",
        "requests_per_second",
        "stored_bytes",
        "requests_in_flight",
    ] {
        zero("acp_gateway_cap_hits_total", &[("cap", cap)]);
    }
    for agent in ["default", "broken"] {
        for state in ["starting", "idle", "busy"] {
            zero("acp_gateway_agent_processes", &[("agent", agent), ("state", state)]);
        }
        zero("acp_gateway_agent_spawns_total", &[("agent", agent)]);
        zero("acp_gateway_agent_spawn_failures_total", &[("agent", agent)]);
        zero("acp_gateway_agent_crashes_total", &[("agent", agent)]);
        zero("acp_gateway_sessions_created_total", &[("agent", agent)]);
        zero(
            "acp_gateway_session_restores_total",
            &[("agent", agent), ("method", "session/resume"), ("outcome", "ok")],
        );
        zero("acp_gateway_prompt_seconds_count", &[("agent", agent)]);
        zero("acp_gateway_prompt_first_update_seconds_count", &[("agent", agent)]);
        zero(
            "acp_gateway_agent_request_seconds_count",
            &[("agent", agent), ("method", "initialize")],
        );
    }
    // Every method the gateway serves has its own label, from the one list parsing uses
    // (fork, attach and detach were counted as `other`).
    for method in [
        "initialize",
        "session/prompt",
        "session/load",
        "session/fork",
        "session/attach",
        "session/detach",
        "session/cancel",
        "other",
    ] {
        zero(
            "acp_gateway_messages_in_total",
            &[("peer", "client"), ("method", method)],
        );
    }
    for method in ["session/update", "session/request_permission", "other"] {
        zero(
            "acp_gateway_messages_in_total",
            &[("peer", "agent"), ("method", method)],
        );
        zero(
            "acp_gateway_messages_out_total",
            &[("peer", "client"), ("method", method)],
        );
    }
    zero(
        "acp_gateway_messages_out_total",
        &[("peer", "agent"), ("method", "session/prompt")],
    );
    // The gateway's own notifications to clients, each under its name (they were not counted).
    for method in [
        "_gateway/queue",
        "_gateway/session_stopped",
        "_gateway/authenticate/progress",
    ] {
        zero(
            "acp_gateway_messages_out_total",
            &[("peer", "client"), ("method", method)],
        );
    }
    zero("acp_gateway_transcript_commit_seconds_count", &[]);
    zero("acp_gateway_transcript_batch_updates_count", &[]);
    assert!(
        before.has("acp_gateway_prompt_seconds_bucket{agent=\"default\",le=\"0.005\"}"),
        "histograms have buckets, not quantiles:\n{}",
        before.0
    );

    // A prompt that asks for permission, on the demo agent.
    let mut alice = gw.client("alice").await;
    let s = alice.new_session().await;
    let id = alice
        .start(
            "session/prompt",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": "[permission] hello"}]}),
        )
        .await;
    let req = alice.wait_for(|m| m["method"] == "session/request_permission").await;
    alice
        .send(json!({"jsonrpc": "2.0", "id": req["id"], "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}}))
        .await;
    let done = alice.answer(id).await;
    assert_eq!(done["result"]["stopReason"], "end_turn", "{done}");
    let seen = alice.take_updates(&s).len() as f64;
    assert!(seen > 3.0, "the demo agent streamed");

    let prompted = Scrape::of(&gw).await;
    let rose = |name: &str, labels: &[(&str, &str)]| rise(&before, &prompted, name, labels);
    let d = [("agent", "default")];
    assert_eq!(rose("acp_gateway_connections_opened_total", &[]), 1.0);
    assert_eq!(prompted.get("acp_gateway_connections", &[]), Some(1.0));
    assert_eq!(prompted.get("acp_gateway_sessions_live", &[]), Some(1.0));
    assert_eq!(
        prompted.get(
            "acp_gateway_agent_processes",
            &[("agent", "default"), ("state", "busy")]
        ),
        Some(1.0),
        "alice's process carries her session"
    );
    assert_eq!(rose("acp_gateway_agent_spawns_total", &d), 1.0);
    assert_eq!(rose("acp_gateway_sessions_created_total", &d), 1.0);
    assert_eq!(rose("acp_gateway_prompts_total", &[]), 1.0);
    for method in ["initialize", "session/new", "session/prompt"] {
        assert_eq!(
            rose(
                "acp_gateway_messages_in_total",
                &[("peer", "client"), ("method", method)]
            ),
            1.0,
            "client {method}"
        );
    }
    for method in ["initialize", "session/new", "session/prompt"] {
        assert_eq!(
            rose(
                "acp_gateway_messages_out_total",
                &[("peer", "agent"), ("method", method)]
            ),
            1.0,
            "to the agent: {method}"
        );
    }
    let from_agent = rose(
        "acp_gateway_messages_in_total",
        &[("peer", "agent"), ("method", "session/update")],
    );
    assert!(
        from_agent >= seen - 1.0,
        "agent updates counted: {from_agent} for {seen} seen"
    );
    assert_eq!(
        rose(
            "acp_gateway_messages_in_total",
            &[("peer", "agent"), ("method", "session/request_permission")]
        ),
        1.0
    );
    assert_eq!(
        rose(
            "acp_gateway_messages_out_total",
            &[("peer", "client"), ("method", "session/request_permission")]
        ),
        1.0
    );
    assert_eq!(
        rose(
            "acp_gateway_messages_out_total",
            &[("peer", "client"), ("method", "session/update")]
        ),
        seen,
        "every update alice got"
    );
    assert!(rose("acp_gateway_updates_total", &[]) >= from_agent);
    assert_eq!(rose("acp_gateway_transcript_updates_stored_total", &[]), seen);
    assert_eq!(rose("acp_gateway_prompt_seconds_count", &d), 1.0);
    assert_eq!(rose("acp_gateway_prompt_first_update_seconds_count", &d), 1.0);
    assert!(
        prompted.sum("acp_gateway_prompt_first_update_seconds_sum", &d)
            <= prompted.sum("acp_gateway_prompt_seconds_sum", &d),
        "the first update comes before the answer"
    );
    for method in ["initialize", "session/new"] {
        assert_eq!(
            rose(
                "acp_gateway_agent_request_seconds_count",
                &[("agent", "default"), ("method", method)]
            ),
            1.0,
            "{method} timed"
        );
    }
    let batches = rose("acp_gateway_transcript_batch_updates_count", &[]);
    assert!(batches >= 1.0);
    assert_eq!(
        rose("acp_gateway_transcript_batch_updates_sum", &[]),
        seen,
        "updates per commit add up"
    );
    assert!(rose("acp_gateway_transcript_commit_seconds_count", &[]) >= batches);
    assert!(rose("acp_gateway_transcript_commit_lag_seconds_count", &[]) >= batches);

    // Refused before the upgrade: alice is at her one connection; bad and missing tokens.
    let err = Client::connect(&gw.ws_url(), &gw.token("alice"))
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("429"), "{err}");
    let err = Client::connect(&gw.ws_url(), "not-a-jwt").await.err().expect("refused");
    assert!(err.to_string().contains("401"), "{err}");
    let no_token = gw.ws_url().into_client_request().expect("request");
    let err = Client::connect_request(no_token).await.err().expect("refused");
    assert!(err.to_string().contains("401"), "{err}");
    let refused = Scrape::of(&gw).await;
    let rose = |name: &str, labels: &[(&str, &str)]| rise(&prompted, &refused, name, labels);
    assert_eq!(
        rose("acp_gateway_connections_refused_total", &[("reason", "per_user")]),
        1.0
    );
    assert_eq!(rose("acp_gateway_cap_hits_total", &[("cap", "connections")]), 1.0);
    assert_eq!(
        rose(
            "acp_gateway_connections_refused_total",
            &[("reason", "unauthenticated")]
        ),
        2.0
    );
    assert_eq!(rose("acp_gateway_auth_failures_total", &[("reason", "malformed")]), 1.0);
    assert_eq!(rose("acp_gateway_auth_failures_total", &[("reason", "missing")]), 1.0);
    assert_eq!(rose("acp_gateway_connections_opened_total", &[]), 0.0);

    // A session/load replays the stored transcript.
    let root = alice.root.clone();
    let r = alice
        .request("session/load", json!({"sessionId": s, "cwd": root, "mcpServers": []}))
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let replayed = alice.take_updates(&s).len() as f64;
    assert!(replayed >= seen, "the whole transcript, the prompt included");
    let loaded = Scrape::of(&gw).await;
    let rose = |name: &str, labels: &[(&str, &str)]| rise(&refused, &loaded, name, labels);
    assert_eq!(rose("acp_gateway_replay_seconds_count", &[]), 1.0);
    assert_eq!(
        rose(
            "acp_gateway_messages_in_total",
            &[("peer", "client"), ("method", "session/load")]
        ),
        1.0
    );
    assert_eq!(
        rose(
            "acp_gateway_messages_out_total",
            &[("peer", "client"), ("method", "session/update")]
        ),
        replayed
    );

    // The agent crashes mid-prompt; the next prompt restores the session on a fresh process.
    let r = alice.prompt(&s, "[crash]").await;
    assert_eq!(r["error"]["code"], -32603, "{r}");
    let crashed = scrape_until(&gw, "the crash to be counted", |m| {
        rise(&loaded, m, "acp_gateway_agent_crashes_total", &d) == 1.0
    })
    .await;
    let r = alice.prompt(&s, "hello again").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let restored = Scrape::of(&gw).await;
    let rose = |name: &str, labels: &[(&str, &str)]| rise(&crashed, &restored, name, labels);
    assert_eq!(
        rose(
            "acp_gateway_session_restores_total",
            &[("agent", "default"), ("method", "session/resume"), ("outcome", "ok")]
        ),
        1.0
    );
    assert_eq!(rose("acp_gateway_agent_spawns_total", &d), 1.0, "a fresh process");
    assert_eq!(
        rose(
            "acp_gateway_agent_request_seconds_count",
            &[("agent", "default"), ("method", "session/resume")]
        ),
        1.0
    );
    assert_eq!(
        rise(&before, &restored, "acp_gateway_agent_crashes_total", &d),
        1.0,
        "one crash"
    );

    // An agent that cannot start: initialize fails, and says so in the metrics.
    let mut bob = Client::connect(&format!("{}?agent=broken", gw.ws_url()), &gw.token("bob"))
        .await
        .expect("connects");
    let r = bob
        .request("initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}))
        .await;
    assert!(r.get("error").is_some(), "{r}");
    let failed = Scrape::of(&gw).await;
    assert!(
        rise(
            &restored,
            &failed,
            "acp_gateway_agent_spawn_failures_total",
            &[("agent", "broken")]
        ) >= 1.0,
        "{}",
        failed.0
    );
    assert_eq!(rise(&before, &failed, "acp_gateway_agent_spawns_total", &d), 2.0);

    // A message queued while no turn runs is sent at once; every change of the queue reaches
    // alice as a `_gateway/queue` notification, counted under its own name.
    let r = alice
        .request(
            "_gateway/queue/add",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": "queued"}]}),
        )
        .await;
    assert!(r.get("result").is_some(), "{r}");
    alice
        .wait_for(|m| m["method"] == "_gateway/queue" && m["params"]["running"] == false)
        .await;
    scrape_until(&gw, "the queue's notices to be counted", |m| {
        rise(
            &failed,
            m,
            "acp_gateway_messages_out_total",
            &[("peer", "client"), ("method", "_gateway/queue")],
        ) >= 1.0
    })
    .await;
    bob.close().await;
    alice.close().await;
    gw.stop().await;
}
