//! Every Prometheus series the gateway exports, in one place: names, help text, the label values
//! known at start, histogram buckets, and the handles that paths run per message keep.
//!
//! [`describe_and_zero`] runs at start-up once the recorder is installed (`telemetry`), so every
//! series is on `/metrics` from the first scrape, at zero: a dashboard or alert never has to tell
//! "no data" from "none happened". Label sets known at start are registered too: reasons, caps
//! and methods from the fixed lists below, agents from the configuration.
//!
//! Paths that run per update or per message never build a key: the unlabelled-by-agent counters
//! live in tables resolved once ([`describe_and_zero`]); agent-labelled handles are resolved once
//! per agent process ([`AgentTimings`]) or per session in memory ([`FirstUpdate`]).
//!
//! A leaf: it imports nothing of the crate.

use crate::protocol::method::{ClientMethod, agent, ext, labels_then};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use metrics::{Counter, Histogram};

mod describe;
use describe::describe;

// ---- Names ----

/// Open WebSocket connections (gauge).
pub const CONNECTIONS: &str = "acp_gateway_connections";
/// WebSocket connections accepted (counter).
pub const CONNECTIONS_OPENED: &str = "acp_gateway_connections_opened_total";
/// Connections refused, by `reason` (counter).
pub const CONNECTIONS_REFUSED: &str = "acp_gateway_connections_refused_total";
/// Authentication failures, by `reason` (counter).
pub const AUTH_FAILURES: &str = "acp_gateway_auth_failures_total";
/// Per-user cap hits, by `cap` (counter).
pub const CAP_HITS: &str = "acp_gateway_cap_hits_total";
/// Clients closed because they did not read (counter).
pub const SLOW_CLIENTS_DROPPED: &str = "acp_gateway_slow_clients_dropped_total";
/// Counter: times a client fell behind a session's live updates and was fed from the store.
pub const CLIENT_CATCH_UPS: &str = "acp_gateway_client_catch_ups_total";
/// Sessions on a live agent process (gauge, set at scrape).
pub const SESSIONS_LIVE: &str = "acp_gateway_sessions_live";
/// Sessions in the gateway's memory (gauge, set at scrape).
pub const SESSIONS_IN_MEMORY: &str = "acp_gateway_sessions_in_memory";
/// Sessions created, by `agent` (counter).
pub const SESSIONS_CREATED: &str = "acp_gateway_sessions_created_total";
/// Sessions restored onto an agent process, by `agent`, `method`, `outcome` (counter).
pub const SESSION_RESTORES: &str = "acp_gateway_session_restores_total";
/// Agent processes, by `agent` and `state` (gauge, set at scrape).
pub const AGENT_PROCESSES: &str = "acp_gateway_agent_processes";
/// Agent processes started, by `agent` (counter).
pub const AGENT_SPAWNS: &str = "acp_gateway_agent_spawns_total";
/// Agent processes that could not be started or initialized, by `agent` (counter).
pub const AGENT_SPAWN_FAILURES: &str = "acp_gateway_agent_spawn_failures_total";
/// Sign-ins to agents, by `agent`, `method_type` and `outcome` (counter).
pub const AGENT_SIGNINS: &str = "acp_gateway_agent_signins_total";
/// Web pushes to users' devices, by `outcome` (counter).
pub const PUSHES: &str = "acp_gateway_pushes_total";
/// `outcome` of [`PUSHES`]: accepted by the push service; refused by it; the subscription is gone
/// (404/410, dropped); not delivered (network, timeout).
pub const PUSH_OUTCOMES: &[&str] = &["sent", "refused", "gone", "failed"];
/// Sessions retention deleted (counter).
pub const RETENTION_SESSIONS: &str = "acp_gateway_retention_deleted_sessions_total";
/// Bytes of stored transcript retention deleted (counter).
pub const RETENTION_BYTES: &str = "acp_gateway_retention_deleted_bytes_total";
/// Batches retention ran (counter).
pub const RETENTION_BATCHES: &str = "acp_gateway_retention_batches_total";
/// Audit entries that could not be stored (queue full, or the store failed) (counter).
pub const AUDIT_DROPPED: &str = "acp_gateway_audit_dropped_total";
/// Requests to the OpenID provider, by `what` (discovery, jwks, token, userinfo) and `outcome`
/// (ok, error) (counter).
pub const OIDC_FETCHES: &str = "acp_gateway_oidc_provider_requests_total";
/// Agent processes that ended without the gateway asking, by `agent` (counter).
pub const AGENT_CRASHES: &str = "acp_gateway_agent_crashes_total";
/// Messages received, by `peer` and `method` (counter).
pub const MESSAGES_IN: &str = "acp_gateway_messages_in_total";
/// Messages sent, by `peer` and `method` (counter).
pub const MESSAGES_OUT: &str = "acp_gateway_messages_out_total";
/// Updates published by agents (counter).
pub const UPDATES: &str = "acp_gateway_updates_total";
/// Prompts forwarded to agents (counter).
pub const PROMPTS: &str = "acp_gateway_prompts_total";
/// Prompt sent to the agent → its answer, by `agent` (histogram, seconds).
pub const PROMPT_SECONDS: &str = "acp_gateway_prompt_seconds";
/// Prompt sent to the agent → its first update, by `agent` (histogram, seconds).
pub const PROMPT_FIRST_UPDATE_SECONDS: &str = "acp_gateway_prompt_first_update_seconds";
/// The gateway's own requests to agents, by `agent` and `method` (histogram, seconds).
pub const AGENT_REQUEST_SECONDS: &str = "acp_gateway_agent_request_seconds";
/// Updates per transcript commit (histogram).
pub const TRANSCRIPT_BATCH_UPDATES: &str = "acp_gateway_transcript_batch_updates";
/// One transcript commit, retries included (histogram, seconds).
pub const TRANSCRIPT_COMMIT_SECONDS: &str = "acp_gateway_transcript_commit_seconds";
/// Oldest update of a session in a commit received → committed (histogram, seconds).
pub const TRANSCRIPT_COMMIT_LAG_SECONDS: &str = "acp_gateway_transcript_commit_lag_seconds";
/// Updates stored (counter).
pub const TRANSCRIPT_UPDATES_STORED: &str = "acp_gateway_transcript_updates_stored_total";
/// Failed transcript write attempts (counter).
pub const TRANSCRIPT_WRITE_ERRORS: &str = "acp_gateway_transcript_write_errors_total";
/// Session writes given up on for good (counter).
pub const TRANSCRIPT_WRITES_DROPPED: &str = "acp_gateway_transcript_writes_dropped_total";
/// Updates never stored, so never shown (counter).
pub const TRANSCRIPT_UPDATES_DROPPED: &str = "acp_gateway_transcript_updates_dropped_total";
/// A `session/load` replay of the stored transcript (histogram, seconds).
pub const REPLAY_SECONDS: &str = "acp_gateway_replay_seconds";

