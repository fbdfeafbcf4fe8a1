//! The writes nobody waits on (message counts, titles, and the session rows left behind their
//! stored chunks): what is held back and when it is due. A state machine over instants given to
//! it, so its timing is tested in milliseconds without a clock.

use std::time::{Duration, Instant};

use crate::store::SessionWrite;

/// Those writes wait at most this long while updates keep coming.
pub(super) const PUT_OFF_AT_MOST: Duration = Duration::from_millis(500);
/// Metadata writes held back while updates keep coming, at most.
const MAX_PENDING_METADATA: usize = 1024;

/// The metadata held back, and since when.
#[derive(Default)]
pub(super) struct PutOff {
    metadata: Vec<SessionWrite>,
    since: Option<Instant>,
}

/// What else is happening when a batch is done.
#[derive(Clone, Copy, Default)]
pub(super) struct After {
    /// Someone waits for a flush: everything, put off or not, is written before it is answered.
    pub flushing: bool,
    /// The writer is stopping: nothing is left behind.
    pub stopping: bool,
}

impl PutOff {
    /// Holds `writes` back, as of `now` (the oldest held sets the deadline).
    pub fn hold(&mut self, writes: impl IntoIterator<Item = SessionWrite>, now: Instant) {
        let before = self.metadata.len();
        self.metadata.extend(writes);
        if self.metadata.len() > before {
            self.since.get_or_insert(now);
        }
    }

    /// Since when something is put off, if anything is: the held metadata, or the store's
    /// sessions left behind their chunks since `unsettled`. The writer writes them once its
    /// queue has been quiet a moment.
    pub fn pending_since(&self, unsettled: Option<Instant>) -> Option<Instant> {
        self.since.into_iter().chain(unsettled).min()
    }

    /// Whether the put-off writes are due at `now`, after a batch: someone flushes, the writer
    /// stops, the oldest has waited [`PUT_OFF_AT_MOST`], or too much metadata is held.
    pub fn due(&self, now: Instant, unsettled: Option<Instant>, after: After) -> bool {
        let overdue = self
            .pending_since(unsettled)
            .is_some_and(|since| now.saturating_duration_since(since) >= PUT_OFF_AT_MOST);
        after.flushing || after.stopping || overdue || self.metadata.len() >= MAX_PENDING_METADATA
    }

    /// Takes the held metadata to write it; the deadline starts again with the next hold.
    pub fn take(&mut self) -> Vec<SessionWrite> {
        self.since = None;
        std::mem::take(&mut self.metadata)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(session: &str) -> SessionWrite {
        SessionWrite {
            session_id: session.into(),
            ..Default::default()
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn nothing_held_is_never_due_unless_flushed_or_stopping() {
        let (t0, p) = (Instant::now(), PutOff::default());
        assert_eq!(p.pending_since(None), None);
        assert!(!p.due(t0 + ms(10_000), None, After::default()));
        assert!(p.due(
            t0,
            None,
            After {
                flushing: true,
                stopping: false
            }
        ));
        assert!(p.due(
            t0,
            None,
            After {
                flushing: false,
                stopping: true
            }
        ));
        // An empty hold starts no deadline.
        let mut p = PutOff::default();
        p.hold([], t0);
        assert_eq!(p.pending_since(None), None);
    }

    #[test]
    fn held_metadata_is_due_500_ms_after_the_oldest_hold_and_not_a_millisecond_sooner() {
        let (t0, mut p) = (Instant::now(), PutOff::default());
        p.hold([count("a")], t0);
        // Later holds do not push the deadline back.
        p.hold([count("b")], t0 + ms(300));
        assert_eq!(p.pending_since(None), Some(t0));
        assert!(!p.due(t0 + ms(499), None, After::default()));
        assert!(p.due(t0 + ms(500), None, After::default()));
        let taken = p.take();
        assert_eq!(taken.iter().map(|w| &*w.session_id).collect::<Vec<_>>(), ["a", "b"]);
        // Taken: nothing pending, and the next hold starts its own 500 ms.
        assert_eq!(p.pending_since(None), None);
        p.hold([count("c")], t0 + ms(600));
        assert!(!p.due(t0 + ms(1_000), None, After::default()));
        assert!(p.due(t0 + ms(1_100), None, After::default()));
    }

    #[test]
    fn sessions_left_unsettled_count_as_put_off_from_when_they_were() {
        let (t0, mut p) = (Instant::now(), PutOff::default());
        let unsettled = Some(t0 + ms(20));
        assert_eq!(p.pending_since(unsettled), unsettled);
        assert!(!p.due(t0 + ms(519), unsettled, After::default()));
        assert!(p.due(t0 + ms(520), unsettled, After::default()));
        // The older of the two sets the deadline.
        p.hold([count("a")], t0);
        assert_eq!(p.pending_since(unsettled), Some(t0));
        assert!(p.due(t0 + ms(500), unsettled, After::default()));
    }

    #[test]
    fn too_much_metadata_is_due_at_once() {
        let (t0, mut p) = (Instant::now(), PutOff::default());
        p.hold((0..MAX_PENDING_METADATA - 1).map(|_| count("a")), t0);
        assert!(!p.due(t0, None, After::default()));
        p.hold([count("a")], t0);
        assert!(p.due(t0, None, After::default()));
    }
}
