//! What the transcript writer writes: the items sessions hand it, and how one transaction's
//! worth of them becomes one write per session (one chunk per run of consecutive updates).

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::store::{EventChunk, SessionWrite};

/// Told how far a session's updates are stored, right after each commit that holds some.
pub trait Committed: Send + Sync {
    /// Every update of the session up to `seq` is committed.
    fn committed(&self, seq: u64);

    /// The session's updates cannot be stored (a write failed for good): none of them will be
    /// committed any more, and what waits on them must be answered.
    fn lost(&self);

    /// Updates of the session were refused: this replica no longer holds its lease (another
    /// one serves it now). Those updates are not stored. Nothing by default.
    fn fenced(&self) {}
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
        /// The agent's next update was read with it (a burst it wrote at once), and is on its
        /// way to the queue.
        more: bool,
    },
    /// A prompt was sent: counts a message and offers a title for an untitled session.
    Prompt {
        /// Gateway session id.
        session: Arc<str>,
        /// A title made from the prompt's text.
        title: Option<String>,
        /// The seq of the prompt's last `user_message_chunk` (its first is the one after the
        /// session's seq before it): an update above it is the agent's answer.
        through: u64,
    },
    /// The agent named the session (`session_info_update`).
    AgentTitle {
        /// Gateway session id.
        session: Arc<str>,
        /// The new title.
        title: String,
    },
    /// The agent's session controls changed (`modes`, `configOptions`, `models`).
    Controls {
        /// Gateway session id.
        session: Arc<str>,
        /// All of them, a JSON object: replaces what is stored.
        controls: String,
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
            Item::Controls { session, .. } => write!(f, "Controls({session})"),
            Item::Flush(_) => f.write_str("Flush"),
        }
    }
}

/// A session's write as its updates (if any) and its message count and titles (if any).
pub(super) fn split(w: SessionWrite) -> (Option<SessionWrite>, Option<SessionWrite>) {
    let metadata = w.has_metadata().then(|| SessionWrite {
        session_id: w.session_id.clone(),
        chunk: None,
        prompt_title: w.prompt_title.clone(),
        agent_title: w.agent_title.clone(),
        prompts: w.prompts,
        controls: w.controls.clone(),
        updated_at: w.updated_at,
    });
    let updates = w.chunk.is_some().then_some(SessionWrite {
        prompt_title: None,
        agent_title: None,
        prompts: 0,
        controls: None,
        ..w
    });
    (updates, metadata)
}

