//! What each series means, for `/metrics`' `# HELP` lines.

use metrics::Unit;

use super::*;

/// Describes every series.
pub(super) fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(CONNECTIONS, "Open WebSocket connections on /acp.");
    describe_counter!(CONNECTIONS_OPENED, "WebSocket connections accepted on /acp.");
    describe_counter!(
        CONNECTIONS_REFUSED,
        "Connections refused, by reason: per_ip, pending (at accept), max_connections, per_user, draining, unauthenticated, unknown_agent (before the upgrade)."
    );
    describe_counter!(
        AUTH_FAILURES,
        "Requests whose token (or login code) was refused, by reason."
    );
    describe_counter!(
        CAP_HITS,
        "Refusals at a per-user cap, by cap (connections, agent_processes, live_sessions, requests_per_second, stored_bytes, requests_in_flight)."
    );
    describe_counter!(
        SLOW_CLIENTS_DROPPED,
        "Clients closed with 1013: they read nothing for slow_client_timeout_secs, or their unread answers passed four times their queue (they resume with afterSeq)."
    );
    describe_counter!(
        CLIENT_CATCH_UPS,
        "Times a client fell behind a session's live updates (its queue full) and was fed from the store until it caught up."
    );
    describe_gauge!(SESSIONS_LIVE, "Sessions on a live agent process.");
    describe_gauge!(SESSIONS_IN_MEMORY, "Sessions held in the gateway's memory.");
    describe_counter!(SESSIONS_CREATED, "Sessions created (session/new), by agent.");
    describe_counter!(
        SESSION_RESTORES,
        "Sessions restored onto an agent process (the agent's session/resume or session/load), by agent, method and outcome."
    );
    describe_gauge!(
        AGENT_PROCESSES,
        "Agent processes by agent and state: starting (not yet initialized), idle (no session, no request waiting), busy."
    );
    describe_counter!(AGENT_SPAWNS, "Agent processes started, by agent.");
    describe_counter!(
        AGENT_SPAWN_FAILURES,
        "Agent processes that could not be started or did not initialize, by agent."
    );
    describe_counter!(
        PUSHES,
        "Web pushes to users' devices, by outcome: sent (accepted by the push service), refused, gone (404/410: the subscription was dropped), failed (not delivered)."
    );
    describe_counter!(
        AGENT_SIGNINS,
        "Sign-ins to agents, by agent, method_type (terminal) and outcome: ok, failed (the program exited non-zero), cancelled (by the user or a closed socket), timeout, output_limit, shutdown, error (could not start)."
    );
    describe_counter!(
        RETENTION_SESSIONS,
        "Sessions deleted by retention ([retention] days without an update), with their transcripts."
    );
    describe_counter!(RETENTION_BYTES, "Bytes of stored transcript deleted by retention.");
    describe_counter!(
        RETENTION_BATCHES,
        "Batches of stale sessions retention deleted (each one transaction of at most [retention] batch_size sessions)."
    );
    describe_counter!(
        AUDIT_DROPPED,
        "Audit entries not stored (queue full or store failing); each is still in the log (target audit)."
    );
    describe_counter!(
        OIDC_FETCHES,
        "Requests to the OpenID provider, by what (discovery, jwks, token) and outcome (ok, error): errors while it is down."
    );
    describe_counter!(
        AGENT_CRASHES,
        "Agent processes that ended (or closed stdout) without the gateway stopping them, by agent."
    );
    describe_counter!(
        MESSAGES_IN,
        "JSON-RPC requests and notifications received, by peer (client, agent) and method (a fixed list, else other)."
    );
    describe_counter!(
        MESSAGES_OUT,
        "JSON-RPC requests and notifications sent, by peer (agent: the gateway's and forwarded requests; client: updates and agent requests) and method."
    );
    describe_counter!(UPDATES, "session/update notifications published by agents.");
    describe_counter!(PROMPTS, "Prompts forwarded to agents.");
    describe_histogram!(
        PROMPT_SECONDS,
        Unit::Seconds,
        "A prompt from sending it to the agent to the agent's answer, by agent."
    );
    describe_histogram!(
        PROMPT_FIRST_UPDATE_SECONDS,
        Unit::Seconds,
        "A prompt from sending it to the agent to the agent's first update of that session, by agent."
    );
    describe_histogram!(
        AGENT_REQUEST_SECONDS,
        Unit::Seconds,
        "The gateway's own requests to agents (initialize, session/new, restores, ...) until answered, by agent and method."
    );
    describe_histogram!(
        TRANSCRIPT_BATCH_UPDATES,
        Unit::Count,
        "Updates written per transcript commit."
    );
    describe_histogram!(
        TRANSCRIPT_COMMIT_SECONDS,
        Unit::Seconds,
        "One transcript write (a transaction), retries included."
    );
    describe_histogram!(
        TRANSCRIPT_COMMIT_LAG_SECONDS,
        Unit::Seconds,
        "Per session and commit: from receiving its oldest update in that commit to the commit (what clients wait)."
    );
    describe_counter!(TRANSCRIPT_UPDATES_STORED, "Updates committed to the transcript.");
    describe_counter!(TRANSCRIPT_WRITE_ERRORS, "Failed transcript write attempts (retried).");
    describe_counter!(
        TRANSCRIPT_WRITES_DROPPED,
        "Session transcript writes given up on for good (the session is lost)."
    );
    describe_counter!(
        TRANSCRIPT_UPDATES_DROPPED,
        "Updates never stored, hence never shown to clients."
    );
    describe_histogram!(
        REPLAY_SECONDS,
        Unit::Seconds,
        "A session/load replay of the stored transcript, at the client's pace."
    );
}
