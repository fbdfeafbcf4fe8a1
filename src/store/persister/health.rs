//! How the transcript writer is doing, for `/readyz`.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use super::STALLED_AFTER;
use crate::store::{StoreError, now_micros};

/// How the writer is doing (for `/readyz`), updated by the writer at every attempt.
#[derive(Debug, Default)]
pub(super) struct Health {
    /// When the current run of failed attempts began (epoch µs); 0 while writes succeed.
    pub(super) failing_since: AtomicI64,
    /// When the attempt under way began (epoch µs); 0 when none is.
    pub(super) writing_since: AtomicI64,
    /// The last failed attempt's error.
    pub(super) last_error: Mutex<String>,
    /// Session writes given up on for good since start.
    pub(super) dropped: AtomicU64,
}

impl Health {
    pub(super) fn succeeded(&self) {
        self.failing_since.store(0, Ordering::Release);
    }

    pub(super) fn failed(&self, e: &StoreError) {
        *self.last_error.lock() = e.to_string();
        let _ = self
            .failing_since
            .compare_exchange(0, now_micros(), Ordering::AcqRel, Ordering::Acquire);
    }

    /// `Ok` while writes succeed; otherwise what is wrong: writes have failed since some time
    /// (with the last error), or one has waited on the database too long.
    pub(super) fn report(&self) -> Result<(), WriterTrouble> {
        let now = now_micros();
        let failing_since = self.failing_since.load(Ordering::Acquire);
        if failing_since != 0 {
            let error = self.last_error.lock().clone();
            let secs = (now - failing_since).max(0) as f64 / 1e6;
            return Err(WriterTrouble::Failing { secs, error });
        }
        let writing_since = self.writing_since.load(Ordering::Acquire);
        if writing_since != 0 && now - writing_since > STALLED_AFTER.as_micros() as i64 {
            let secs = (now - writing_since) as f64 / 1e6;
            return Err(WriterTrouble::Waiting { secs });
        }
        Ok(())
    }
}

/// What is wrong with the transcript writer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WriterTrouble {
    /// Its writes have failed for a while.
    #[error("transcript writes failing for {secs:.1} s: {error}")]
    Failing {
        /// Since the first failure of this run.
        secs: f64,
        /// The last failure.
        error: String,
    },
    /// One write has waited on the database too long.
    #[error("a transcript write has waited {secs:.1} s for the database")]
    Waiting {
        /// How long.
        secs: f64,
    },
}
