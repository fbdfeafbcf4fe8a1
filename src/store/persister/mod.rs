//! The transcript writer: one task that drains a bounded queue and writes whatever has gathered in
//! one transaction (group commit), one row per session per flush, and only then tells each
//! session how far its updates are stored.
//!
//! Sessions hand an update to clients only once it is committed ([`Committed`]), so whatever a
//! client has seen survives a crash of the gateway, and `seq` numbers continue above it after a
//! restart. While one transaction commits, the next batch gathers, so a burst becomes a few
//! transactions and a lone update waits for one commit. Two lingers, each at most [`LINGER`]: a
//! prompt just sent waits for the agent's answer, so that a round trip waits for one commit, not
//! for the prompt's and then the answer's; and a burst the agent wrote at once (its next update
//! already read) is waited for to its end, so that a stream is a commit per read of the agent's
//! output, not one per few updates. What nobody waits on (message counts, titles, and on
//! SQLite the session rows that stored chunks advance) is written once the queue has been quiet
//! for [`QUIET`], or every [`PUT_OFF_AT_MOST`] while it never is, or when someone flushes. The queue is
//! bounded, so a slow or unreachable database slows the agents' streams down instead of growing
//! memory. Failed writes are retried with backoff until they succeed (a database restart loses
//! nothing) or shutdown gives up on them (nobody saw those updates).
//!
//! A write that fails for good (an error that is not [transient](StoreError::is_transient), a few
//! times in a row) does not wedge the writer: a batch of several sessions is split and each
//! session written on its own, and only a session whose own write keeps failing is dropped, loudly
//! (an error log naming it, `acp_gateway_transcript_writes_dropped_total`). Its updates, and every
//! later one of that session, are never released to clients: nothing is shown that is not stored.
//!
//! The writer reports how it is doing ([`Persister::health`]) for `/readyz`: failing since when,
//! and with what, or waiting on the database for too long.
//!
//! Where the store has a connection for the writer alone ([`Store::transcript_writer`]: SQLite),
//! the writer runs on a thread of its own and commits through it directly; otherwise it is a task
//! on the gateway's runtime writing through the store's pool. There, a prompt lingering for its
//! answer waits on a [`stage`], and the agent's reader that completes it commits it on its own
//! thread: a round trip does not hop to the writer's thread and back.

use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{SessionWrite, Store, StoreError, now_micros};
use crate::infra::budget::ByteBudget;

/// Most items written in one transaction: a round trip queued behind a stream waits for the
/// commit of at most this many (see the queue's bound, `app::PERSIST_QUEUE`). A burst of a few
/// hundred updates is one commit either way.
const MAX_BATCH_ITEMS: usize = 2048;
/// How long the queue must be quiet before the writes nobody waits on (message counts, titles,
/// the session rows that stored chunks advance) are made: a client's next prompt usually comes
/// sooner than that after an answer, and must not wait behind them.
const QUIET: Duration = Duration::from_millis(2);
/// How long a prompt just sent waits for the agent's answer before its chunks are written on
/// their own ([`batch::awaits_answer`]). An agent that answers at once gets both in one commit;
/// one that thinks first (any model) finds the prompt stored this much later than at once (up
/// to the stage's tick later when a sender holds it, see [`stage`]).
const LINGER: Duration = Duration::from_millis(1);
/// Most payload bytes written in one transaction.
const MAX_BATCH_BYTES: usize = 8 << 20;
/// How long [`Persister::flush`] waits: a request that needs the transcript written answers
/// within the contract's 5 s even when the database does not.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(4);
/// A write waiting on the database longer than this makes the writer unhealthy.
const STALLED_AFTER: Duration = Duration::from_secs(5);

pub use health::WriterTrouble;
mod batch;
mod health;
mod put_off;
mod stage;
#[cfg(test)]
mod stage_tests;
#[cfg(test)]
mod tests;
mod writer;

use health::Health;
use put_off::{After, PUT_OFF_AT_MOST, PutOff};
use stage::{Lingered, Offered, Stage};
use writer::Writer;

use batch::{Batch, awaits_answer, burst_goes_on, coalesce, item_bytes, split, waits_for_more};
pub use batch::{Committed, Item};
/// Handle to the writer task. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Persister {
    /// The queue, bounded in items...
    tx: mpsc::Sender<Item>,
    /// ... and in bytes, held from [`Persister::send`] until the writer is done with an item.
    room: ByteBudget,
    /// How the writer is doing.
    health: Arc<Health>,
    /// Where a prompt waits for its answer when the writer has a connection of its own.
    stage: Option<Arc<Stage>>,
}