// ---- Label values known at start ----

/// `reason` of [`CONNECTIONS_REFUSED`].
pub const REFUSAL_REASONS: &[&str] = &[
    "per_ip",
    "pending",
    "max_connections",
    "per_user",
    "draining",
    "unauthenticated",
    "unknown_agent",
    "auth_rate",
];

/// `reason` of [`AUTH_FAILURES`].
pub const AUTH_FAILURE_REASONS: &[&str] = &[
    "missing",
    "malformed",
    "bad_signature",
    "expired",
    "not_yet_valid",
    "wrong_audience",
    "wrong_issuer",
    "missing_claim",
    "invalid",
    "cross_origin",
    "bad_login_code",
    "unknown_key",
    "wrong_algorithm",
    "not_allowed",
    "provider_unavailable",
    "signed_out",
    "another_account",
    "store_unavailable",
];

/// `cap` of [`CAP_HITS`].
pub const CAPS: &[&str] = &[
    "connections",
    "agent_processes",
    "live_sessions",
    "requests_per_second",
    "stored_bytes",
    "requests_in_flight",
];

/// `state` of [`AGENT_PROCESSES`]: started and not yet initialized; carrying no session and
/// waiting for no answer; carrying a session or waiting for an answer.
pub const PROCESS_STATES: &[&str] = &["starting", "idle", "busy"];

/// `method` of [`SESSION_RESTORES`].
pub const RESTORE_METHODS: &[&str] = &["session/resume", "session/load"];

