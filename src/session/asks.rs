//! Agent requests asked across replicas (docs/replicas.md): the serving replica
//! publishes its agent's request to the replicas with clients of the session
//! (`session_watchers`, through `replica_messages`); each asks its own clients under their own
//! ids; the first answer anywhere comes back and settles it; every other replica asked is told,
//! and tells its clients `$/cancel_request`. The deadline stays with the serving replica.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use serde_json::value::RawValue;
use tokio_util::task::TaskTracker;

use super::replicas::{Note, Replicas};
use super::requests::AgentRequest;

/// Other replicas' requests asked here, by (asking replica, its number).
type Proxies = HashMap<(Arc<str>, u64), Weak<AgentRequest>>;

/// This replica's side of requests asked across replicas.
#[derive(Debug)]
pub struct Asks {
    /// The bus.
    replica: Arc<dyn Replicas>,
    /// Where sending on the bus runs, so shutdown waits for it.
    tracker: TaskTracker,
    /// Next number for a published request.
    next_key: AtomicU64,
    /// This replica's agents' requests published to other replicas, by number.
    published: Mutex<HashMap<u64, Published>>,
    /// Other replicas' requests asked of clients here, by (asking replica, its number).
    proxies: Mutex<Proxies>,
}

/// One published request.
#[derive(Debug)]
struct Published {
    /// Weak: the request's own deadline ends it.
    request: Weak<AgentRequest>,
    /// Its session.
    session: Arc<str>,
    /// What the ask follows.
    after_seq: u64,
    /// Replicas asked (they hear when it is settled).
    asked: Vec<String>,
}

impl Asks {
    /// Requests across replicas over `replica`'s bus; its messages are sent by tasks of `tracker`.
    pub fn new(replica: Arc<dyn Replicas>, tracker: TaskTracker) -> Arc<Self> {
        Arc::new(Self {
            replica,
            tracker,
            next_key: AtomicU64::new(1),
            published: Mutex::new(HashMap::new()),
            proxies: Mutex::new(HashMap::new()),
        })
    }

