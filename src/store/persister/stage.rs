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
//! retries. A burst the agent wrote at once (its next update already read when one is sent) is
//! held the same way until its last update: a stream is one commit per read of the agent's
//! output, and the writer's thread is not woken for each update of it.
//!
//! When the writer is idle (nothing in its hands, nothing queued since it last looked), the
//! prompt's own send starts the hold: the writer's thread is not woken at all for a round trip
//! (measured: it was woken twice per round trip, once as the prompt went to the agent and once
//! after the answer's commit, competing for the two cores with the agent and the gateway).
//!
//! A sender's hold ends after the linger even when no answer comes: a ticker task of the stage's
//! own looks every [`TICK`] while holds come and go, and parks once they stop (the next hold
//! wakes it). It replaced a 1 ms timer task spawned per hold, whose spawn, abort and firing cost
//! ~20 µs of every round trip's p50 (measured, alternating pairs on 2 cores: 307 against 328 µs
//! added over direct stdio; the ticker looking every 1 ms won less). The ticker also wakes the
//! writer for the put-off writes of batches senders committed: when the holds stop, and every
//! [`super::PUT_OFF_AT_MOST`] while they go on (every 64 ticks put a transaction of put-off
//! writes before a round trip's commit often enough to show in the p99).
//!
//! Order: a sender puts its item in the queue under the stage's lock, and the writer moves what
//! the queue holds into the stage under the same lock as it starts holding, so nothing sent
//! earlier is left behind in the queue; a sender starts a hold only when the writer has nothing
//! that came before. While a sender commits, the writer waits for it before writing anything,
//! so no later update of a session can be committed (and release this one) first.

use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use tokio::sync::{Notify, mpsc};
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;

use super::batch::{Batch, Item, awaits_answer, awaits_answer_after, burst_goes_on, coalesce, item_bytes, split};
use super::{Health, SessionWrite, take_waiting};
use crate::infra::budget::ByteBudget;
use crate::store::now_micros;
use crate::store::sqlite_writer::BatchWriter;

/// Most items held for one answer: a longer burst is the writer's to commit.
const MAX_HELD: usize = 512;
/// How often the ticker looks while senders hold: a sender's hold ends between
/// [`super::LINGER`] and this much later when no answer completes it (a prompt's own chunk
/// waits that long for an agent that thinks first; a client sees nothing of it sooner anyway
/// but its echo).
const TICK: std::time::Duration = std::time::Duration::from_millis(4);
/// Ticks with no sender's hold after which the ticker parks.
const PARK_AFTER_TICKS: u32 = 2;

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
    /// Holds started by senders so far (the ticker tells whether one started since it looked).
    holds: u64,
    /// When the sender's hold that is holding began: the ticker ends it after the linger.
    hold_began: Option<Instant>,
    /// A sender committed a batch it held since the ticker last woke the writer (who has its
    /// put-off writes to make).
    committed_by_senders: bool,
    items: Vec<Item>,
    /// Whether `items` wait for a prompt's answer ([`awaits_answer`]), kept as they are held.
    awaiting: bool,
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
    /// It started a hold: the caller makes sure the ticker runs ([`Stage::tick_for_holds`]).
    Held,
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

/// The ticker's controls (see the module's notes).
#[derive(Default)]
struct Ticker {
    /// It runs (or was armed to): a sender starting a hold need not arm it.
    ticking: AtomicBool,
    /// Wakes it from its park.
    arm: Arc<Notify>,
    task: Mutex<Option<AbortHandle>>,
}

/// Ends the senders' holds that linger past [`super::LINGER`], and wakes the writer for the
/// put-off writes of batches senders committed; parks while no sender holds.
async fn run_ticker(stage: Weak<Stage>, arm: Arc<Notify>) {
    let mut seen_holds = 0;
    let mut quiet_ticks = 0u32;
    let mut woke_writer = Instant::now();
    loop {
        let Some(s) = stage.upgrade() else { return };
        let quiet = quiet_ticks + 1 >= PARK_AFTER_TICKS;
        let wake_writer = quiet || woke_writer.elapsed() >= super::PUT_OFF_AT_MOST;
        let (active, committed) = s.tick(&mut seen_holds, wake_writer);
        quiet_ticks = if active { 0 } else { quiet_ticks + 1 };
        if wake_writer {
            woke_writer = Instant::now();
            if committed {
                s.wake.notify_one();
            }
        }
        if quiet_ticks >= PARK_AFTER_TICKS {
            s.ticker.ticking.store(false, Ordering::SeqCst);
            // A hold that began before `ticking` was cleared found it set and did not arm: the
            // ticker goes on for it (unless a later hold armed it already: then it parks, and
            // the permit wakes it at once). One that began and committed since the last look
            // left put-off writes: the writer is woken for them before the ticker parks.
            let (holding, committed) = s.tick(&mut seen_holds, true);
            if committed {
                s.wake.notify_one();
            }
            if !holding || s.ticker.ticking.swap(true, Ordering::SeqCst) {
                drop(s);
                arm.notified().await;
            }
            quiet_ticks = 0;
            continue;
        }
        drop(s);
        tokio::time::sleep(TICK).await;
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        if let Some(task) = self.ticker.task.lock().take() {
            task.abort();
        }
    }
}

