//! `[retention]`: deleting sessions nobody has touched for a while (off by default).

use serde::{Deserialize, Serialize};

/// Longest retention that may be set, in days.
pub const MAX_DAYS: u32 = 36_500;

/// Retention of stored sessions.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Sessions not updated for this many days are deleted with their transcripts, archived or
    /// not; `0` (the default) keeps every session until its owner deletes it.
    pub days: u32,
    /// Sessions deleted per transaction; batches follow each other with a pause, so traffic
    /// never waits long behind them.
    pub batch_size: u32,
    /// How often stale sessions are looked for, in seconds (and once at start).
    pub interval_secs: u64,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            days: 0,
            batch_size: 100,
            interval_secs: 3600,
        }
    }
}

impl RetentionConfig {
    /// Whether retention deletes anything.
    pub fn enabled(&self) -> bool {
        self.days > 0
    }

    pub(super) fn validate(&self) -> Result<(), super::ConfigError> {
        if self.days > MAX_DAYS {
            return Err(super::ConfigError::Invalid(format!(
                "retention.days: {} is more than {MAX_DAYS} (100 years); 0 keeps sessions until their owners delete them",
                self.days
            )));
        }
        if !(1..=10_000).contains(&self.batch_size) {
            return Err(super::ConfigError::Invalid(format!(
                "retention.batch_size: {} must be between 1 and 10000",
                self.batch_size
            )));
        }
        if self.interval_secs == 0 {
            return Err(super::ConfigError::Invalid(String::from(
                "retention.interval_secs: must be at least 1",
            )));
        }
        Ok(())
    }
}