impl Persister {
    /// Starts the writer on `store`. It runs until every handle is dropped, or until `cancel`
    /// fires: then it writes what is queued (giving up on it if the database is unreachable) and
    /// stops.
    /// The queue holds at most `capacity` items and `bytes` bytes.
    pub fn spawn(
        store: Arc<dyn Store>,
        capacity: usize,
        bytes: usize,
        cancel: CancellationToken,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        Self::spawn_leased(store, capacity, bytes, cancel, None)
    }

    /// [`Self::spawn`] for a replica sharing the database: with `holder`, a session's updates are
    /// stored only while that replica holds its lease ([`Store::write_batch_leased`]), and a
    /// session whose updates were refused is told so ([`Committed::fenced`]).
    pub fn spawn_leased(
        store: Arc<dyn Store>,
        capacity: usize,
        bytes: usize,
        cancel: CancellationToken,
        holder: Option<Arc<str>>,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(capacity);
        let room = ByteBudget::new(bytes);
        let health = Arc::new(Health::default());
        // SQLite: the writer's own connection, on a thread of its own (a commit is a call, not a
        // hop to a connection's worker thread and back); the commit notices go out from there.
        let direct = match holder.is_none().then(|| store.transcript_writer()).flatten() {
            Some(Ok(direct)) => Some(direct),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "the transcript writer's own connection could not be opened; writing through the pool");
                None
            }
            None => None,
        };
        let stage = direct.map(|d| Arc::new(Stage::new(Arc::new(Mutex::new(d)), room.clone(), health.clone())));
        if let Some(stage) = &stage {
            stage.start_ticker();
        }
        #[expect(
            clippy::disallowed_methods,
            reason = "returned: the application awaits the writer at shutdown"
        )]
        let task = match stage.clone() {
            Some(stage) => {
                let (done, finished) = oneshot::channel::<()>();
                let health = health.clone();
                let room = room.clone();
                let thread = std::thread::Builder::new().name("transcript-writer".into()).spawn(move || {
                    match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                        Ok(rt) => rt.block_on(run(store, rx, room, cancel, health, holder, Some(stage))),
                        Err(e) => tracing::error!(error = %e, "the transcript writer's runtime could not start; nothing is stored"),
                    }
                    let _ = done.send(());
                });
                if let Err(e) = thread {
                    tracing::error!(error = %e, "the transcript writer's thread could not start; nothing is stored");
                }
                tokio::spawn(async move {
                    let _ = finished.await;
                })
            }
            None => tokio::spawn(run(store, rx, room.clone(), cancel, health.clone(), holder, None)),
        };
        (
            Self {
                tx,
                room,
                health,
                stage,
            },
            task,
        )
    }

    /// `Ok` while the writer's writes succeed; otherwise what is wrong: its writes have failed
    /// since some time (with the last error), or one has waited on the database too long.
    pub fn health(&self) -> Result<(), WriterTrouble> {
        self.health.report()
    }

    /// Session writes given up on for good since start.
    pub fn dropped_writes(&self) -> u64 {
        self.health.dropped.load(Ordering::Relaxed)
    }

    /// Queues an item, waiting while the queue is full (in items or bytes).
    pub async fn send(&self, item: Item) {
        // A place in the queue, then bytes: either wait may be cancelled without losing any.
        let Ok(slot) = self.tx.reserve().await else {
            tracing::error!("transcript writer has stopped; an update was not stored");
            return;
        };
        self.room.take(item_bytes(&item)).await;
        match &self.stage {
            Some(stage) => offer(stage, [(item, slot)]).await,
            None => slot.send(item),
        }
    }

    /// Queues items in order, as [`Self::send`] does each, with one wait for their places and
    /// one for their bytes (a burst of updates the agent wrote at once).
    pub async fn send_all(&self, items: Vec<Item>) {
        if items.len() <= 1 || items.len() > self.tx.max_capacity() {
            for item in items {
                self.send(item).await;
            }
            return;
        }
        // Places, then bytes, as `send` takes them.
        let Ok(slots) = self.tx.reserve_many(items.len()).await else {
            tracing::error!("transcript writer has stopped; updates were not stored");
            return;
        };
        if !self.room.take_all(items.iter().map(item_bytes)).await {
            // More than the whole budget together: each is sent on its own, as it fits.
            drop(slots);
            for item in items {
                self.send(item).await;
            }
            return;
        }
        match &self.stage {
            Some(stage) => offer(stage, items.into_iter().zip(slots)).await,
            None => {
                for (item, slot) in items.into_iter().zip(slots) {
                    slot.send(item);
                }
            }
        }
    }

    /// Waits until everything queued so far is in the database, at most [`FLUSH_TIMEOUT`]
    /// (then [`StoreError::Timeout`]: the database is unreachable or the writer failing).
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.flush_within(FLUSH_TIMEOUT).await
    }

    /// [`Self::flush`], waiting at most `limit`.
    pub async fn flush_within(&self, limit: Duration) -> Result<(), StoreError> {
        let (ack, done) = oneshot::channel();
        let flushed = async {
            self.send(Item::Flush(ack)).await;
            let _ = done.await;
        };
        tokio::time::timeout(limit, flushed)
            .await
            .map_err(|_| StoreError::Timeout(limit))
    }
}