/// `outcome` of [`SESSION_RESTORES`].
pub const OUTCOMES: &[&str] = &["ok", "error"];

/// `method_type` of [`AGENT_SIGNINS`].
pub const SIGNIN_METHOD_TYPES: &[&str] = &["terminal", "env_var", "agent"];

/// `outcome` of [`AGENT_SIGNINS`]: the program exited 0; exited otherwise; the user cancelled
/// or closed the socket; the time limit; the output limit; the gateway shut down; it could not
/// start.
pub const SIGNIN_OUTCOMES: &[&str] = &[
    "ok",
    "failed",
    "cancelled",
    "timeout",
    "output_limit",
    "shutdown",
    "error",
];

/// What a client sends the gateway (`peer="client"` of [`MESSAGES_IN`]): every method it may send
/// ([`ClientMethod::ALL`](crate::protocol::method::ClientMethod::ALL)), then `other`.
pub const FROM_CLIENT: &[&str] = &labels_then(OTHER);

/// What an agent sends the gateway besides answers, which the gateway passes on to clients.
/// `session/update` first: it is the hot one.
const PASSED_ON: [&str; 11] = [
    agent::SESSION_UPDATE,
    agent::REQUEST_PERMISSION,
    agent::ELICITATION,
    "fs/read_text_file",
    "fs/write_text_file",
    "terminal/create",
    "terminal/output",
    "terminal/release",
    "terminal/wait_for_exit",
    "terminal/kill",
    "$/cancel_request",
];

/// What an agent sends the gateway besides answers (`peer="agent"` of [`MESSAGES_IN`]), then
/// `other`.
pub const FROM_AGENT: &[&str] = &then_other::<12>(&[&PASSED_ON]);

/// What the gateway sends clients besides answers (`peer="client"` of [`MESSAGES_OUT`]): what it
/// passes on from agents, then its own notifications ([`ext::TO_CLIENT`]), then `other`.
pub const TO_CLIENT: &[&str] = &then_other::<15>(&[&PASSED_ON, &ext::TO_CLIENT]);

/// What the gateway sends agents besides answers (`peer="agent"` of [`MESSAGES_OUT`]), by the
/// names clients send them under.
pub const TO_AGENT: &[&str] = &then_other::<14>(&[&[
    ClientMethod::Initialize.name(),
    ClientMethod::Authenticate.name(),
    ClientMethod::AuthStatus.name(),
    ClientMethod::SessionNew.name(),
    ClientMethod::SessionLoad.name(),
    ClientMethod::SessionResume.name(),
    ClientMethod::SessionClose.name(),
    ClientMethod::SessionPrompt.name(),
    ClientMethod::SetMode.name(),
    ClientMethod::SetConfigOption.name(),
    ClientMethod::SetModel.name(),
    ClientMethod::SessionCancel.name(),
    ClientMethod::CancelRequest.name(),
]]);

/// `lists` one after another, then `other`: `N` must be their length plus one (checked when
/// compiled).
const fn then_other<const N: usize>(lists: &[&[&'static str]]) -> [&'static str; N] {
    let mut out = [OTHER; N];
    let (mut n, mut l) = (0, 0);
    while l < lists.len() {
        let mut i = 0;
        while i < lists[l].len() {
            out[n] = lists[l][i];
            n += 1;
            i += 1;
        }
        l += 1;
    }
    assert!(n + 1 == N, "a method list's length is its names and other");
    out
}

/// `method` of [`AGENT_REQUEST_SECONDS`]: the requests the gateway itself waits on.
pub const AGENT_REQUESTS: &[&str] = &[
    "initialize",
    "authenticate",
    "auth/status",
    "session/new",
    "session/load",
    "session/resume",
    "session/close",
    OTHER,
];

/// The method label of anything not in a list.
pub const OTHER: &str = "other";

/// The entry of `list` equal to `method`, else the last (`other`); as an index.
fn index_of(list: &[&str], method: &str) -> usize {
    list.iter().position(|m| *m == method).unwrap_or(list.len() - 1)
}

// ---- Buckets ----

/// Prompts and agent requests: milliseconds to the 10-minute prompts of coding agents.
const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];
/// Database commits and commit lag: sub-millisecond (SQLite WAL) to the writer's retries.
const COMMIT_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Updates per commit, up to the writer's batch cap (2,048 items).
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2048.0];
/// Replays: an empty transcript to a very long one at the client's pace.
const REPLAY_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Every histogram and its buckets (without buckets the exporter would make it a summary).
pub const BUCKETS: &[(&str, &[f64])] = &[
    (PROMPT_SECONDS, LATENCY_BUCKETS),
    (PROMPT_FIRST_UPDATE_SECONDS, LATENCY_BUCKETS),
    (AGENT_REQUEST_SECONDS, LATENCY_BUCKETS),
    (TRANSCRIPT_BATCH_UPDATES, BATCH_BUCKETS),
    (TRANSCRIPT_COMMIT_SECONDS, COMMIT_BUCKETS),
    (TRANSCRIPT_COMMIT_LAG_SECONDS, COMMIT_BUCKETS),
    (REPLAY_SECONDS, REPLAY_BUCKETS),
];

