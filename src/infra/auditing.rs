//! The audit log as a feature that records into it sees it: what happened ([`Event`]) and who
//! records it ([`Recorder`]). The audit log itself (the `audit` feature: a structured log line now, a
//! row in the store soon, anonymous noise aggregated) implements it; start-up hands it in.

/// Records what happened. Never waits.
pub trait Recorder: Send + Sync + std::fmt::Debug {
    /// Records `e`.
    fn record(&self, e: Event<'_>);
}

/// What happened.
#[derive(Debug, Default)]
pub struct Event<'a> {
    /// Who acted (`""` when nobody was signed in).
    pub actor: &'a str,
    /// What they did.
    pub action: &'static str,
    /// What it was done to.
    pub target: Option<&'a str>,
    /// `ok`, `refused` or `failed`.
    pub outcome: &'static str,
    /// More (never a secret).
    pub detail: Option<serde_json::Value>,
    /// The WebSocket connection.
    pub connection: Option<&'a str>,
    /// The client's address.
    pub client: Option<String>,
}