/// Offers items to the stage with their places in the queue, in order, then does what the
/// offers call for: the ticker runs for a hold a sender started, and after a commit made here for
/// the writer, the writer is woken once the clients that commit woke have been served.
async fn offer<'a>(stage: &Stage, offers: impl IntoIterator<Item = (Item, mpsc::Permit<'a, Item>)>) {
    let (mut held, mut committed) = (false, false);
    for (item, slot) in offers {
        match stage.offer(item, slot) {
            Offered::Passed => {}
            Offered::Held => held = true,
            Offered::CommittedForWriter => committed = true,
        }
    }
    if held {
        stage.tick_for_holds();
    }
    if committed {
        // The commit woke the clients' socket writers: they send before the writer's thread is
        // woken to compete with them for a core.
        let _wake = stage.wake_writer();
        tokio::task::yield_now().await;
    }
}

async fn run(
    store: Arc<dyn Store>,
    mut rx: mpsc::Receiver<Item>,
    room: ByteBudget,
    cancel: CancellationToken,
    health: Arc<Health>,
    holder: Option<Arc<str>>,
    stage: Option<Arc<Stage>>,
) {
    let direct = stage.as_ref().map(|s| s.direct.clone());
    let mut items = Vec::with_capacity(1024);
    // Message counts and titles not yet written (see below).
    let mut put_off = PutOff::default();
    // Sessions whose updates could not be stored for good: none of their updates is released
    // any more (a later commit would release the lost ones with it).
    let mut lost: HashSet<Arc<str>> = HashSet::new();
    // Looked up once: recorded per batch and per session in it.
    let batch_updates = metrics::histogram!(crate::infra::metrics::TRANSCRIPT_BATCH_UPDATES);
    let commit_lag = metrics::histogram!(crate::infra::metrics::TRANSCRIPT_COMMIT_LAG_SECONDS);
    let w = Writer::new(&*store, &cancel, &health, holder.as_deref(), direct);
    loop {
        if let Some(stage) = stage.as_deref() {
            put_off.hold(stage.take_metadata(), Instant::now());
            stage.writer_waiting(&rx, lost.is_empty() && !cancel.is_cancelled());
        }
        let quiet_write = put_off.pending_since(w.unsettled_since());
        // What a sender held and gave back has lingered already.
        let mut lingered = false;
        // Once cancelled, write what is still queued and stop (handles may outlive the gateway).
        let received = tokio::select! {
            biased;
            () = woken(stage.as_deref()) => {
                items.extend(stage.as_deref().map(|s| s.take_back(false)).unwrap_or_default());
                if items.is_empty() {
                    continue;
                }
                lingered = true;
                items.len()
            }
            n = rx.recv_many(&mut items, MAX_BATCH_ITEMS) => n,
            () = tokio::time::sleep(QUIET), if quiet_write.is_some() => {
                w.put_off_writes(put_off.take()).await;
                continue;
            }
            () = cancel.cancelled() => {
                items.extend(stage.as_deref().map(|s| s.take_back(true)).unwrap_or_default());
                while items.len() < MAX_BATCH_ITEMS {
                    match rx.try_recv() {
                        Ok(item) => items.push(item),
                        Err(_) => break,
                    }
                }
                items.len()
            }
        };
        if received == 0 {
            break;
        }
        // Take what else is already waiting, up to the byte cap; a prompt just sent waits a
        // moment for the agent's answer, to be committed with it (all of the answer the agent
        // wrote at once: the updates it has read right behind it are on their way).
        let mut bytes: usize = items.iter().map(item_bytes).sum();
        take_waiting(&mut rx, &mut items, &mut bytes);
        if let Some(stage) = stage.as_deref()
            && !lingered
        {
            // What is queued came after what a sender holds or commits (it held only when the
            // writer had nothing): that goes first, or waits for the sender's commit.
            let back = stage.after_senders().await;
            if !back.is_empty() {
                bytes += back.iter().map(item_bytes).sum::<usize>();
                items.splice(0..0, back);
                lingered = true;
            }
        }
        // A prompt waits for its answer; a burst the agent wrote at once (its next update already
        // read, see `more_lines_follow`) is taken whole: one commit for what one read of its
        // output held, not one per few updates the reader got through while the last commit
        // ran (measured in a stream: 22-64 updates per commit before, ~500 after).
        let mut held = lingered;
        if let Some(stage) = stage.as_deref()
            && !lingered
            && lost.is_empty()
            && !cancel.is_cancelled()
            && waits_for_more(&items)
        {
            // Held where the agent's reader can complete and commit it (see `stage`), without
            // waking this thread for each update that joins it.
            match stage.linger(&mut rx, &mut items, &mut bytes, &cancel).await {
                Lingered::NotHeld => {}
                Lingered::Taken => held = true,
                // Its metadata is taken with the rest senders committed.
                Lingered::Done => continue,
            }
        }
        let burst = stage.is_none() && burst_goes_on(&items);
        if !held && !cancel.is_cancelled() && (awaits_answer(&items) || burst) {
            let until = tokio::time::Instant::now() + LINGER;
            while items.len() < MAX_BATCH_ITEMS && bytes < MAX_BATCH_BYTES && waits_for_more(&items) {
                let room = MAX_BATCH_ITEMS - items.len();
                let before = items.len();
                match tokio::time::timeout_at(until, rx.recv_many(&mut items, room)).await {
                    Ok(n) if n > 0 => bytes += items[before..].iter().map(item_bytes).sum::<usize>(),
                    _ => break,
                }
            }
            take_waiting(&mut rx, &mut items, &mut bytes);
        }
        // The batch's bytes are held until it is written (or given up on).
        let held: Vec<usize> = items.iter().map(item_bytes).collect();
        let Batch {
            writes,
            updates,
            stored_up_to,
            oldest,
        } = coalesce(&items);
        let acks: Vec<oneshot::Sender<()>> = items
            .drain(..)
            .filter_map(|item| match item {
                Item::Flush(ack) => Some(ack),
                _ => None,
            })
            .collect();
        // What senders committed came before this batch (they commit only what was sent
        // before the writer took anything, and it waited for them above): its metadata goes
        // first, or older controls or titles would be merged over this batch's newer ones.
        if let Some(stage) = stage.as_deref() {
            put_off.hold(stage.take_metadata(), Instant::now());
        }
        // Updates first, on their own: clients wait for them. Message counts and titles wait
        // until the queue is idle (or someone waits for a flush): nobody waits for those.
        let mut chunks: Vec<SessionWrite> = Vec::with_capacity(writes.len());
        for (updates, metadata) in writes.into_iter().map(split) {
            match updates {
                Some(u) if lost.contains(&u.session_id) => {
                    let n = u.chunk.as_ref().map_or(0, |c| c.seq_to - c.seq_from + 1);
                    metrics::counter!(crate::infra::metrics::TRANSCRIPT_UPDATES_DROPPED).increment(n as u64);
                    tracing::error!(session = %u.session_id, updates = n, "session's transcript cannot be stored; update dropped, never shown");
                }
                u => chunks.extend(u),
            }
            put_off.hold(metadata, Instant::now());
        }
        let stored = if chunks.is_empty() {
            Some(HashSet::new())
        } else {
            batch_updates.record(updates as f64);
            w.write(&chunks, updates).await
        };
        if let Some(dropped) = stored {
            lost.extend(dropped);
            let refused = w.take_refused();
            let now = now_micros();
            for ((session, notify, seq), received) in stored_up_to.into_iter().zip(oldest) {
                if lost.contains(&session) {
                    notify.lost();
                } else if refused.contains(&session) {
                    notify.fenced();
                } else {
                    commit_lag.record((now - received).max(0) as f64 / 1e6);
                    notify.committed(seq);
                }
            }
        }
        if let Some(stage) = stage.as_deref() {
            // What senders committed meanwhile: a flush answered below covers it too.
            put_off.hold(stage.take_metadata(), Instant::now());
        }
        let after = After {
            flushing: !acks.is_empty(),
            stopping: cancel.is_cancelled(),
        };
        if put_off.due(Instant::now(), w.unsettled_since(), after) {
            w.put_off_writes(put_off.take()).await;
        }
        room.give_back(held);
        for ack in acks {
            let _ = ack.send(());
        }
    }
    w.put_off_writes(put_off.take()).await;
}

/// Until the stage wakes the writer (never without one).
async fn woken(stage: Option<&Stage>) {
    match stage {
        Some(stage) => stage.woken().await,
        None => std::future::pending().await,
    }
}

/// Moves what is already queued into `items`, up to the item and byte caps.
fn take_waiting(rx: &mut mpsc::Receiver<Item>, items: &mut Vec<Item>, bytes: &mut usize) {
    while items.len() < MAX_BATCH_ITEMS && *bytes < MAX_BATCH_BYTES {
        match rx.try_recv() {
            Ok(item) => {
                *bytes += item_bytes(&item);
                items.push(item);
            }
            Err(_) => break,
        }
    }
}