// ---- Start-up ----

/// Counters resolved once, indexed like their method lists.
struct Tables {
    from_client: Vec<Counter>,
    from_agent: Vec<Counter>,
    to_agent: Vec<Counter>,
    to_client: Vec<Counter>,
}

/// Filled by the first [`describe_and_zero`], after the recorder is installed. Before that (unit
/// tests, which install none) the helpers look handles up each time, which is then a no-op.
static TABLES: OnceLock<Tables> = OnceLock::new();

fn resolve(name: &'static str, peer: &'static str, list: &[&'static str]) -> Vec<Counter> {
    list.iter()
        .map(|m| metrics::counter!(name, "peer" => peer, "method" => *m))
        .collect()
}

/// Describes every series and registers it at zero, with every label set known at start (for
/// `agents`, the configured agent names). Idempotent: never resets a value.
pub fn describe_and_zero<'a>(agents: impl IntoIterator<Item = &'a str>) {
    describe();
    TABLES.get_or_init(|| Tables {
        from_client: resolve(MESSAGES_IN, "client", FROM_CLIENT),
        from_agent: resolve(MESSAGES_IN, "agent", FROM_AGENT),
        to_agent: resolve(MESSAGES_OUT, "agent", TO_AGENT),
        to_client: resolve(MESSAGES_OUT, "client", TO_CLIENT),
    });
    for name in [
        CONNECTIONS_OPENED,
        SLOW_CLIENTS_DROPPED,
        CLIENT_CATCH_UPS,
        UPDATES,
        PROMPTS,
        TRANSCRIPT_UPDATES_STORED,
        TRANSCRIPT_WRITE_ERRORS,
        TRANSCRIPT_WRITES_DROPPED,
        TRANSCRIPT_UPDATES_DROPPED,
    ] {
        metrics::counter!(name).increment(0);
    }
    for name in [CONNECTIONS, SESSIONS_LIVE, SESSIONS_IN_MEMORY] {
        metrics::gauge!(name).increment(0.0);
    }
    for name in [
        TRANSCRIPT_BATCH_UPDATES,
        TRANSCRIPT_COMMIT_SECONDS,
        TRANSCRIPT_COMMIT_LAG_SECONDS,
        REPLAY_SECONDS,
    ] {
        let _ = metrics::histogram!(name);
    }
    for reason in REFUSAL_REASONS {
        metrics::counter!(CONNECTIONS_REFUSED, "reason" => *reason).increment(0);
    }
    metrics::counter!(AUDIT_DROPPED).increment(0);
    for name in [RETENTION_SESSIONS, RETENTION_BYTES, RETENTION_BATCHES] {
        metrics::counter!(name).increment(0);
    }
    for outcome in PUSH_OUTCOMES {
        metrics::counter!(PUSHES, "outcome" => *outcome).increment(0);
    }
    for reason in AUTH_FAILURE_REASONS {
        metrics::counter!(AUTH_FAILURES, "reason" => *reason).increment(0);
    }
    for cap in CAPS {
        metrics::counter!(CAP_HITS, "cap" => *cap).increment(0);
    }
    for agent in agents {
        let agent = agent.to_string();
        for name in [SESSIONS_CREATED, AGENT_SPAWNS, AGENT_SPAWN_FAILURES, AGENT_CRASHES] {
            metrics::counter!(name, "agent" => agent.clone()).increment(0);
        }
        for method in RESTORE_METHODS {
            for outcome in OUTCOMES {
                metrics::counter!(SESSION_RESTORES, "agent" => agent.clone(), "method" => *method, "outcome" => *outcome)
                    .increment(0);
            }
        }
        for method_type in SIGNIN_METHOD_TYPES {
            for outcome in SIGNIN_OUTCOMES {
                metrics::counter!(AGENT_SIGNINS, "agent" => agent.clone(), "method_type" => *method_type, "outcome" => *outcome)
                    .increment(0);
            }
        }
        for state in PROCESS_STATES {
            metrics::gauge!(AGENT_PROCESSES, "agent" => agent.clone(), "state" => *state).increment(0.0);
        }
        let _ = metrics::histogram!(PROMPT_SECONDS, "agent" => agent.clone());
        let _ = metrics::histogram!(PROMPT_FIRST_UPDATE_SECONDS, "agent" => agent.clone());
        for method in AGENT_REQUESTS {
            let _ = metrics::histogram!(AGENT_REQUEST_SECONDS, "agent" => agent.clone(), "method" => *method);
        }
    }
}

