//! The transcript writer: one task that drains a bounded queue and writes whatever has gathered in
//! one transaction, one row per session per flush.
//!
//! Publishers enqueue each update *before* forwarding it, so anything a client has seen is at
//! least queued here; the queue is bounded, so a slow or unreachable database slows the agents'
//! streams down instead of growing memory. Failed writes are retried with backoff until they
//! succeed (a database restart loses nothing) or shutdown gives up on them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{EventChunk, SessionWrite, Store};

/// Most items written in one transaction.
const MAX_BATCH_ITEMS: usize = 8192;
/// Most payload bytes written in one transaction.
const MAX_BATCH_BYTES: usize = 8 << 20;

/// Something to persist.
#[derive(Debug)]
pub enum Item {
    /// One transcript update (the `update` object, raw JSON) with its sequence number.
    Update {
        /// Gateway session id.
        session: Arc<str>,
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

/// Handle to the writer task. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Persister {
    /// The bounded queue.
    tx: mpsc::Sender<Item>,
    /// Cuts the writer's linger short when someone waits for a flush.
    urgent: Arc<Notify>,
}

impl Persister {
    /// Starts the writer on `store`. It runs until every handle is dropped, or until `cancel`
    /// fires: then it writes what is queued (giving up on it if the database is unreachable) and
    /// stops.
    ///
    /// After the first item of a batch arrives the writer lingers up to `linger` for more, so that
    /// a burst becomes one transaction and the database work stays out of the way of the prompt
    /// round trips that produced it; [`Persister::flush`] does not wait for the linger.
    pub fn spawn(
        store: Arc<dyn Store>,
        capacity: usize,
        linger: Duration,
        cancel: CancellationToken,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(capacity);
        let urgent = Arc::new(Notify::new());
        let task = tokio::spawn(run(store, rx, linger, urgent.clone(), cancel));
        (Self { tx, urgent }, task)
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
        self.urgent.notify_one();
        let _ = done.await;
    }
}

async fn run(
    store: Arc<dyn Store>,
    mut rx: mpsc::Receiver<Item>,
    linger: Duration,
    urgent: Arc<Notify>,
    cancel: CancellationToken,
) {
    let mut items = Vec::with_capacity(1024);
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
        let flush_waiting = items.iter().any(|i| matches!(i, Item::Flush(_)));
        if !flush_waiting && !linger.is_zero() && !cancel.is_cancelled() {
            tokio::select! {
                () = tokio::time::sleep(linger) => {}
                () = urgent.notified() => {}
                () = cancel.cancelled() => {}
            }
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
        let (writes, acks, updates) = coalesce(items.drain(..));
        if !writes.is_empty() {
            let started = std::time::Instant::now();
            let mut backoff = Duration::from_millis(50);
            loop {
                match store.write_batch(&writes).await {
                    Ok(()) => break,
                    Err(e) if cancel.is_cancelled() => {
                        tracing::error!(error = %e, updates, "shutting down with the database unreachable: updates not stored");
                        break;
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
        }
        for ack in acks {
            let _ = ack.send(());
        }
    }
}

fn item_bytes(item: &Item) -> usize {
    match item {
        Item::Update { update, .. } => update.len() + 1,
        _ => 64,
    }
}

/// Groups a batch into one write per session (one chunk per run of consecutive updates).
fn coalesce(items: impl Iterator<Item = Item>) -> (Vec<SessionWrite>, Vec<oneshot::Sender<()>>, u64) {
    let mut writes: Vec<SessionWrite> = Vec::new();
    let mut current: HashMap<Arc<str>, usize> = HashMap::new();
    let mut acks = Vec::new();
    let mut updates = 0;
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
                seq,
                update,
                at,
            } => {
                updates += 1;
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
    (writes, acks, updates)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upd(s: &Arc<str>, seq: u64) -> Item {
        Item::Update {
            session: s.clone(),
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
        let (writes, acks, n) = coalesce(items.into_iter());
        assert_eq!(n, 4);
        assert!(acks.is_empty());
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
        let (writes, _, _) = coalesce(vec![upd(&a, 1), upd(&a, 3)].into_iter());
        assert_eq!(writes.len(), 2);
    }
}
