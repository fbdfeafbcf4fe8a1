//! The transcript writer: one task that drains a bounded queue and writes whatever has gathered in
//! one transaction (group commit), one row per session per flush, and only then tells each
//! session how far its updates are stored.
//!
//! Sessions hand an update to clients only once it is committed ([`Committed`]), so whatever a
//! client has seen survives a crash of the gateway, and `seq` numbers continue above it after a
//! restart. There is no linger: while one transaction commits, the next batch gathers, so a
//! burst becomes a few transactions and a lone update waits for one commit. The queue is
//! bounded, so a slow or unreachable database slows the agents' streams down instead of growing
//! memory. Failed writes are retried with backoff until they succeed (a database restart loses
//! nothing) or shutdown gives up on them (nobody saw those updates).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{EventChunk, SessionWrite, Store};

/// Most items written in one transaction.
const MAX_BATCH_ITEMS: usize = 8192;
/// Metadata writes (message counts, titles) held back while updates keep coming, at most.
const MAX_PENDING_METADATA: usize = 1024;
/// Most payload bytes written in one transaction.
const MAX_BATCH_BYTES: usize = 8 << 20;

/// Told how far a session's updates are stored, right after each commit that holds some.
pub trait Committed: Send + Sync {
    /// Every update of the session up to `seq` is committed.
    fn committed(&self, seq: u64);
}

/// Something to persist.
pub enum Item {
    /// One transcript update (the `update` object, raw JSON) with its sequence number.
    Update {
        /// Gateway session id.
        session: Arc<str>,
        /// Told once it is committed.
        notify: Arc<dyn Committed>,
        /// Its sequence number.
        seq: u64,
        /// The raw `update` object.
        update: Box<str>,
        /// When it was received (epoch µs).
        at: i64,
    },
    /// A prompt was sent: counts a message and offers a title for an untitled session.
    Prompt {
        /// Gateway session id.
        session: Arc<str>,
        /// A title made from the prompt's text.
        title: Option<String>,
    },
    /// The agent named the session (`session_info_update`).
    AgentTitle {
        /// Gateway session id.
        session: Arc<str>,
        /// The new title.
        title: String,
    },
    /// Answer once everything queued before this is written.
    Flush(oneshot::Sender<()>),
}

impl std::fmt::Debug for Item {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Item::Update { session, seq, .. } => write!(f, "Update({session}, {seq})"),
            Item::Prompt { session, .. } => write!(f, "Prompt({session})"),
            Item::AgentTitle { session, .. } => write!(f, "AgentTitle({session})"),
            Item::Flush(_) => f.write_str("Flush"),
        }
    }
}

/// Handle to the writer task. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Persister {
    /// The bounded queue.
    tx: mpsc::Sender<Item>,
}

impl Persister {
    /// Starts the writer on `store`. It runs until every handle is dropped, or until `cancel`
    /// fires: then it writes what is queued (giving up on it if the database is unreachable) and
    /// stops.
    pub fn spawn(
        store: Arc<dyn Store>,
        capacity: usize,
        cancel: CancellationToken,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(capacity);
        let task = tokio::spawn(run(store, rx, cancel));
        (Self { tx }, task)
    }

    /// Queues an item, waiting while the queue is full.
    pub async fn send(&self, item: Item) {
        if self.tx.send(item).await.is_err() {
            tracing::error!("transcript writer has stopped; an update was not stored");
        }
    }

    /// Waits until everything queued so far is in the database.
    pub async fn flush(&self) {
        let (ack, done) = oneshot::channel();
        self.send(Item::Flush(ack)).await;
        let _ = done.await;
    }
}