// ---- Counting ----

/// Who is on the other end of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// A WebSocket client.
    Client,
    /// An agent process.
    Agent,
}

/// Counts a request or notification received from `peer`.
pub fn message_in(peer: Peer, method: &str) {
    messages_in(peer, method, 1);
}

/// Counts `n` requests or notifications from `peer`.
pub fn messages_in(peer: Peer, method: &str, n: u64) {
    let list = match peer {
        Peer::Client => FROM_CLIENT,
        Peer::Agent => FROM_AGENT,
    };
    let i = index_of(list, method);
    match TABLES.get() {
        Some(t) => match peer {
            Peer::Client => t.from_client[i].increment(n),
            Peer::Agent => t.from_agent[i].increment(n),
        },
        None => {
            let peer = if peer == Peer::Client { "client" } else { "agent" };
            metrics::counter!(MESSAGES_IN, "peer" => peer, "method" => list[i]).increment(n);
        }
    }
}

/// Counts `n` requests or notifications sent to `peer`.
pub fn message_out(peer: Peer, method: &str, n: u64) {
    let list = match peer {
        Peer::Client => TO_CLIENT,
        Peer::Agent => TO_AGENT,
    };
    let i = index_of(list, method);
    match TABLES.get() {
        Some(t) => match peer {
            Peer::Client => t.to_client[i].increment(n),
            Peer::Agent => t.to_agent[i].increment(n),
        },
        None => {
            let peer = if peer == Peer::Client { "client" } else { "agent" };
            metrics::counter!(MESSAGES_OUT, "peer" => peer, "method" => list[i]).increment(n);
        }
    }
}

/// Counts a refused connection; `reason` is one of [`REFUSAL_REASONS`].
pub fn connection_refused(reason: &'static str) {
    metrics::counter!(CONNECTIONS_REFUSED, "reason" => reason).increment(1);
}

/// Counts a refused token or login code; `reason` is one of [`AUTH_FAILURE_REASONS`].
pub fn auth_failure(reason: &'static str) {
    metrics::counter!(AUTH_FAILURES, "reason" => reason).increment(1);
}

/// Counts a refusal at a per-user cap; `cap` is one of [`CAPS`].
pub fn cap_hit(cap: &'static str) {
    metrics::counter!(CAP_HITS, "cap" => cap).increment(1);
}

/// Counts one sign-in of `agent` by its outcome (one of [`SIGNIN_OUTCOMES`]).
pub fn signin(agent: &str, method_type: &'static str, outcome: &'static str) {
    metrics::counter!(AGENT_SIGNINS, "agent" => agent.to_string(), "method_type" => method_type, "outcome" => outcome)
        .increment(1);
}

/// Counts one request to the OpenID provider.
pub fn oidc_fetch(what: &'static str, outcome: &'static str) {
    metrics::counter!(OIDC_FETCHES, "what" => what, "outcome" => outcome).increment(1);
}

