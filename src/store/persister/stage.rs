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
//! When the writer is idle (nothing in its hands, nothing queued since it last looked), the
//! prompt's own send starts the hold, with a timer for the linger: the writer's thread is not
//! woken at all for a round trip (measured: it was woken twice per round trip, once as the
//! prompt went to the agent and once after the answer's commit, competing for the two cores
//! with the agent and the gateway).
//!
//! Order: a sender puts its item in the queue under the stage's lock, and the writer moves what
//! the queue holds into the stage under the same lock as it starts holding, so nothing sent
//! earlier is left behind in the queue; a sender starts a hold only when the writer has nothing
//! that came before. While a sender commits, the writer waits for it before writing anything,
//! so no later update of a session can be committed (and release this one) first.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::{Notify, mpsc};
use tokio::task::AbortHandle;
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
    /// The hold was started by a sender (the writer was idle), not by the writer's linger.
    by_sender: bool,
    /// The writer waits with nothing in its hands and nothing queued since it looked, and
    /// senders may hold (no session is lost, no shutdown).
    writer_idle: bool,
    /// The writer waits for a sender's commit to end before it writes.
    writer_waits: bool,
    /// Holds started by senders so far: a timer ends only its own.
    holds: u64,
    /// The linger's timer of a sender's hold.
    timer: Option<AbortHandle>,
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
    /// A sender committed them (their metadata waits in the stage: [`Stage::take_metadata`]).
    Done,
}

/// What became of a sender's item.
pub(super) enum Offered {
    /// Queued for the writer, or held with the batch.
    Passed,
    /// It started a hold (number given): the caller starts its timer ([`Stage::time_hold`]).
    Held(u64),
    /// It completed the writer's held batch, committed here: the caller wakes the writer
    /// ([`Stage::wake_writer`]) once the clients the commit woke have been served.
    CommittedForWriter,
}

/// What the writer finds when it looks again.
enum Resume {
    /// Still held, or being committed: wait.
    Wait,
    /// The items are the writer's to commit.
    Take(Vec<Item>),
    /// A sender committed them.
    Done,
}

impl State {
    /// Whether sender hold `hold` (or, with `None`, any sender's hold) is still holding.
    fn sender_holds(&self, hold: Option<u64>) -> bool {
        self.phase == Phase::Holding && self.by_sender && hold.is_none_or(|h| h == self.holds)
    }
}

impl std::fmt::Debug for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stage")
            .field("phase", &self.state().phase)
            .finish_non_exhaustive()
    }
}

/// Wakes the writer when dropped ([`Stage::wake_writer`]), however the sender's send ends.
pub(super) struct WakeWriter<'a>(&'a Stage);

