//! The wall clock, in the units the stores and tokens keep.

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the epoch.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