    fn published(&self) -> parking_lot::MutexGuard<'_, HashMap<u64, Published>> {
        self.published.lock()
    }

    fn proxies(&self) -> parking_lot::MutexGuard<'_, Proxies> {
        self.proxies.lock()
    }

    /// Publishes this replica's agent's `request` of `session` (once) to the other replicas
    /// watching it: a permission request to all of them, anything else to the one whose client
    /// attached last, and only when no client here was asked.
    pub(crate) fn publish(
        self: &Arc<Self>,
        session: &Arc<str>,
        request: &Arc<AgentRequest>,
        after_seq: u64,
        asked_here: bool,
    ) {
        if !request.asks_everyone() && asked_here {
            return;
        }
        let key = self.next_key.fetch_add(1, Ordering::Relaxed);
        if !request.mark_published(self, key) {
            return;
        }
        self.published().insert(
            key,
            Published {
                request: Arc::downgrade(request),
                session: session.clone(),
                after_seq,
                asked: Vec::new(),
            },
        );
        let me = self.clone();
        let session = session.clone();
        let everyone = request.asks_everyone();
        self.tracker.spawn(async move {
            let watchers = match me.replica.watchers(&session).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(session = %session, error = %e, "cannot read which replicas watch the session");
                    return;
                }
            };
            let take = if everyone { watchers.len() } else { 1 };
            for target in watchers.into_iter().take(take) {
                me.ask_replica(key, &target).await;
            }
        });
    }

    /// Sends published request `key` to replica `target` (unless it is settled or was sent
    /// there already).
    async fn ask_replica(&self, key: u64, target: &str) {
        let message = {
            let mut published = self.published();
            let Some(p) = published.get_mut(&key) else { return };
            let Some(request) = p.request.upgrade().filter(|r| !r.is_done()) else {
                return;
            };
            if p.asked.iter().any(|a| a == target) {
                return;
            }
            p.asked.push(target.to_string());
            Note::Ask {
                key,
                session: p.session.to_string(),
                method: request.method().to_string(),
                params: request.params().to_string(),
                after_seq: p.after_seq,
            }
        };
        if let Err(e) = self.replica.tell(target, message).await {
            tracing::warn!(replica = target, error = %e, "cannot pass an agent request to another replica");
            return;
        }
        // Settled while this was on its way: its `Settled` may have gone first.
        if !self.published().contains_key(&key) {
            let _ = self.replica.tell(target, Note::Settled { key }).await;
        }
    }

    /// Replica `from` has clients of `session` now: it is asked what this replica's agents still
    /// wait on for it (a permission request, or another request nobody was asked yet).
    pub fn watching(self: &Arc<Self>, from: &str, session: &str) {
        let keys: Vec<u64> = self
            .published()
            .iter()
            .filter(|(_, p)| {
                *p.session == *session
                    && p.request
                        .upgrade()
                        .is_some_and(|r| !r.is_done() && (r.asks_everyone() || p.asked.is_empty()))
            })
            .map(|(k, _)| *k)
            .collect();
        if keys.is_empty() {
            return;
        }
        let me = self.clone();
        let from = from.to_string();
        self.tracker.spawn(async move {
            for key in keys {
                me.ask_replica(key, &from).await;
            }
        });
    }

    /// A client of replica `from` answered published request `key` first.
    pub fn answered(self: &Arc<Self>, from: &str, key: u64, result: Option<&RawValue>, error: Option<&RawValue>) {
        let request = self.published().get(&key).and_then(|p| p.request.upgrade());
        if let Some(request) = request {
            let (result, error) = (result.map(ToOwned::to_owned), error.map(ToOwned::to_owned));
            let from = from.to_string();
            self.tracker
                .spawn(async move { request.answer_remote(&from, result.as_deref(), error.as_deref()).await });
        }
    }

    /// Published request `key` is settled here: the replicas asked (but `except`) are told.
    pub(crate) fn unpublish(self: &Arc<Self>, key: u64, except: Option<&str>) {
        let Some(p) = self.published().remove(&key) else { return };
        let targets: Vec<String> = p.asked.into_iter().filter(|a| Some(a.as_str()) != except).collect();
        if targets.is_empty() {
            return;
        }
        let me = self.clone();
        self.tracker.spawn(async move {
            for target in targets {
                if let Err(e) = me.replica.tell(&target, Note::Settled { key }).await {
                    tracing::warn!(replica = %target, error = %e, "cannot tell another replica an agent request is settled");
                }
            }
        });
    }

    /// Notes a request of replica `from` asked of clients here.
    pub(crate) fn adopt(&self, from: Arc<str>, key: u64, request: &Arc<AgentRequest>) {
        let mut proxies = self.proxies();
        proxies.retain(|_, r| r.upgrade().is_some_and(|r| !r.is_done()));
        proxies.insert((from, key), Arc::downgrade(request));
    }

    /// Replica `from`'s request `key` is settled: clients here are told.
    pub fn settled(&self, from: &str, key: u64) {
        let request = self.proxies().remove(&(Arc::from(from), key)).and_then(|r| r.upgrade());
        if let Some(request) = request {
            request.settled_elsewhere();
        }
    }

    /// A client here answered replica `to`'s request `key` first: the answer goes back.
    pub(crate) async fn answer_to(&self, to: &str, key: u64, result: Option<&RawValue>, error: Option<&RawValue>) {
        self.proxies().remove(&(Arc::from(to), key));
        let note = Note::Answered {
            key,
            result: result.map(|r| r.get().to_string()),
            error: error.map(|e| e.get().to_string()),
        };
        if let Err(e) = self.replica.tell(to, note).await {
            tracing::warn!(replica = to, error = %e, "cannot send a client's answer to the replica that asked");
        }
    }
}