impl Drop for WakeWriter<'_> {
    fn drop(&mut self) {
        self.0.wake.notify_one();
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
    /// a hold of its own if it is a prompt and the writer idle, else into the queue through `slot`.
    pub(super) fn offer(&self, item: Item, slot: mpsc::Permit<'_, Item>) -> Offered {
        let mut state = self.state();
        if state.phase == Phase::Idle && state.writer_idle && awaits_answer(std::slice::from_ref(&item)) {
            drop(slot);
            state.phase = Phase::Holding;
            state.by_sender = true;
            state.holds += 1;
            state.items.push(item);
            return Offered::Held(state.holds);
        }
        if state.phase != Phase::Holding {
            // The writer has something to look at: no sender holds until it has looked.
            state.writer_idle = false;
            slot.send(item);
            return Offered::Passed;
        }
        drop(slot);
        let flush = matches!(item, Item::Flush(_));
        state.items.push(item);
        if flush || state.items.len() >= MAX_HELD {
            self.hand_back(state);
            return Offered::Passed;
        }
        if awaits_answer(&state.items) || burst_goes_on(&state.items) {
            return Offered::Passed;
        }
        state.phase = Phase::Committing;
        // A sender's hold keeps its timer: when it fires, the writer is woken for the put-off
        // writes of what was committed here (message counts, titles, the session's row), later
        // and off the round trip.
        state.timer = None;
        let by_sender = state.by_sender;
        let items = std::mem::take(&mut state.items);
        drop(state);
        if self.commit(items, by_sender) && !by_sender {
            Offered::CommittedForWriter
        } else {
            Offered::Passed
        }
    }

    /// The held batch is the writer's again (a flush, too many, the linger's end, a failed
    /// commit): wakes it, lingering or not.
    fn hand_back(&self, mut state: MutexGuard<'_, State>) {
        state.phase = Phase::Returned;
        if let Some(timer) = state.timer.take() {
            timer.abort();
        }
        drop(state);
        self.wake.notify_one();
    }

    /// Ends sender hold `hold` after [`super::LINGER`], unless it has ended: started by
    /// [`Persister::send`](super::Persister::send) for [`Offered::Held`].
    pub(super) fn time_hold(self: &Arc<Self>, hold: u64) {
        let stage = self.clone();
        let timer = tokio::spawn(async move {
            tokio::time::sleep(super::LINGER).await;
            let mut state = stage.state();
            if state.sender_holds(Some(hold)) {
                state.timer = None;
                stage.hand_back(state);
            } else {
                // Committed by a sender (or handed back, and the writer told already): the
                // writer has the committed batch's put-off writes to make.
                drop(state);
                stage.wake.notify_one();
            }
        });
        let mut state = self.state();
        if state.sender_holds(Some(hold)) {
            state.timer = Some(timer.abort_handle());
        } else {
            timer.abort();
        }
    }

    /// Until something is handed back to the writer, or it is told of a commit.
    pub(super) async fn woken(&self) {
        self.wake.notified().await;
    }

    /// Tells the lingering writer, when dropped, that what it held was committed (until then
    /// sends go to the queue and the writer waits: a sender's commit it saw begin, without end).
    pub(super) fn wake_writer(&self) -> WakeWriter<'_> {
        WakeWriter(self)
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
                Resume::Done => return Lingered::Done,
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
        state.by_sender = false;
        state.items = std::mem::take(items);
        true
    }

    /// The writer is about to wait with empty hands: senders may hold a prompt from now on if
    /// `may_hold` (no session lost, no shutdown) and nothing is queued.
    pub(super) fn writer_waiting(&self, rx: &mpsc::Receiver<Item>, may_hold: bool) {
        let mut state = self.state();
        state.writer_idle = may_hold && rx.is_empty() && state.phase == Phase::Idle;
    }

    /// What a sender held and gave back (the linger's end, a flush, a failed commit), for the
    /// writer waiting in its loop; with `shutdown`, a sender's hold too. Empty if none.
    pub(super) fn take_back(&self, shutdown: bool) -> Vec<Item> {
        let state = self.state();
        if state.phase != Phase::Returned && !(shutdown && state.sender_holds(None)) {
            return Vec::new();
        }
        Self::taken_back(state)
    }

    /// Moves the held items to the writer (the caller checked that they are its).
    fn taken_back(mut state: MutexGuard<'_, State>) -> Vec<Item> {
        if let Some(timer) = state.timer.take() {
            timer.abort();
        }
        state.phase = Phase::Idle;
        state.writer_idle = false;
        std::mem::take(&mut state.items)
    }

    /// Waits while a sender commits (nothing the writer holds may be committed before it),
    /// then takes what a sender gave back, which came before anything the writer holds.
    pub(super) async fn after_senders(&self) -> Vec<Item> {
        loop {
            {
                let mut state = self.state();
                match state.phase {
                    Phase::Committing => state.writer_waits = true,
                    Phase::Returned => return Self::taken_back(state),
                    _ => return Vec::new(),
                }
            }
            self.wake.notified().await;
        }
    }

    /// The metadata of batches senders committed, for the writer's put-off writes.
    pub(super) fn take_metadata(&self) -> Vec<SessionWrite> {
        std::mem::take(&mut self.state().metadata)
    }

    /// Whether a prompt is held for its answer.
    #[cfg(test)]
    pub(super) fn is_holding(&self) -> bool {
        self.state().phase == Phase::Holding
    }

    /// Whether the writer waits with nothing in hand (senders may hold).
    #[cfg(test)]
    pub(super) fn is_writer_idle(&self) -> bool {
        self.state().writer_idle
    }

    /// Whether a sender started the hold (the writer's thread was not woken).
    #[cfg(test)]
    pub(super) fn is_held_by_sender(&self) -> bool {
        self.state().sender_holds(None)
    }

    /// Whether a sender is committing what was held.
    fn is_committing(&self) -> bool {
        self.state().phase == Phase::Committing
    }

    /// The writer looks again (`expired`: its linger is over, or it is shutting down).
    fn resume(&self, expired: bool) -> Resume {
        let state = self.state();
        match state.phase {
            Phase::Holding if !expired => Resume::Wait,
            Phase::Committing => Resume::Wait,
            Phase::Holding | Phase::Returned => Resume::Take(Self::taken_back(state)),
            Phase::Idle => Resume::Done,
        }
    }

    /// Commits a completed batch on this thread and tells its sessions (`true`; the writer is
    /// still to be woken if it held them); handed back to the writer if the commit fails
    /// (nothing was told).
    fn commit(&self, items: Vec<Item>, by_sender: bool) -> bool {
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
            state.writer_waits = false;
            self.hand_back(state);
            return false;
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
        if by_sender && std::mem::take(&mut state.writer_waits) {
            drop(state);
            self.wake.notify_one();
        }
        true
    }
}
