//! Numbering and queueing: what the agent sends (one update, or a burst it wrote at once) and
//! what a client prompts becomes numbered updates, queued for the transcript writer under
//! `numbering` (so `seq` order is storage order), their frames waiting in the fanout until the
//! writer has committed them.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::ws::Utf8Bytes;
use serde_json::value::RawValue;

use super::LiveSession;
use crate::protocol::{self, RpcError};
use crate::store::now_micros;
use crate::store::persister::Item;

/// A session's numbering: every update gets the next seq, under one lock, so `seq` order is
/// storage order.
#[derive(Debug)]
pub(super) struct Numbering {
    /// Held while numbering and queueing updates.
    pub(super) lock: tokio::sync::Mutex<()>,
    /// Highest seq given out (or reserved for a prompt being recorded).
    pub(super) assigned: std::sync::atomic::AtomicU64,
    /// The session's id as a JSON string literal, escaped once for every frame.
    pub(super) id_json: Box<str>,
    /// Time from a prompt to the agent's first update (`acp_gateway_prompt_first_update_seconds`).
    pub(super) first_update: crate::infra::metrics::FirstUpdate,
}

/// Longest title made from a prompt.
const TITLE_CHARS: usize = 100;

impl LiveSession {
    /// Numbers one update and queues it for the writer; clients get it once it is stored.
    pub(super) async fn publish_raw(&self, update: &str, agent_meta: Option<&RawValue>) {
        let _numbering = self.seq.lock.lock().await;
        let seq = self.seq.assigned.load(Ordering::Acquire) + 1;
        self.seq.assigned.store(seq, Ordering::Release);
        self.enqueue(
            seq,
            update,
            agent_meta,
            crate::agents::pool::process::more_lines_follow(),
        )
        .await;
    }

    /// Numbers a burst of updates the agent wrote at once and queues them for the writer;
    /// `more`: another update, already read, follows the last.
    pub(super) async fn publish_run(&self, updates: &[(&RawValue, Option<&RawValue>)], more: bool) {
        // Numbered under one lock: the burst's seqs are consecutive, as its lines were.
        let _numbering = self.seq.lock.lock().await;
        let first = self.seq.assigned.load(Ordering::Acquire) + 1;
        self.seq
            .assigned
            .store(first + updates.len() as u64 - 1, Ordering::Release);
        self.enqueue_burst(first, updates, more).await;
    }

    /// Queues update `seq` (caller holds `numbering`); `more`: the agent's next update follows
    /// it, already read.
    async fn enqueue(&self, seq: u64, update: &str, agent_meta: Option<&RawValue>, more: bool) {
        if changes_session(update) {
            self.note_changes(update).await;
        }
        let frame = self.frame(seq, update, agent_meta);
        self.fanout().unreleased.push_back((seq, frame));
        let Some(me) = self.me.upgrade() else { return };
        self.ctx
            .persister
            .send(update_item(&self.id, me, seq, update, more))
            .await;
        self.ctx.updates_total.increment(1);
    }

    /// What an update the agent sent changes of the session besides its transcript: an agent's
    /// title, usage, the session's controls (the few kinds [`changes_session`] lets through).
    async fn note_changes(&self, update: &str) {
        if update.contains("\"session_info_update\"")
            && let Some(title) = info_update_title(update)
        {
            self.ctx
                .persister
                .send(Item::AgentTitle {
                    session: self.id.clone(),
                    title,
                })
                .await;
        }
        if let Some(usage) = &self.ctx.usage {
            usage.update(&self.owner, &self.agent, &self.id, update);
        }
        if (update.contains("\"current_mode_update\"") || update.contains("\"config_option_update\""))
            && self.controls.known.load(Ordering::Acquire)
            && self.lock_controls().apply_update(update)
        {
            self.store_controls().await;
        }
    }

    /// Update `seq` as its clients get it.
    fn frame(&self, seq: u64, update: &str, agent_meta: Option<&RawValue>) -> Utf8Bytes {
        Utf8Bytes::from(protocol::session_update_raw_id(
            &self.seq.id_json,
            update,
            seq,
            agent_meta,
        ))
    }

    /// Queues updates `first`.. of a burst (caller holds `numbering`), as [`Self::enqueue`]
    /// does each, with one wait for the writer's queue for the run between those that change
    /// the session.
    async fn enqueue_burst(&self, first: u64, updates: &[(&RawValue, Option<&RawValue>)], more: bool) {
        // Upgraded as long as the session is held anywhere (a route holds it for this call).
        let Some(me) = self.me.upgrade() else { return };
        let mut frames = Vec::with_capacity(updates.len());
        let mut items = Vec::with_capacity(updates.len());
        for (seq, ((update, meta), follows)) in (first..).zip(crate::agents::pool::process::with_follows(updates, more))
        {
            let update = update.get();
            if changes_session(update) {
                // What it changes is queued after the updates before it, as one by one.
                self.queue_run(&mut frames, &mut items).await;
                self.note_changes(update).await;
            }
            frames.push((seq, self.frame(seq, update, *meta)));
            items.push(update_item(&self.id, me.clone(), seq, update, follows));
        }
        self.queue_run(&mut frames, &mut items).await;
    }

