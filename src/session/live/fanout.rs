//! What a session's clients get, under one short lock that is never held across an await: the
//! updates numbered but not yet stored, the attached clients with how far each has been given
//! the transcript, and what must follow updates not yet released (answers, agent requests).
//!
//! A client is *live* (each released update is offered to its outbox) or *fed* (it is replaying
//! the stored transcript, or fell behind: a feed reads the store after the last `seq` it was
//! given, at its own pace, and hands it back to live once it has caught up). Live updates pass a
//! fed client by: the store has them. What must follow updates a fed client has not been given
//! yet is held for it and goes out right after them.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::ws::Utf8Bytes;
use serde_json::value::RawValue;

use crate::infra::outbox::Outbox;
use crate::session::client::Client;
use crate::session::requests::AgentRequest;

/// Ids of feeds: a feed stops when its subscriber is gone or given another feed.
static NEXT_FEED: AtomicU64 = AtomicU64::new(1);

/// A new feed id.
pub(super) fn feed_id() -> u64 {
    NEXT_FEED.fetch_add(1, Ordering::Relaxed)
}

/// What waits for the updates numbered before it to be released.
pub(super) enum Deferred {
    /// An agent's answer (the frame) to a client's request (the id).
    Respond(Outbox, Box<RawValue>, Utf8Bytes),
    /// An agent's request to the session's clients.
    Ask(Arc<AgentRequest>),
    /// The `_gateway/queue` notice of a turn's end, after the turn's updates.
    TellQueue,
}

/// What a fed client gets once it has been given the updates before it.
pub(super) enum Held {
    /// An answer, an error, a notice.
    Frame(Utf8Bytes),
    /// An agent's request, asked of this client under the id it was assigned.
    Ask(Arc<AgentRequest>, u64),
}

/// A client attached to the session.
pub(super) struct Subscriber {
    pub(super) client: Arc<Client>,
    /// The highest seq it has been given (by a feed or live).
    pub(super) sent_up_to: u64,
    /// The feed giving it the transcript from the store, if it is fed; live updates pass it by.
    pub(super) feed: Option<u64>,
    /// What must reach it after updates it has not been given yet: (after seq, what), in order.
    pub(super) held: VecDeque<(u64, Held)>,
    /// It observes (a share's observer): it is never asked the agent's requests.
    pub(super) observer: bool,
}

impl Subscriber {
    pub(super) fn new(client: Arc<Client>, sent_up_to: u64, feed: Option<u64>) -> Self {
        Self {
            client,
            sent_up_to,
            feed,
            held: VecDeque::new(),
            observer: false,
        }
    }

    /// Whether what follows update `after` must be held for it (it has not been given that far,
    /// or something held already waits and must go first).
    pub(super) fn must_hold(&self, after: u64) -> bool {
        self.feed.is_some() && (self.sent_up_to < after || !self.held.is_empty())
    }

    /// The seq after which the next thing held for it is due.
    pub(super) fn next_held(&self) -> Option<u64> {
        self.held.front().map(|(after, _)| *after)
    }

    /// What is held for it that may go now.
    pub(super) fn take_due(&mut self) -> Vec<Held> {
        let mut due = Vec::new();
        while self.held.front().is_some_and(|(after, _)| *after <= self.sent_up_to) {
            if let Some((_, what)) = self.held.pop_front() {
                due.push(what);
            }
        }
        due
    }
}

/// What clients get.
#[derive(Default)]
pub(super) struct Fanout {
    /// Highest seq handed to clients (everything up to it is stored).
    pub(super) released: u64,
    /// Numbered, queued for the writer, not yet committed.
    pub(super) unreleased: VecDeque<(u64, Utf8Bytes)>,
    pub(super) subscribers: Vec<Subscriber>,
    /// Waiting for `released` to reach the seq it was filed under.
    pub(super) deferred: VecDeque<(u64, Deferred)>,
    /// Agent requests waiting for a client to attach.
    pub(super) waiting: Vec<Arc<AgentRequest>>,
    /// Requests asked of every attached client and not settled yet (a permission, a question):
    /// a client that attaches later is asked them too (the phone a push brought here).
    pub(super) open: Vec<std::sync::Weak<AgentRequest>>,
    /// The transcript writer gave up on this session: nothing more is released.
    pub(super) lost: bool,
}