/// Metadata writes gathered over several batches, one per session.
pub(super) fn merge_metadata(writes: Vec<SessionWrite>) -> Vec<SessionWrite> {
    let mut merged: Vec<SessionWrite> = Vec::new();
    let mut index: HashMap<Arc<str>, usize> = HashMap::new();
    for w in writes {
        match index.get(&w.session_id) {
            Some(&i) => {
                let m = &mut merged[i];
                m.prompts += w.prompts;
                m.prompt_title = m.prompt_title.take().or(w.prompt_title);
                m.agent_title = w.agent_title.or(m.agent_title.take());
                m.controls = w.controls.or(m.controls.take());
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

pub(super) fn item_bytes(item: &Item) -> usize {
    match item {
        Item::Update { update, .. } => update.len() + 1,
        Item::Controls { controls, .. } => controls.len() + 64,
        _ => 64,
    }
}

/// Whether a batch is a prompt just sent and nothing else in a hurry: prompts, their own
/// `user_message_chunk`s and metadata, no update above a prompt's chunks (the agent's answer),
/// no other session's update, no flush. Such a batch waits a moment for the answer, so that a
/// round trip waits for one commit, not for the prompt's and then the answer's.
pub(super) fn awaits_answer(items: &[Item]) -> bool {
    let mut prompts = false;
    for item in items {
        match item {
            Item::Prompt { .. } => prompts = true,
            Item::Update { session, seq, .. } if !prompted(items, session, *seq) => return false,
            Item::Flush(_) => return false,
            _ => {}
        }
    }
    prompts
}

/// [`awaits_answer`] of `items` just after their last item was added to ones of which it was
/// `before`: in full only when that item is a prompt, so that a held burst is not scanned again
/// for each update that joins it.
pub(super) fn awaits_answer_after(items: &[Item], before: bool) -> bool {
    match items.last() {
        Some(Item::Prompt { .. }) => awaits_answer(items),
        _ if !before => false,
        Some(Item::Update { session, seq, .. }) => prompted(items, session, *seq),
        Some(Item::Flush(_)) => false,
        _ => before,
    }
}

/// Whether update `seq` of `session` is one of the chunks of a prompt in `items`.
fn prompted(items: &[Item], session: &Arc<str>, seq: u64) -> bool {
    items
        .iter()
        .any(|i| matches!(i, Item::Prompt { session: s, through, .. } if s == session && seq <= *through))
}

/// Whether a batch waits for more before it is written: a prompt's answer ([`awaits_answer`]),
/// or the rest of a burst the agent wrote at once ([`burst_goes_on`]).
pub(super) fn waits_for_more(items: &[Item]) -> bool {
    awaits_answer(items) || burst_goes_on(items)
}

/// Whether the last update taken had the agent's next update read right behind it.
pub(super) fn burst_goes_on(items: &[Item]) -> bool {
    items.iter().rev().find_map(|i| match i {
        Item::Update { more, .. } => Some(*more),
        _ => None,
    }) == Some(true)
}

/// One transaction's worth of items.
pub(super) struct Batch {
    /// One write per session (one chunk per run of consecutive updates).
    pub(super) writes: Vec<SessionWrite>,
    /// Updates in it.
    pub(super) updates: u64,
    /// Each session's highest seq in it, and whom to tell once it is committed.
    pub(super) stored_up_to: Vec<(Arc<str>, Arc<dyn Committed>, u64)>,
    /// When each session's oldest update in it was received (epoch µs), in `stored_up_to`'s
    /// order: its commit lag.
    pub(super) oldest: Vec<i64>,
}

/// Groups a batch into one write per session (one chunk per run of consecutive updates). Its
/// flushes are the caller's to answer; the items stay the caller's (to hand back if the write
/// fails).
pub(super) fn coalesce(items: &[Item]) -> Batch {
    let mut writes: Vec<SessionWrite> = Vec::new();
    let mut current: HashMap<Arc<str>, usize> = HashMap::new();
    let mut updates = 0;
    let mut stored_up_to: Vec<(Arc<str>, Arc<dyn Committed>, u64)> = Vec::new();
    let mut oldest: Vec<i64> = Vec::new();
    let mut notify_slot: HashMap<Arc<str>, usize> = HashMap::new();
    // The last update's session and its places in `stored_up_to` and `writes`: a stream's
    // updates come one session at a time, and skip both lookups.
    let mut last: Option<(Arc<str>, usize, usize)> = None;
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
                ..
            } => {
                let (seq, at) = (*seq, *at);
                updates += 1;
                let seq_i = seq as i64;
                // Where it goes: the last update's places when it continues that run, else
                // looked up (and the run's session remembered).
                let cached = last
                    .as_ref()
                    .filter(|(s, _, i)| {
                        Arc::ptr_eq(s, session) && writes[*i].chunk.as_ref().is_some_and(|c| c.seq_to + 1 == seq_i)
                    })
                    .map(|(_, n, i)| (*n, *i));
                let (n, i) = match cached {
                    Some(places) => places,
                    None => {
                        let n = *notify_slot.entry(session.clone()).or_insert_with(|| {
                            stored_up_to.push((session.clone(), notify.clone(), seq));
                            oldest.push(at);
                            stored_up_to.len() - 1
                        });
                        let mut i = slot(&mut writes, &mut current, session);
                        let contiguous = writes[i].chunk.as_ref().is_none_or(|c| c.seq_to + 1 == seq_i);
                        if !contiguous {
                            // Never expected (one publisher per session numbers them in order);
                            // keep every run intact rather than merge across a gap.
                            writes.push(SessionWrite {
                                session_id: session.clone(),
                                ..Default::default()
                            });
                            i = writes.len() - 1;
                            current.insert(session.clone(), i);
                        }
                        last = Some((session.clone(), n, i));
                        (n, i)
                    }
                };
                stored_up_to[n].2 = stored_up_to[n].2.max(seq);
                let seq = seq_i;
                let w = &mut writes[i];
                w.updated_at = w.updated_at.max(at);
                match &mut w.chunk {
                    Some(c) => {
                        c.seq_to = seq;
                        c.payload.push('\n');
                        c.payload.push_str(update);
                    }
                    None => {
                        w.chunk = Some(EventChunk {
                            seq_from: seq,
                            seq_to: seq,
                            payload: update.to_string(),
                            stored_at: 0,
                        })
                    }
                }
            }
            Item::Prompt { session, title, .. } => {
                let i = slot(&mut writes, &mut current, session);
                writes[i].prompts += 1;
                if writes[i].prompt_title.is_none() {
                    writes[i].prompt_title.clone_from(title);
                }
            }
            Item::AgentTitle { session, title } => {
                let i = slot(&mut writes, &mut current, session);
                writes[i].agent_title = Some(title.clone());
            }
            Item::Controls { session, controls } => {
                let i = slot(&mut writes, &mut current, session);
                writes[i].controls = Some(controls.clone());
            }
            Item::Flush(_) => {}
        }
    }
    Batch {
        writes,
        updates,
        stored_up_to,
        oldest,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nobody;
    impl Committed for Nobody {
        fn committed(&self, _: u64) {}
        fn lost(&self) {}
    }

    fn upd(s: &Arc<str>, seq: u64) -> Item {
        Item::Update {
            session: s.clone(),
            notify: Arc::new(Nobody),
            seq,
            update: format!("{{\"n\":{seq}}}").into(),
            at: seq as i64,
            more: false,
        }
    }

    fn prompt(session: &Arc<str>, through: u64) -> Item {
        Item::Prompt {
            session: session.clone(),
            title: None,
            through,
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
                through: 3,
            },
            upd(&a, 3),
        ];
        let Batch {
            writes,
            updates: n,
            stored_up_to,
            oldest,
        } = coalesce(&items);
        assert_eq!(n, 4);
        assert_eq!(oldest, vec![1, 5], "each session's oldest update, for its commit lag");
        assert_eq!(
            stored_up_to.iter().map(|(_, _, seq)| *seq).collect::<Vec<_>>(),
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
                payload: "{\"n\":1}\n{\"n\":2}\n{\"n\":3}".into(),
                stored_at: 0,
            })
        );
        assert_eq!(
            (wa.prompts, wa.prompt_title.as_deref(), wa.updated_at),
            (1, Some("t"), 3)
        );
        assert_eq!(writes[1].chunk.as_ref().map(|c| (c.seq_from, c.seq_to)), Some((5, 5)));
    }

    #[test]
    fn a_prompt_alone_awaits_its_answer() {
        let a: Arc<str> = Arc::from("a");
        let b: Arc<str> = Arc::from("b");
        assert!(!awaits_answer(&[]), "nothing to wait for");
        assert!(awaits_answer(&[prompt(&a, 2)]), "the prompt, its chunks still to come");
        assert!(
            awaits_answer(&[prompt(&a, 2), upd(&a, 1), upd(&a, 2)]),
            "the prompt and its chunks"
        );
        assert!(
            !awaits_answer(&[prompt(&a, 2), upd(&a, 1), upd(&a, 2), upd(&a, 3)]),
            "answered"
        );
        assert!(
            !awaits_answer(&[prompt(&a, 2), upd(&b, 7)]),
            "another session's update is in a hurry"
        );
        assert!(!awaits_answer(&[upd(&a, 1)]), "an update alone");
        let (ack, _) = oneshot::channel();
        assert!(
            !awaits_answer(&[prompt(&a, 2), Item::Flush(ack)]),
            "someone waits on a flush"
        );
    }

    #[test]
    fn a_gap_starts_a_new_chunk() {
        let a: Arc<str> = Arc::from("a");
        let batch = coalesce(&[upd(&a, 1), upd(&a, 3)]);
        assert_eq!(batch.writes.len(), 2);
    }

    /// Kept item by item as a batch is held, the answer check agrees with the full one.
    #[test]
    fn the_answer_check_kept_as_items_join_agrees_with_the_full_one() {
        let a: Arc<str> = Arc::from("a");
        let b: Arc<str> = Arc::from("b");
        let title = || Item::AgentTitle {
            session: a.clone(),
            title: "t".into(),
        };
        let (flush, _) = oneshot::channel();
        let sequences: Vec<Vec<Item>> = vec![
            vec![prompt(&a, 2), upd(&a, 1), upd(&a, 2), title(), upd(&a, 3), upd(&a, 4)],
            vec![upd(&a, 1), upd(&a, 2), prompt(&a, 4), upd(&a, 3)],
            vec![prompt(&a, 1), upd(&a, 1), upd(&b, 7), prompt(&b, 8), upd(&a, 2)],
            vec![prompt(&a, 1), title(), Item::Flush(flush), upd(&a, 1)],
            vec![
                title(),
                prompt(&b, 3),
                upd(&b, 3),
                prompt(&a, 9),
                upd(&a, 9),
                upd(&b, 4),
            ],
        ];
        for sequence in sequences {
            let mut held: Vec<Item> = Vec::new();
            let mut kept = false;
            for item in sequence {
                held.push(item);
                kept = awaits_answer_after(&held, kept);
                assert_eq!(kept, awaits_answer(&held), "after {held:?}");
            }
        }
    }
}