    /// Hands a run's frames to the fanout (to be released once stored) and its items to the
    /// writer, and empties both.
    async fn queue_run(&self, frames: &mut Vec<(u64, Utf8Bytes)>, items: &mut Vec<Item>) {
        if items.is_empty() {
            return;
        }
        self.fanout().unreleased.extend(frames.drain(..));
        let n = items.len() as u64;
        self.ctx.persister.send_all(std::mem::take(items)).await;
        self.ctx.updates_total.increment(n);
    }

    /// Records a prompt and sends it to the agent with `forward`, which must not wait. The
    /// user's prompt becomes `user_message_chunk` updates (one per content block, sharing a
    /// `messageId`), counts as a message, and titles an untitled session. Its seqs are reserved
    /// before the prompt is sent, so the agent's answer is delivered after them; a prompt the
    /// agent never got is not recorded.
    pub async fn forward_prompt<T>(
        &self,
        prompt: Option<&RawValue>,
        forward: impl FnOnce() -> Result<T, RpcError>,
    ) -> Result<T, RpcError> {
        let blocks: Vec<serde_json::Value> = prompt
            .and_then(|p| serde_json::from_str(p.get()).ok())
            .unwrap_or_default();
        let title = blocks
            .iter()
            .find_map(|b| b.get("text").and_then(serde_json::Value::as_str))
            .map(make_title);
        let _numbering = self.seq.lock.lock().await;
        if self.is_lost() {
            return Err(Self::lost_error());
        }
        let base = self.seq.assigned.load(Ordering::Acquire);
        self.seq.assigned.store(base + blocks.len() as u64, Ordering::Release);
        let sent = match forward() {
            Ok(sent) => sent,
            Err(e) => {
                self.seq.assigned.store(base, Ordering::Release);
                return Err(e);
            }
        };
        // `forward` wrote the prompt to the agent's stdin (unless its queue was busy): recording
        // it below overlaps the agent's work. The numbering lock keeps the answer's updates
        // behind its chunks.
        self.seq.first_update.prompt_sent();
        self.ctx
            .persister
            .send(Item::Prompt {
                session: self.id.clone(),
                title,
                through: base + blocks.len() as u64,
            })
            .await;
        // One `messageId` for the prompt's chunks: a replay shows two prompts in a row (the first
        // refused by the agent, say) as two messages.
        let message_id = uuid::Uuid::new_v4();
        for (seq, block) in (base + 1..).zip(blocks) {
            // Re-serialized compactly: a client's pretty-printed JSON must not span lines.
            let update =
                format!(r#"{{"sessionUpdate":"user_message_chunk","messageId":"{message_id}","content":{block}}}"#);
            self.enqueue(seq, &update, None, false).await;
        }
        Ok(sent)
    }
}

/// Whether an update may change the session besides its transcript (a title, usage, its
/// controls): one scan passes the bulk of a stream (message and thought chunks) by; the few
/// kinds that do are then told apart by name.
fn changes_session(update: &str) -> bool {
    update.contains("_update\"")
}

/// The writer's item for update `seq` of `session`.
fn update_item(session: &Arc<str>, notify: Arc<LiveSession>, seq: u64, update: &str, more: bool) -> Item {
    Item::Update {
        session: session.clone(),
        notify,
        seq,
        update: update.into(),
        at: now_micros(),
        more,
    }
}

/// Title from a prompt's text: first line, at most [`TITLE_CHARS`] characters.
fn make_title(text: &str) -> String {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
    let mut title: String = line.chars().take(TITLE_CHARS).collect();
    if line.chars().count() > TITLE_CHARS {
        title.push('…');
    }
    title
}

/// The `title` of a `session_info_update`, if it is one and has one.
fn info_update_title(update: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(update).ok()?;
    (v.get("sessionUpdate")?.as_str()? == "session_info_update").then_some(())?;
    // Stored and listed: an agent's title is held to the same length as one made from a prompt.
    v.get("title")?.as_str().map(make_title)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles() {
        assert_eq!(make_title("\n  hello world \nmore"), "hello world");
        assert_eq!(make_title(&"x".repeat(150)).chars().count(), TITLE_CHARS + 1);
        assert_eq!(
            info_update_title(r#"{"sessionUpdate":"session_info_update","title":"T"}"#),
            Some("T".into())
        );
        assert_eq!(
            info_update_title(r#"{"sessionUpdate":"agent_message_chunk","title":"session_info_update"}"#),
            None
        );
    }
}
