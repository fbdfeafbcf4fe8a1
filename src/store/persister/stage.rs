//! The linger, handed over (only where the writer has a connection of its own: SQLite).
//!
//! While the writer waits for a prompt's answer ([`super::LINGER`]), the items it took wait
//! here instead of in its hands, and whatever is sent meanwhile joins them here instead of the
//! queue, so the writer's thread is not woken for each. The send that completes the batch (the
//! last update of the burst that answers the prompt, sent by the agent's reader) commits it at
//! once, on its own thread, through the writer's connection, and tells the sessions: a round
//! trip no longer hops to the writer's thread and back (measured: ~30 µs there and ~40 µs back
//! on a 2-core machine, more than the commit itself). A batch that is not completed in time,
//! grows past [`MAX_HELD`], carries a flush, or fails to commit is the writer's again, with its
//! retries.
//!
//! Order: a sender puts its item in the queue under the stage's lock, and the writer moves what
//! the queue holds into the stage under the same lock as it starts holding, so nothing sent
//! earlier is left behind in the queue. While a sender commits, the writer waits for it, so no
//! later update of a session can be committed (and release this one) first.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use super::batch::{Batch, Item, awaits_answer, burst_goes_on, coalesce, item_bytes, split};
use super::{Health, SessionWrite, take_waiting};
use crate::budget::ByteBudget;
use crate::store::now_micros;
use crate::store::sqlite_writer::BatchWriter;

/// Most items held for one answer: a longer burst is the writer's to commit.
const MAX_HELD: usize = 512;

/// Where the held batch is.
#[derive(Debug, Default, PartialEq, Eq)]
enum Phase {
    /// Nothing is held: items go to the queue.
    #[default]
    Idle,
    /// The writer holds `items` for an answer; items sent join them.
    Holding,
    /// A sender is committing what was held.
    Committing,
    /// Held items handed back to the writer (a flush, too many, or a failed commit).
    Returned,
}

#[derive(Default)]
struct State {
    phase: Phase,
    items: Vec<Item>,
    /// Message counts and titles of batches committed here: the writer makes them later, with
    /// its own.
    metadata: Vec<SessionWrite>,
}

/// What the writer's linger on the stage came to.
pub(super) enum Lingered {
    /// Nothing was held: the items no longer waited for an answer.
    NotHeld,
    /// The items (and what else the queue held) are back in the writer's hands, to commit.
    Taken,
    /// A sender committed them; here is their metadata, for the writer's put-off writes.
    Done(Vec<SessionWrite>),
}

/// What the writer finds when it looks again.
enum Resume {
    /// Still held, or being committed: wait.
    Wait,
    /// The items are the writer's to commit.
    Take(Vec<Item>),
    /// A sender committed them; here is their metadata.
    Done(Vec<SessionWrite>),
}

impl std::fmt::Debug for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stage")
            .field("phase", &self.state().phase)
            .finish_non_exhaustive()
    }
}

pub(super) struct Stage {
    state: Mutex<State>,
    /// Wakes the writer: what it held was committed or handed back.
    wake: Notify,
    /// The writer's connection, shared with the writer.
    pub(super) direct: Arc<Mutex<Box<dyn BatchWriter>>>,
    room: ByteBudget,
    health: Arc<Health>,
}

