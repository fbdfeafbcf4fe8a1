//! `[limits]`: bounds on every resource a client or agent can make the gateway hold.

use serde::{Deserialize, Serialize};

/// Bounds on every resource a client or agent can make the gateway hold.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest WebSocket message accepted from a client, in bytes.
    pub max_frame_bytes: usize,
    /// Bytes of attachments (images, embedded files, decoded) one prompt may carry in all; more
    /// gets `-32602` naming this setting, and the web UI refuses the file when it is added. Its
    /// base64 must fit a frame (`max_frame_bytes`).
    pub attachment_bytes: usize,
    /// Largest line accepted from an agent's stdout, in bytes.
    pub max_line_bytes: usize,
    /// Most concurrent WebSocket connections.
    pub max_connections: usize,
    /// Most connections that have not finished an upgrade (plain HTTP requests, handshakes).
    pub max_pending_connections: usize,
    /// Most connections from one client address, WebSockets included.
    pub max_connections_per_ip: usize,
    /// Reverse proxies in front of the gateway: their connections are not capped per address.
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// How long a client may take to send a request's headers.
    pub header_read_timeout_secs: u64,
    /// Most concurrent WebSocket connections of one user (more: `429` before the upgrade).
    pub max_connections_per_user: usize,
    /// Sessions of one user on live agent processes at once (more: `-32029`; close one, or let
    /// idle processes be reaped).
    pub max_live_sessions_per_user: usize,
    /// Agent processes of one user running at once, across agents (more: `-32029`; agents shared
    /// between users are not counted).
    pub max_agent_processes_per_user: usize,
    /// Transcript bytes one user may have stored; past it their prompts and new sessions get
    /// `-32029` until they delete sessions (0: no cap). A prompt under way is stored whole.
    pub max_stored_bytes_per_user: u64,
    /// Requests one user may make per second, across their connections (more: `-32029`).
    pub requests_per_second_per_user: u32,
    /// How many requests a user may make at once above that rate.
    pub request_burst_per_user: u32,
    /// Frames queued for one client. A session's live updates that find it full are not
    /// queued: the client is fed them from the store at its own pace, then live again (nothing
    /// lost, nothing twice). Answers and agent requests are queued whatever the room (up to four
    /// times `client_queue_bytes`; past that the client is closed with `1013`).
    pub client_queue: usize,
    /// Bytes queued for one client, likewise.
    pub client_queue_bytes: usize,
    /// A client that takes nothing the gateway writes for this long is closed with `1013` (it
    /// resumes with `session/load` + `afterSeq`) and everything held for it is released.
    pub slow_client_timeout_secs: u64,
    /// WebSocket ping interval; a connection silent for two intervals is closed.
    pub ping_interval_secs: u64,
    /// How often sessions nobody uses leave memory (a replica then stops following the ones
    /// another replica serves) and idle per-user rate buckets are dropped.
    pub sweep_interval_secs: u64,
    /// Requests one connection may have being handled at once.
    pub max_inflight_per_connection: usize,
    /// Streamable HTTP: session streams one connection may have (open, or holding frames for a
    /// reader to come; more: `429`).
    pub max_streams_per_connection: usize,
    /// Streamable HTTP: SSE streams one user may have open at once, across connections (more:
    /// `429`).
    pub max_streams_per_user: usize,
    /// Bytes queued for one agent process's input (as well as 1,024 lines); a forwarded request
    /// that finds it full gets `-32603` at once.
    pub agent_queue_bytes: usize,
    /// Bytes of updates queued for the transcript writer, across sessions; streaming waits for
    /// room (updates are stored before anyone sees them).
    pub transcript_queue_bytes: usize,
    /// How long an agent's permission request waits for a client to attach.
    pub permission_wait_secs: u64,
    /// After SIGTERM/SIGINT, how long prompts in flight may run on before they are cancelled
    /// (`/readyz` is 503 and new connections are refused meanwhile; idle connections close at
    /// once).
    pub drain_grace_secs: u64,
    /// After the drain grace: how long shutdown waits for cancelled prompts' answers (half of
    /// it), then for connections, agent processes and the transcript writer (all of it).
    pub shutdown_grace_secs: u64,
    /// Replicas on one Postgres: how long a session's lease lasts without renewal (renewed every
    /// third of it). A replica that stops answering but keeps its database connection is taken
    /// over after this; one whose connections end (killed) at once.
    pub lease_ttl_secs: u64,
    /// Requests to `/auth/*` (sign-in, sign-out, the identity provider's legs, device codes),
    /// which need no token, one client address may make a minute (IPv6: one /64), as a burst
    /// that refills evenly; more get `429` with `Retry-After` (0: no limit).
    pub auth_requests_per_minute_per_ip: u32,
}

impl Limits {
    /// Whether `attachment_bytes`, in base64 with room for the rest of the prompt, fits a frame.
    pub(super) fn validate(&self) -> Result<(), super::ConfigError> {
        let framed = self.attachment_bytes.div_ceil(3) * 4 + (64 << 10);
        if framed > self.max_frame_bytes {
            return Err(super::ConfigError::Invalid(format!(
                "limits.attachment_bytes ({}) does not fit a prompt: in base64 with the rest of it that is {framed} bytes, over limits.max_frame_bytes ({})",
                self.attachment_bytes, self.max_frame_bytes
            )));
        }
        Ok(())
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_frame_bytes: 4 << 20,
            attachment_bytes: 2 << 20,
            max_line_bytes: 16 << 20,
            max_connections: 10_000,
            max_pending_connections: 1024,
            max_connections_per_ip: 256,
            trusted_proxies: Vec::new(),
            header_read_timeout_secs: 10,
            max_connections_per_user: 32,
            max_live_sessions_per_user: 64,
            max_agent_processes_per_user: 8,
            max_stored_bytes_per_user: 1 << 30,
            requests_per_second_per_user: 1000,
            request_burst_per_user: 2000,
            client_queue: 4096,
            client_queue_bytes: 16 << 20,
            slow_client_timeout_secs: 60,
            ping_interval_secs: 20,
            sweep_interval_secs: 30,
            max_inflight_per_connection: 256,
            max_streams_per_connection: 64,
            max_streams_per_user: 256,
            agent_queue_bytes: 16 << 20,
            transcript_queue_bytes: 64 << 20,
            permission_wait_secs: 300,
            drain_grace_secs: 10,
            shutdown_grace_secs: 10,
            lease_ttl_secs: 10,
            auth_requests_per_minute_per_ip: 120,
        }
    }
}