pub(super) struct Stage {
    state: Mutex<State>,
    /// Ends senders' holds after the linger.
    ticker: Ticker,
    /// Wakes the writer: what it held was committed or handed back.
    wake: Notify,
    /// The writer's connection, shared with the writer.
    pub(super) direct: Arc<Mutex<Box<dyn BatchWriter>>>,
    room: ByteBudget,
    health: Arc<Health>,
    /// How long a hold lasts with no answer ([`super::LINGER`]; tests lengthen it, so that a
    /// hold they look at does not end under a loaded machine before they act on it).
    linger_us: std::sync::atomic::AtomicU64,
}

impl Stage {
    pub(super) fn new(direct: Arc<Mutex<Box<dyn BatchWriter>>>, room: ByteBudget, health: Arc<Health>) -> Self {
        Self {
            state: Mutex::default(),
            ticker: Ticker::default(),
            wake: Notify::new(),
            direct,
            room,
            health,
            linger_us: std::sync::atomic::AtomicU64::new(super::LINGER.as_micros() as u64),
        }
    }

    /// How long a hold lasts with no answer.
    fn linger_for(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.linger_us.load(Ordering::Relaxed))
    }

    /// Lengthens (or shortens) the holds from now on.
    #[cfg(test)]
    pub(super) fn set_linger(&self, linger: std::time::Duration) {
        self.linger_us.store(linger.as_micros() as u64, Ordering::Relaxed);
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock()
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
            state.hold_began = Some(Instant::now());
            state.items.push(item);
            state.awaiting = true;
            return Offered::Held;
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
        state.awaiting = awaits_answer_after(&state.items, state.awaiting);
        if state.awaiting || burst_goes_on(&state.items) {
            return Offered::Passed;
        }
        state.phase = Phase::Committing;
        // The ticker wakes the writer for the put-off writes of what a sender's hold committed
        // here (message counts, titles, the session's row), later and off the round trip.
        state.hold_began = None;
        let by_sender = state.by_sender;
        state.committed_by_senders |= by_sender;
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
        state.hold_began = None;
        drop(state);
        self.wake.notify_one();
    }

    /// Makes sure the ticker runs (a sender just started a hold): it ends the hold after
    /// [`super::LINGER`] unless an answer completes it first.
    pub(super) fn tick_for_holds(&self) {
        if !self.ticker.ticking.swap(true, Ordering::SeqCst) {
            self.ticker.arm.notify_one();
        }
    }

    /// One tick: ends the sender's hold that has lingered long enough (handing its items back to
    /// the writer); whether a sender's hold is holding or began since `seen_holds` (updated), and
    /// whether senders committed batches since the last time this was asked with `take_commits`.
    fn tick(&self, seen_holds: &mut u64, take_commits: bool) -> (bool, bool) {
        let mut state = self.state();
        let began = std::mem::replace(seen_holds, state.holds) != state.holds;
        let committed = state.committed_by_senders;
        if take_commits {
            state.committed_by_senders = false;
        }
        let holding = state.sender_holds(None);
        if holding && state.hold_began.is_some_and(|t| t.elapsed() >= self.linger_for()) {
            self.hand_back(state);
            return (true, committed);
        }
        (holding || began, committed)
    }

    /// Starts the ticker ([`Stage::tick_for_holds`]); it ends with the stage.
    pub(super) fn start_ticker(self: &Arc<Self>) {
        #[expect(
            clippy::disallowed_methods,
            reason = "aborted with the stage (its handle is kept), and ends when the stage is gone"
        )]
        let task = tokio::spawn(run_ticker(Arc::downgrade(self), self.ticker.arm.clone()));
        *self.ticker.task.lock() = Some(task.abort_handle());
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
        let until = tokio::time::Instant::now() + self.linger_for();
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

    /// The writer starts holding `items` (a prompt waiting for its answer, or a burst for its
    /// last update), with what the queue holds by now. `false`: they no longer wait for either
    /// (it came), nothing is held.
    fn hold(&self, rx: &mut mpsc::Receiver<Item>, items: &mut Vec<Item>, bytes: &mut usize) -> bool {
        let mut state = self.state();
        take_waiting(rx, items, bytes);
        let awaiting = awaits_answer(items);
        if !(awaiting || burst_goes_on(items)) || items.len() >= MAX_HELD {
            return false;
        }
        debug_assert_eq!(state.phase, Phase::Idle);
        state.phase = Phase::Holding;
        state.awaiting = awaiting;
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
        state.hold_began = None;
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
        let Batch {
            writes,
            updates,
            stored_up_to,
            oldest,
        } = coalesce(&items);
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
            self.direct.lock().write_batch(&chunks)
        };
        if let Err(e) = written {
            tracing::debug!(error = %e, "a held batch's commit failed; the writer takes it with its retries");
            let mut state = self.state();
            state.items = items;
            state.writer_waits = false;
            self.hand_back(state);
            return false;
        }
        self.health.succeeded();
        metrics::histogram!(crate::infra::metrics::TRANSCRIPT_COMMIT_SECONDS).record(started.elapsed().as_secs_f64());
        metrics::counter!(crate::infra::metrics::TRANSCRIPT_UPDATES_STORED).increment(updates);
        metrics::histogram!(crate::infra::metrics::TRANSCRIPT_BATCH_UPDATES).record(updates as f64);
        let commit_lag = metrics::histogram!(crate::infra::metrics::TRANSCRIPT_COMMIT_LAG_SECONDS);
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