impl Stage {
    pub(super) fn new(direct: Arc<Mutex<Box<dyn BatchWriter>>>, room: ByteBudget, health: Arc<Health>) -> Self {
        Self {
            state: Mutex::default(),
            wake: Notify::new(),
            direct,
            room,
            health,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A sender's item: held with the batch if one is held (committed here if it completes it),
    /// else into the queue through `slot`.
    pub(super) fn offer(&self, item: Item, slot: mpsc::Permit<'_, Item>) {
        let mut state = self.state();
        if state.phase != Phase::Holding {
            slot.send(item);
            return;
        }
        drop(slot);
        let flush = matches!(item, Item::Flush(_));
        state.items.push(item);
        if flush || state.items.len() >= MAX_HELD {
            state.phase = Phase::Returned;
            drop(state);
            self.wake.notify_one();
            return;
        }
        if awaits_answer(&state.items) || burst_goes_on(&state.items) {
            return;
        }
        state.phase = Phase::Committing;
        let items = std::mem::take(&mut state.items);
        drop(state);
        self.commit(items);
    }

    /// The writer lingers for a prompt's answer (`items` wait for one): holds them here until a
    /// sender commits them, or until [`super::LINGER`] passes or shutdown begins (then they and
    /// what the queue holds are the writer's again).
    pub(super) async fn linger(
        &self,
        rx: &mut mpsc::Receiver<Item>,
        items: &mut Vec<Item>,
        bytes: &mut usize,
        cancel: &CancellationToken,
    ) -> Lingered {
        if !self.hold(rx, items, bytes) {
            return Lingered::NotHeld;
        }
        let until = tokio::time::Instant::now() + super::LINGER;
        let mut expired = false;
        loop {
            // Once the linger is over, only a sender committing is waited for.
            expired = expired
                || tokio::select! {
                    biased;
                    () = self.wake.notified() => false,
                    () = tokio::time::sleep_until(until) => true,
                    () = cancel.cancelled() => true,
                };
            if expired && self.is_committing() {
                self.wake.notified().await;
            }
            match self.resume(expired) {
                Resume::Wait => {}
                Resume::Take(taken) => {
                    *items = taken;
                    *bytes = items.iter().map(item_bytes).sum();
                    take_waiting(rx, items, bytes);
                    return Lingered::Taken;
                }
                Resume::Done(metadata) => return Lingered::Done(metadata),
            }
        }
    }

    /// The writer starts holding `items` (a prompt waiting for its answer), with what the queue
    /// holds by now. `false`: they no longer wait for an answer (it came), nothing is held.
    fn hold(&self, rx: &mut mpsc::Receiver<Item>, items: &mut Vec<Item>, bytes: &mut usize) -> bool {
        let mut state = self.state();
        take_waiting(rx, items, bytes);
        if !awaits_answer(items) || items.len() >= MAX_HELD {
            return false;
        }
        debug_assert_eq!(state.phase, Phase::Idle);
        state.phase = Phase::Holding;
        state.items = std::mem::take(items);
        true
    }

    /// Whether the writer holds a prompt for its answer.
    #[cfg(test)]
    pub(super) fn is_holding(&self) -> bool {
        self.state().phase == Phase::Holding
    }

    /// Whether a sender is committing what was held.
    fn is_committing(&self) -> bool {
        self.state().phase == Phase::Committing
    }

    /// The writer looks again (`expired`: its linger is over, or it is shutting down).
    fn resume(&self, expired: bool) -> Resume {
        let mut state = self.state();
        match state.phase {
            Phase::Holding if !expired => Resume::Wait,
            Phase::Committing => Resume::Wait,
            Phase::Holding | Phase::Returned => {
                state.phase = Phase::Idle;
                Resume::Take(std::mem::take(&mut state.items))
            }
            Phase::Idle => Resume::Done(std::mem::take(&mut state.metadata)),
        }
    }

    /// Commits a completed batch on this thread and tells its sessions; handed back to the
    /// writer if the commit fails (nothing was told).
    fn commit(&self, items: Vec<Item>) {
        let held: Vec<usize> = items.iter().map(item_bytes).collect();
        let copies: Vec<Item> = items.iter().filter_map(Item::copy).collect();
        let Batch {
            writes,
            updates,
            stored_up_to,
            oldest,
            ..
        } = coalesce(items.into_iter());
        let mut chunks = Vec::with_capacity(writes.len());
        let mut metadata = Vec::new();
        for (u, m) in writes.into_iter().map(split) {
            chunks.extend(u);
            metadata.extend(m);
        }
        let started = Instant::now();
        let written = if chunks.is_empty() {
            Ok(())
        } else {
            self.direct
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .write_batch(&chunks)
        };
        if let Err(e) = written {
            tracing::debug!(error = %e, "a held batch's commit failed; the writer takes it with its retries");
            let mut state = self.state();
            state.items = copies;
            state.phase = Phase::Returned;
            drop(state);
            self.wake.notify_one();
            return;
        }
        self.health.succeeded();
        metrics::histogram!(crate::metrics::TRANSCRIPT_COMMIT_SECONDS).record(started.elapsed().as_secs_f64());
        metrics::counter!(crate::metrics::TRANSCRIPT_UPDATES_STORED).increment(updates);
        metrics::histogram!(crate::metrics::TRANSCRIPT_BATCH_UPDATES).record(updates as f64);
        let commit_lag = metrics::histogram!(crate::metrics::TRANSCRIPT_COMMIT_LAG_SECONDS);
        let now = now_micros();
        for ((_, notify, seq), received) in stored_up_to.into_iter().zip(oldest) {
            commit_lag.record((now - received).max(0) as f64 / 1e6);
            notify.committed(seq);
        }
        self.room.give_back(held);
        let mut state = self.state();
        state.metadata.extend(metadata);
        state.phase = Phase::Idle;
        drop(state);
        self.wake.notify_one();
    }
}
