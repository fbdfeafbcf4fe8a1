//! A session's clients: attaching (with a replay of the stored transcript), feeding a client
//! that fell behind from the store until it has caught up, and what must follow updates (an
//! agent's answer to a client, an agent's request) reaching each client right after them.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::Utf8Bytes;
use serde_json::value::RawValue;

use super::LiveSession;
use super::fanout::{Deferred, Held, Subscriber, feed_id};
use crate::infra::outbox::{CLOSE_TOO_SLOW, Outbox};
use crate::protocol::method::agent;
use crate::protocol::{self, RpcError};
use crate::session::client::Client;
use crate::session::requests::AgentRequest;
use crate::store::Store;
use crate::store::{READ_PAGE_CHUNKS, in_time};

/// How long a feed waits for released updates to show in a read of the store before it gives
/// up (they are committed before they are released, so this is a database that lies).
const FEED_MISSING_WAIT: Duration = Duration::from_secs(2);

/// Most frames a feed queues in one go.
const FEED_RUN_FRAMES: usize = 512;

/// How a client attaches ([`LiveSession::attach_as`]).
#[derive(Debug, Clone, Copy)]
pub struct Attach {
    /// Feed it the stored transcript first.
    pub replay: bool,
    /// From after this seq.
    pub after_seq: u64,
    /// It only observes: never asked the agent's requests.
    pub observer: bool,
    /// Ask it the requests already open (a permission nobody answered yet).
    pub ask_open: bool,
}

/// Why a feed stopped.
enum FeedEnd {
    /// The client left, or was given another feed (a new `session/load`).
    Gone,
    /// The store could not be read.
    Store(RpcError),
}

impl LiveSession {
    /// Attaches `client` to live updates; with `replay`, first feeds it the stored transcript
    /// after `after_seq` (at the client's own pace), with nothing missed and nothing repeated in
    /// between. Agent requests waiting for a client are then asked of it.
    pub async fn attach(
        self: &Arc<Self>,
        client: &Arc<Client>,
        store: &dyn Store,
        replay: bool,
        after_seq: u64,
    ) -> Result<(), RpcError> {
        let how = Attach {
            replay,
            after_seq,
            observer: false,
            ask_open: true,
        };
        self.attach_as(client, store, how).await
    }

    /// [`LiveSession::attach`], as `how` says: an observer is never asked the agent's requests;
    /// without `ask_open`, requests already open are not asked of it (only later ones).
    pub async fn attach_as(
        self: &Arc<Self>,
        client: &Arc<Client>,
        store: &dyn Store,
        how: Attach,
    ) -> Result<(), RpcError> {
        let Attach {
            replay,
            after_seq,
            observer,
            ask_open,
        } = how;
        let feed = replay.then(feed_id);
        {
            let mut f = self.fanout();
            // A client that loads again starts its replay over (its old feed, if any, stops).
            let reloading = |s: &Subscriber| replay && Arc::ptr_eq(&s.client, client);
            f.subscribers.retain(|s| !s.client.is_closed() && !reloading(s));
            match f.subscribers.iter_mut().find(|s| Arc::ptr_eq(&s.client, client)) {
                Some(present) => present.observer = observer,
                None => {
                    let sent_up_to = if replay { after_seq } else { f.released };
                    let mut sub = Subscriber::new(client.clone(), sent_up_to, feed);
                    sub.observer = observer;
                    f.subscribers.push(sub);
                }
            }
        }
        if let Some(feed) = feed {
            let started = std::time::Instant::now();
            match self.feed(client, feed, store).await {
                Ok(()) => {
                    metrics::histogram!(crate::infra::metrics::REPLAY_SECONDS)
                        .record(crate::infra::metrics::seconds_since(started));
                }
                Err(end) => {
                    self.detach(client);
                    return Err(match end {
                        FeedEnd::Gone => RpcError::internal("client went away during replay"),
                        FeedEnd::Store(e) => e,
                    });
                }
            }
        }
        let (waiting, open) = {
            let mut f = self.fanout();
            (std::mem::take(&mut f.waiting), f.open_requests())
        };
        for request in waiting {
            self.dispatch_agent_request(request);
        }
        // What every client is asked and nobody has answered yet is asked of this one too.
        if !observer && ask_open {
            for request in open {
                if !request.was_asked(client) {
                    request.ask(std::slice::from_ref(client));
                }
            }
        }
        Ok(())
    }

