//! What every layer stands on: configuration, the clock, logs and metrics, traces, private files,
//! and the byte-bounded queues.

pub mod auditing;
pub(crate) mod budget;
pub mod cap;
pub mod clock;
pub mod config;
pub(crate) mod files;
pub mod metrics;
pub(crate) mod outbox;
pub mod sealing;
pub mod telemetry;
pub mod traces;