/// Seconds since `start`, for histograms.
pub fn seconds_since(start: Instant) -> f64 {
    start.elapsed().as_secs_f64()
}

/// One agent's latency histograms, resolved once per agent process.
#[derive(Debug, Clone)]
pub struct AgentTimings {
    /// [`PROMPT_SECONDS`].
    prompt: Histogram,
    /// [`AGENT_REQUEST_SECONDS`], indexed like [`AGENT_REQUESTS`].
    requests: Vec<Histogram>,
}

impl AgentTimings {
    /// The handles of `agent`.
    pub fn new(agent: &str) -> Self {
        let agent = agent.to_string();
        Self {
            prompt: metrics::histogram!(PROMPT_SECONDS, "agent" => agent.clone()),
            requests: AGENT_REQUESTS
                .iter()
                .map(|m| metrics::histogram!(AGENT_REQUEST_SECONDS, "agent" => agent.clone(), "method" => *m))
                .collect(),
        }
    }

    /// A forwarded prompt was answered, `sent` when it went to the agent.
    pub fn prompt_answered(&self, sent: Instant) {
        self.prompt.record(seconds_since(sent));
    }

    /// The gateway's own `method` request was answered, `sent` when it went.
    pub fn request_answered(&self, method: &str, sent: Instant) {
        self.requests[index_of(AGENT_REQUESTS, method)].record(seconds_since(sent));
    }
}

/// Microseconds since the first call in this process, plus one (0 means "no mark").
fn mark_now() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_micros() as u64 + 1
}

/// A session's time to first update: marked when a prompt goes to the agent, recorded at the
/// next update the agent publishes for the session. One atomic load per update when no prompt
/// waits for its first update.
#[derive(Debug)]
pub struct FirstUpdate {
    /// [`mark_now`] of the prompt waiting for its first update; 0 when none waits.
    sent: AtomicU64,
    /// [`PROMPT_FIRST_UPDATE_SECONDS`] of the session's agent.
    histogram: Histogram,
}

impl FirstUpdate {
    /// For a session of `agent`.
    pub fn new(agent: &str) -> Self {
        Self {
            sent: AtomicU64::new(0),
            histogram: metrics::histogram!(PROMPT_FIRST_UPDATE_SECONDS, "agent" => agent.to_string()),
        }
    }

    /// A prompt went to the agent.
    pub fn prompt_sent(&self) {
        self.sent.store(mark_now(), Ordering::Relaxed);
    }

    /// The agent published an update for the session.
    pub fn update(&self) {
        if self.sent.load(Ordering::Relaxed) == 0 {
            return;
        }
        let sent = self.sent.swap(0, Ordering::Relaxed);
        if sent != 0 {
            self.histogram.record(mark_now().saturating_sub(sent) as f64 / 1e6);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_methods_are_other() {
        assert_eq!(FROM_CLIENT[index_of(FROM_CLIENT, "session/prompt")], "session/prompt");
        assert_eq!(FROM_CLIENT[index_of(FROM_CLIENT, "_vendor/x")], OTHER);
        assert_eq!(FROM_AGENT[index_of(FROM_AGENT, "session/update")], "session/update");
        assert_eq!(TO_AGENT[index_of(TO_AGENT, "nope")], OTHER);
        for list in [FROM_CLIENT, FROM_AGENT, TO_CLIENT, TO_AGENT, AGENT_REQUESTS] {
            assert_eq!(list.last(), Some(&OTHER), "every method list ends in other");
            assert_eq!(list.iter().filter(|m| **m == OTHER).count(), 1, "{list:?}");
        }
        // The gateway's own notifications are counted by name, as what it passes on is.
        for m in ext::TO_CLIENT
            .into_iter()
            .chain(["session/update", "session/request_permission"])
        {
            assert_eq!(TO_CLIENT[index_of(TO_CLIENT, m)], m);
        }
        assert_eq!(TO_AGENT[index_of(TO_AGENT, "session/prompt")], "session/prompt");
    }

    #[test]
    fn every_histogram_has_ascending_buckets() {
        for (name, buckets) in BUCKETS {
            assert!(!buckets.is_empty(), "{name}");
            assert!(buckets.windows(2).all(|w| w[0] < w[1]), "{name}");
        }
    }
}