    /// Sends `frame`, a notification of `method`, to every client attached now (outside the
    /// transcript: a notice, not an update), counted under `method`; how many got it.
    pub fn tell_clients(&self, method: &'static str, frame: &Utf8Bytes) -> usize {
        let told = self
            .fanout()
            .subscribers
            .iter()
            .filter(|s| !s.client.is_closed())
            .filter(|s| s.client.outbox.push(frame.clone()))
            .count();
        crate::infra::metrics::message_out(crate::infra::metrics::Peer::Client, method, told as u64);
        told
    }

    /// How many clients are attached now.
    pub fn clients_attached(&self) -> usize {
        self.fanout()
            .subscribers
            .iter()
            .filter(|s| !s.client.is_closed())
            .count()
    }

    /// Stops sending updates to `client`.
    pub fn detach(&self, client: &Client) {
        self.fanout()
            .subscribers
            .retain(|s| !std::ptr::eq(&*s.client, client) && !s.client.is_closed());
    }

    /// Starts the feeds of clients that just fell behind (each reads the store on its own task,
    /// tracked with the gateway's tasks). A session being dropped closes such a client with
    /// `1013`, and it resumes with `afterSeq`.
    pub(super) fn start_feeds(&self, fell: Vec<(Arc<Client>, u64)>) {
        let Some(me) = self.me.upgrade() else {
            for (client, _) in fell {
                client
                    .outbox
                    .close(CLOSE_TOO_SLOW, "client too slow; reconnect and resume with afterSeq");
            }
            return;
        };
        for (client, feed) in fell {
            tracing::debug!(session = %self.id, connection = %client.id, "client fell behind; feeding it from the store");
            let (me, store) = (me.clone(), self.ctx.store.clone());
            self.ctx.tracker.spawn_on(
                async move {
                if let Err(FeedEnd::Store(e)) = me.feed(&client, feed, &*store).await {
                    tracing::warn!(session = %me.id, connection = %client.id, error = %e.message, "cannot feed a client that fell behind; closing it (it resumes with afterSeq)");
                    client
                        .outbox
                        .close(CLOSE_TOO_SLOW, "cannot read the transcript now; resume with afterSeq");
                }
            },
                &self.ctx.handle,
            );
        }
    }