async fn run(store: Arc<dyn Store>, mut rx: mpsc::Receiver<Item>, cancel: CancellationToken) {
    let mut items = Vec::with_capacity(1024);
    // Message counts and titles not yet written (see below).
    let mut pending_metadata: Vec<SessionWrite> = Vec::new();
    loop {
        // Once cancelled, write what is still queued and stop (handles may outlive the gateway).
        let received = tokio::select! {
            biased;
            n = rx.recv_many(&mut items, MAX_BATCH_ITEMS) => n,
            () = cancel.cancelled() => {
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
        // Take what else is already waiting, up to the byte cap.
        let mut bytes: usize = items.iter().map(item_bytes).sum();
        while items.len() < MAX_BATCH_ITEMS && bytes < MAX_BATCH_BYTES {
            match rx.try_recv() {
                Ok(item) => {
                    bytes += item_bytes(&item);
                    items.push(item);
                }
                Err(_) => break,
            }
        }
        let Batch {
            writes,
            acks,
            updates,
            stored_up_to,
        } = coalesce(items.drain(..));
        // Updates first, on their own: clients wait for them. Message counts and titles wait
        // until the queue is idle (or someone waits for a flush): nobody waits for those.
        let mut chunks: Vec<SessionWrite> = Vec::with_capacity(writes.len());
        for (updates, metadata) in writes.into_iter().map(split) {
            chunks.extend(updates);
            pending_metadata.extend(metadata);
        }
        let stored = chunks.is_empty() || write(&*store, &chunks, updates, &cancel).await;
        if stored {
            for (notify, seq) in stored_up_to {
                notify.committed(seq);
            }
        }
        let due = rx.is_empty() || !acks.is_empty() || cancel.is_cancelled();
        if !pending_metadata.is_empty() && (due || pending_metadata.len() >= MAX_PENDING_METADATA) {
            let metadata = merge_metadata(std::mem::take(&mut pending_metadata));
            write(&*store, &metadata, 0, &cancel).await;
        }
        for ack in acks {
            let _ = ack.send(());
        }
    }
}

/// Writes `writes` in one go, retrying with backoff until it succeeds or shutdown gives up on
/// it; `false` when it was given up (nobody saw those updates: they are released only once
/// stored).
async fn write(store: &dyn Store, writes: &[SessionWrite], updates: u64, cancel: &CancellationToken) -> bool {
    let started = std::time::Instant::now();
    let mut backoff = Duration::from_millis(50);
    loop {
        match store.write_batch(writes).await {
            Ok(()) => break,
            Err(e) if cancel.is_cancelled() => {
                tracing::error!(error = %e, updates, "shutting down with the database unreachable: not stored");
                return false;
            }
            Err(e) => {
                metrics::counter!("acp_gateway_transcript_write_errors_total").increment(1);
                tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "transcript write failed; retrying");
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = cancel.cancelled() => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
    metrics::histogram!("acp_gateway_transcript_write_seconds").record(started.elapsed().as_secs_f64());
    metrics::counter!("acp_gateway_transcript_updates_stored_total").increment(updates);
    true
}

/// A session's write as its updates (if any) and its message count and titles (if any).
fn split(w: SessionWrite) -> (Option<SessionWrite>, Option<SessionWrite>) {
    let has_metadata = w.prompts != 0 || w.prompt_title.is_some() || w.agent_title.is_some();
    let metadata = has_metadata.then(|| SessionWrite {
        session_id: w.session_id.clone(),
        chunk: None,
        prompt_title: w.prompt_title.clone(),
        agent_title: w.agent_title.clone(),
        prompts: w.prompts,
        updated_at: w.updated_at,
    });
    let updates = w.chunk.is_some().then_some(SessionWrite {
        prompt_title: None,
        agent_title: None,
        prompts: 0,
        ..w
    });
    (updates, metadata)
}

/// Metadata writes gathered over several batches, one per session.
fn merge_metadata(writes: Vec<SessionWrite>) -> Vec<SessionWrite> {
    let mut merged: Vec<SessionWrite> = Vec::new();
    let mut index: HashMap<Arc<str>, usize> = HashMap::new();
    for w in writes {
        match index.get(&w.session_id) {
            Some(&i) => {
                let m = &mut merged[i];
                m.prompts += w.prompts;
                m.prompt_title = m.prompt_title.take().or(w.prompt_title);
                m.agent_title = w.agent_title.or(m.agent_title.take());
                m.updated_at = m.updated_at.max(w.updated_at);
            }
            None => {
                index.insert(w.session_id.clone(), merged.len());
                merged.push(w);
            }
        }
    }
    merged
}

fn item_bytes(item: &Item) -> usize {
    match item {
        Item::Update { update, .. } => update.len() + 1,
        _ => 64,
    }
}

/// One transaction's worth of items.
struct Batch {
    /// One write per session (one chunk per run of consecutive updates).
    writes: Vec<SessionWrite>,
    /// Flushes to answer once it is written.
    acks: Vec<oneshot::Sender<()>>,
    /// Updates in it.
    updates: u64,
    /// Each session's highest seq in it, and whom to tell once it is committed.
    stored_up_to: Vec<(Arc<dyn Committed>, u64)>,
}

/// Groups a batch into one write per session (one chunk per run of consecutive updates).
fn coalesce(items: impl Iterator<Item = Item>) -> Batch {
    let mut writes: Vec<SessionWrite> = Vec::new();
    let mut current: HashMap<Arc<str>, usize> = HashMap::new();
    let mut acks = Vec::new();
    let mut updates = 0;
    let mut stored_up_to: Vec<(Arc<dyn Committed>, u64)> = Vec::new();
    let mut notify_slot: HashMap<Arc<str>, usize> = HashMap::new();
    fn slot(writes: &mut Vec<SessionWrite>, current: &mut HashMap<Arc<str>, usize>, session: &Arc<str>) -> usize {
        *current.entry(session.clone()).or_insert_with(|| {
            writes.push(SessionWrite {
                session_id: session.clone(),
                ..Default::default()
            });
            writes.len() - 1
        })
    }
    for item in items {
        match item {
            Item::Update {
                session,
                notify,
                seq,
                update,
                at,
            } => {
                updates += 1;
                match notify_slot.get(&session) {
                    Some(&i) => stored_up_to[i].1 = stored_up_to[i].1.max(seq),
                    None => {
                        notify_slot.insert(session.clone(), stored_up_to.len());
                        stored_up_to.push((notify, seq));
                    }
                }
                let mut i = slot(&mut writes, &mut current, &session);
                let seq = seq as i64;
                let contiguous = writes[i].chunk.as_ref().is_none_or(|c| c.seq_to + 1 == seq);
                if !contiguous {
                    // Never expected (one publisher per session numbers them in order); keep
                    // every run intact rather than merge across a gap.
                    writes.push(SessionWrite {
                        session_id: session.clone(),
                        ..Default::default()
                    });
                    i = writes.len() - 1;
                    current.insert(session, i);
                }
                let w = &mut writes[i];
                w.updated_at = w.updated_at.max(at);
                match &mut w.chunk {
                    Some(c) => {
                        c.seq_to = seq;
                        c.payload.push('\n');
                        c.payload.push_str(&update);
                    }
                    None => {
                        w.chunk = Some(EventChunk {
                            seq_from: seq,
                            seq_to: seq,
                            payload: update.into_string(),
                        })
                    }
                }
            }
            Item::Prompt { session, title } => {
                let i = slot(&mut writes, &mut current, &session);
                writes[i].prompts += 1;
                if writes[i].prompt_title.is_none() {
                    writes[i].prompt_title = title;
                }
            }
            Item::AgentTitle { session, title } => {
                let i = slot(&mut writes, &mut current, &session);
                writes[i].agent_title = Some(title);
            }
            Item::Flush(ack) => acks.push(ack),
        }
    }
    Batch {
        writes,
        acks,
        updates,
        stored_up_to,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nobody;
    impl Committed for Nobody {
        fn committed(&self, _: u64) {}
    }

    fn upd(s: &Arc<str>, seq: u64) -> Item {
        Item::Update {
            session: s.clone(),
            notify: Arc::new(Nobody),
            seq,
            update: format!("{{\"n\":{seq}}}").into(),
            at: seq as i64,
        }
    }

    #[test]
    fn coalesces_runs_per_session() {
        let a: Arc<str> = Arc::from("a");
        let b: Arc<str> = Arc::from("b");
        let items = vec![
            upd(&a, 1),
            upd(&b, 5),
            upd(&a, 2),
            Item::Prompt {
                session: a.clone(),
                title: Some("t".into()),
            },
            upd(&a, 3),
        ];
        let Batch {
            writes,
            acks,
            updates: n,
            stored_up_to,
        } = coalesce(items.into_iter());
        assert_eq!(n, 4);
        assert!(acks.is_empty());
        assert_eq!(
            stored_up_to.iter().map(|(_, seq)| *seq).collect::<Vec<_>>(),
            vec![3, 5],
            "each session is told its highest stored seq"
        );
        assert_eq!(writes.len(), 2);
        let wa = &writes[0];
        assert_eq!(
            wa.chunk,
            Some(EventChunk {
                seq_from: 1,
                seq_to: 3,
                payload: "{\"n\":1}\n{\"n\":2}\n{\"n\":3}".into()
            })
        );
        assert_eq!(
            (wa.prompts, wa.prompt_title.as_deref(), wa.updated_at),
            (1, Some("t"), 3)
        );
        assert_eq!(writes[1].chunk.as_ref().map(|c| (c.seq_from, c.seq_to)), Some((5, 5)));
    }

    #[test]
    fn a_gap_starts_a_new_chunk() {
        let a: Arc<str> = Arc::from("a");
        let batch = coalesce(vec![upd(&a, 1), upd(&a, 3)].into_iter());
        assert_eq!(batch.writes.len(), 2);
    }
}