impl Fanout {
    /// Notes a request asked of everyone, for clients that attach later; forgets settled ones.
    pub(super) fn keep_open(&mut self, request: &Arc<AgentRequest>) {
        self.prune_open();
        self.open.push(Arc::downgrade(request));
    }

    /// The requests asked of everyone that are still unanswered.
    pub(super) fn open_requests(&mut self) -> Vec<Arc<AgentRequest>> {
        self.prune_open();
        self.open.iter().filter_map(std::sync::Weak::upgrade).collect()
    }

    fn prune_open(&mut self) {
        self.open.retain(|r| r.upgrade().is_some_and(|r| !r.is_done()));
    }

    /// Offers one released update to every live subscriber; one whose outbox is full becomes
    /// fed, and goes into `fell` (with its new feed's id) for the caller to start its feed.
    /// Drops subscribers whose connection closed.
    pub(super) fn deliver(&mut self, seq: u64, frame: &Utf8Bytes, fell: &mut Vec<(Arc<Client>, u64)>) {
        self.subscribers.retain_mut(|sub| {
            if seq <= sub.sent_up_to || sub.feed.is_some() {
                return !sub.client.is_closed();
            }
            if sub.client.outbox.offer(frame.clone()) {
                sub.sent_up_to = seq;
                crate::infra::metrics::message_out(
                    crate::infra::metrics::Peer::Client,
                    crate::protocol::method::agent::SESSION_UPDATE,
                    1,
                );
                return true;
            }
            if sub.client.is_closed() {
                return false;
            }
            let id = feed_id();
            sub.feed = Some(id);
            fell.push((sub.client.clone(), id));
            metrics::counter!(crate::infra::metrics::CLIENT_CATCH_UPS).increment(1);
            true
        });
    }

    /// Whether what is filed now can go at once (nothing numbered before it is unreleased).
    pub(super) fn caught_up(&self, assigned: u64) -> bool {
        self.released >= assigned && self.deferred.is_empty()
    }

    /// The subscriber fed by `feed`, if it is still attached and fed by it.
    pub(super) fn fed_by(&mut self, feed: u64) -> Option<&mut Subscriber> {
        self.subscribers
            .iter_mut()
            .find(|s| s.feed == Some(feed) && !s.client.is_closed())
    }

    /// The subscriber whose outbox is `to`, if it is attached.
    pub(super) fn subscriber_of(&mut self, to: &Outbox) -> Option<&mut Subscriber> {
        self.subscribers.iter_mut().find(|s| s.client.outbox.same(to))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(queue: usize) -> Arc<Client> {
        let (outbox, rx) = crate::infra::outbox::outbox(queue, 1 << 20);
        std::mem::forget(rx);
        Client::new(Arc::from("c"), Arc::from("u"), None, outbox)
    }

    #[test]
    fn a_full_client_becomes_fed_and_live_updates_pass_it_by() {
        let mut f = Fanout::default();
        let slow = client(2);
        let fast = client(100);
        f.subscribers.push(Subscriber::new(slow.clone(), 0, None));
        f.subscribers.push(Subscriber::new(fast.clone(), 0, None));
        let mut fell = Vec::new();
        for seq in 1..=5 {
            f.deliver(seq, &Utf8Bytes::from(format!("u{seq}")), &mut fell);
        }
        assert_eq!(fell.len(), 1, "the slow client fell behind once");
        assert!(Arc::ptr_eq(&fell[0].0, &slow));
        assert_eq!(f.subscribers[0].sent_up_to, 2, "it was given 1 and 2 live");
        assert_eq!(f.subscribers[0].feed, Some(fell[0].1));
        assert_eq!(f.subscribers[1].sent_up_to, 5);
        assert!(!slow.is_closed(), "falling behind does not close it");
    }

    #[test]
    fn what_follows_updates_a_fed_client_lacks_is_held_in_order() {
        let mut sub = Subscriber::new(client(8), 3, Some(7));
        assert!(sub.must_hold(5));
        sub.held.push_back((5, Held::Frame(Utf8Bytes::from("a"))));
        assert!(sub.must_hold(3), "behind something held");
        sub.held.push_back((6, Held::Frame(Utf8Bytes::from("b"))));
        assert!(sub.take_due().is_empty());
        sub.sent_up_to = 5;
        assert_eq!(sub.take_due().len(), 1);
        sub.sent_up_to = 9;
        assert_eq!(sub.take_due().len(), 1);
        sub.feed = None;
        assert!(!sub.must_hold(12), "a live client gets it at once");
    }
}