    /// Gives the subscriber fed by `feed` the stored transcript after what it was given, each
    /// update once and in order, at the pace its outbox takes them, with what is held for it
    /// right after the update it follows; once it has everything released, it is live again.
    async fn feed(&self, client: &Arc<Client>, feed: u64, store: &dyn Store) -> Result<(), FeedEnd> {
        let mut missing_since: Option<std::time::Instant> = None;
        loop {
            let (from, due) = {
                let mut f = self.fanout();
                let released = f.released;
                let Some(sub) = f.fed_by(feed) else {
                    return Err(FeedEnd::Gone);
                };
                let due = sub.take_due();
                if due.is_empty() && sub.held.is_empty() && sub.sent_up_to >= released {
                    // Under the lock: the next release finds it live, so nothing is missed.
                    sub.feed = None;
                    return Ok(());
                }
                (sub.sent_up_to, due)
            };
            if !due.is_empty() {
                for what in due {
                    give(client, what);
                }
                continue;
            }
            let chunks = in_time(store.read_events(&self.owner, &self.id, from as i64, READ_PAGE_CHUNKS))
                .await
                .map_err(|e| {
                    tracing::error!(session = %self.id, error = %e, "cannot read transcript");
                    FeedEnd::Store(RpcError::internal("cannot read the session transcript"))
                })?;
            // The page's updates go out in runs, several frames per wait for room (so the writer
            // takes them in one go); a run ends where something held for the client is due.
            let mut hold_at = self.next_held(feed)?;
            let mut cursor = from;
            let mut run = Vec::new();
            for chunk in chunks {
                for (seq, update) in chunk.updates() {
                    if seq <= cursor {
                        continue;
                    }
                    run.push(Utf8Bytes::from(protocol::session_update_raw_id(
                        &self.seq.id_json,
                        update,
                        seq,
                        None,
                    )));
                    cursor = seq;
                    if hold_at.is_some_and(|at| seq >= at) || run.len() >= FEED_RUN_FRAMES {
                        hold_at = self.give_run(client, feed, &mut run, cursor).await?;
                    }
                }
            }
            if !run.is_empty() {
                self.give_run(client, feed, &mut run, cursor).await?;
            }
            crate::infra::metrics::message_out(
                crate::infra::metrics::Peer::Client,
                agent::SESSION_UPDATE,
                cursor - from,
            );
            if cursor > from {
                missing_since = None;
            } else {
                // Released updates are committed: a read that lacks them is a store that has
                // not caught up yet (a replica, a lagging snapshot). Bounded, then it gives up.
                let since = *missing_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() > FEED_MISSING_WAIT {
                    return Err(FeedEnd::Store(RpcError::internal(
                        "the session's stored transcript lacks updates already released",
                    )));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    /// The seq after which the next thing held for the subscriber of `feed` is due.
    fn next_held(&self, feed: u64) -> Result<Option<u64>, FeedEnd> {
        let mut f = self.fanout();
        let sub = f.fed_by(feed).ok_or(FeedEnd::Gone)?;
        Ok(sub.next_held())
    }

    /// Queues `run` (updates up to `last`) for the subscriber of `feed`, notes how far it has
    /// been given the transcript, and sends what is held for it that is now due; the seq after
    /// which the next held thing is due.
    async fn give_run(
        &self,
        client: &Arc<Client>,
        feed: u64,
        run: &mut Vec<Utf8Bytes>,
        last: u64,
    ) -> Result<Option<u64>, FeedEnd> {
        if !client.outbox.send_all(run).await {
            return Err(FeedEnd::Gone);
        }
        run.clear();
        let (due, next) = {
            let mut f = self.fanout();
            let sub = f.fed_by(feed).ok_or(FeedEnd::Gone)?;
            sub.sent_up_to = last;
            (sub.take_due(), sub.next_held())
        };
        for what in due {
            give(client, what);
        }
        Ok(next)
    }

    /// Asks an agent request of the attached clients (a permission request of all of them,
    /// anything else of the newest), or keeps it until one attaches. A client being fed gets it
    /// after the updates released before it. With several replicas, this replica's agent's
    /// request is also published to the others with clients of the session.
    pub(crate) fn dispatch_agent_request(&self, request: Arc<AgentRequest>) {
        if request.is_done() {
            return;
        }
        let (now, released, targeted) = {
            let mut f = self.fanout();
            f.subscribers.retain(|s| !s.client.is_closed());
            let released = f.released;
            let mut now = Vec::new();
            // Observers are never asked: a request waits for a client that may answer it.
            let newest = f.subscribers.iter().rposition(|s| !s.observer);
            let targeted = newest.is_some();
            if let Some(newest) = newest {
                let everyone = request.asks_everyone();
                if everyone {
                    f.keep_open(&request);
                }
                for (i, sub) in f.subscribers.iter_mut().enumerate() {
                    if sub.observer || (!everyone && i != newest) {
                        continue;
                    }
                    if sub.must_hold(released) {
                        let out_id = request.assign(&sub.client);
                        sub.held.push_back((released, Held::Ask(request.clone(), out_id)));
                    } else {
                        now.push(sub.client.clone());
                    }
                }
            } else {
                f.waiting.push(request.clone());
            }
            (now, released, targeted)
        };
        if let Some(asks) = &self.ctx.asks {
            asks.publish(&self.id, &request, released, targeted);
        }
        request.ask(&now);
    }

    /// Another replica's agent request: asked here once the updates up to `after_seq` (which
    /// it followed there) have been handed to clients here.
    pub(crate) fn ask_after(&self, after_seq: u64, request: Arc<AgentRequest>) {
        let mut f = self.fanout();
        if f.released >= after_seq {
            drop(f);
            self.dispatch_agent_request(request);
        } else {
            let at = f.deferred.partition_point(|(s, _)| *s <= after_seq);
            f.deferred.insert(at, (after_seq, Deferred::Ask(request)));
        }
    }

    /// The answer to a client's request that another replica served: `frame` for `to`, once the
    /// updates up to `after_seq` have been handed to clients here.
    pub fn respond_after(&self, after_seq: u64, to: &Outbox, client_id: &RawValue, frame: Utf8Bytes) {
        let what = Deferred::Respond(to.clone(), client_id.to_owned(), frame);
        let mut f = self.fanout();
        if f.released >= after_seq {
            drop(f);
            self.run(after_seq, what);
        } else {
            let at = f.deferred.partition_point(|(s, _)| *s <= after_seq);
            f.deferred.insert(at, (after_seq, what));
        }
    }

    /// Forgets a settled request that was waiting for a client.
    pub(crate) fn forget_waiting(&self, request: &AgentRequest) {
        self.fanout().waiting.retain(|w| !std::ptr::eq(&**w, request));
    }

    /// Files `what` to go once every update numbered so far is released (at once if it is).
    pub(super) fn after_released(&self, what: Deferred) {
        let assigned = self.seq.assigned.load(std::sync::atomic::Ordering::Acquire);
        let mut f = self.fanout();
        if f.lost {
            drop(f);
            self.fail(what);
        } else if f.caught_up(assigned) {
            drop(f);
            self.run(assigned, what);
        } else {
            f.deferred.push_back((assigned, what));
        }
    }

    /// Sends what waited for the updates up to `after` to be released: an answer goes to its
    /// client at once, or (a client being fed that has not been given those updates yet) is
    /// held for it.
    pub(super) fn run(&self, after: u64, what: Deferred) {
        match what {
            Deferred::Respond(to, _, frame) => {
                {
                    let mut f = self.fanout();
                    if let Some(sub) = f.subscriber_of(&to)
                        && sub.must_hold(after)
                    {
                        sub.held.push_back((after, Held::Frame(frame)));
                        return;
                    }
                }
                to.push(frame);
            }
            Deferred::Ask(request) => self.dispatch_agent_request(request),
            Deferred::TellQueue => self.tell_queue_if_watched(),
        }
    }

    /// What is filed behind updates that will never be released: an answer becomes an error
    /// under its request's id; an agent's request is given up on (the agent hears `cancelled`).
    pub(super) fn fail(&self, what: Deferred) {
        match what {
            Deferred::Respond(to, id, _) => {
                to.push(Utf8Bytes::from(protocol::error(Some(id.get()), &Self::lost_error())));
            }
            Deferred::Ask(request) => {
                self.ctx.handle.spawn(async move { request.give_up().await });
            }
            Deferred::TellQueue => self.tell_queue_if_watched(),
        }
    }
}

/// Sends what was held for `client`.
fn give(client: &Arc<Client>, what: Held) {
    match what {
        Held::Frame(frame) => {
            client.outbox.push(frame);
        }
        Held::Ask(request, out_id) => request.send_to(client, out_id),
    }
}

impl LiveSession {
    /// Pushes `event` to the owner's devices, unless a tab of theirs shows this session (a
    /// teammate's tab, shown a shared session, does not count).
    pub fn push_if_unwatched(&self, event: crate::session::Attention, asked: Option<String>) {
        let Some(push) = &self.ctx.push else { return };
        let watched = self
            .fanout()
            .subscribers
            .iter()
            .any(|s| !s.client.is_closed() && s.client.user == self.owner && s.client.shows(&self.id));
        if !watched {
            push.clone().notify(&self.owner, &self.id, event, asked);
        }
    }

    /// An agent's request that the owner may have to answer from their phone: a permission (what
    /// it is for: the tool call's title) or a form (its message).
    pub(super) fn push_request(&self, method: &str, params: &str) {
        let (event, pointer) = match method {
            agent::REQUEST_PERMISSION => (crate::session::Attention::Permission, "/toolCall/title"),
            agent::ELICITATION => (crate::session::Attention::Elicitation, "/message"),
            _ => return,
        };
        let asked = serde_json::from_str::<serde_json::Value>(params).ok().and_then(|p| {
            p.pointer(pointer)
                .and_then(serde_json::Value::as_str)
                .map(str::to_string)
        });
        self.push_if_unwatched(event, asked);
    }
}
