//! Sessions another replica serves: what this replica's clients of them get from the store,
//! and handing a session over between replicas.

use std::sync::atomic::Ordering;

use axum::extract::ws::Utf8Bytes;

use super::LiveSession;
use super::fanout::Deferred;
use crate::protocol::{self, RpcError};
use crate::store::Store;
use crate::store::{READ_PAGE_CHUNKS, in_time};

/// What a session knows of updates another replica committed (several replicas sharing the
/// database): the highest seq announced, and one catch-up at a time.
#[derive(Debug)]
pub(super) struct Following {
    /// One read of updates another replica committed at a time.
    running: tokio::sync::Mutex<()>,
    /// Highest seq another replica said it committed.
    committed_elsewhere: std::sync::atomic::AtomicU64,
    /// Whether a catch-up task is under way or due (notices that arrive meanwhile join it).
    due: std::sync::atomic::AtomicBool,
}

impl Following {
    /// Nothing announced past `last_seq`.
    pub(super) fn new(last_seq: u64) -> Self {
        Self {
            running: tokio::sync::Mutex::new(()),
            committed_elsewhere: std::sync::atomic::AtomicU64::new(last_seq),
            due: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl LiveSession {
    /// Highest seq handed to clients.
    pub fn released(&self) -> u64 {
        self.fanout().released
    }

    /// Another replica committed updates up to `seq`: whether a catch-up should start now (one
    /// is not already under way; it will see `seq` too).
    pub fn committed_elsewhere(&self, seq: u64) -> bool {
        self.follow.committed_elsewhere.fetch_max(seq, Ordering::AcqRel);
        if self.fanout().released >= seq {
            return false;
        }
        !self.follow.due.swap(true, Ordering::AcqRel)
    }

    /// Reads what another replica committed after what was released here, and hands it to the
    /// clients in order (each subscriber's `sent_up_to` keeps it exactly once), then what waits
    /// on it. Does nothing while this replica itself has updates of the session on their way
    /// to the store (it serves the session: its own commits release them).
    pub async fn catch_up(&self, store: &dyn Store) {
        loop {
            self.follow.due.store(false, Ordering::Release);
            {
                let _one = self.follow.running.lock().await;
                loop {
                    let from = {
                        let f = self.fanout();
                        if !f.unreleased.is_empty() || f.lost {
                            return;
                        }
                        f.released
                    };
                    let chunks = match in_time(store.read_events(&self.owner, &self.id, from as i64, READ_PAGE_CHUNKS))
                        .await
                    {
                        Ok(chunks) => chunks,
                        Err(e) => {
                            tracing::warn!(session = %self.id, error = %e, "cannot read updates committed by another replica");
                            return;
                        }
                    };
                    if chunks.is_empty() {
                        break;
                    }
                    let mut due = Vec::new();
                    let mut fell = Vec::new();
                    {
                        let mut f = self.fanout();
                        if !f.unreleased.is_empty() {
                            return;
                        }
                        for chunk in &chunks {
                            for (seq, update) in chunk.updates() {
                                if seq <= f.released {
                                    continue;
                                }
                                let frame = Utf8Bytes::from(protocol::session_update_raw_id(
                                    &self.seq.id_json,
                                    update,
                                    seq,
                                    None,
                                ));
                                f.released = seq;
                                f.deliver(seq, &frame, &mut fell);
                            }
                        }
                        self.seq.assigned.fetch_max(f.released, Ordering::AcqRel);
                        while f.deferred.front().is_some_and(|(after, _)| *after <= f.released) {
                            if let Some(what) = f.deferred.pop_front() {
                                due.push(what);
                            }
                        }
                    }
                    self.start_feeds(fell);
                    for (after, what) in due {
                        self.run(after, what);
                    }
                }
            }
            let want = self.follow.committed_elsewhere.load(Ordering::Acquire);
            if self.fanout().released >= want || self.follow.due.swap(true, Ordering::AcqRel) {
                return;
            }
        }
    }

    /// This replica has just taken the session's lease: numbering continues above whatever the
    /// previous holder committed (read from the store and handed to clients first).
    pub async fn take_over(&self, store: &dyn Store) {
        self.catch_up(store).await;
        let released = self.fanout().released;
        self.seq.assigned.fetch_max(released, Ordering::AcqRel);
    }

    /// This replica no longer serves the session (another one holds its lease): it leaves its
    /// agent process, its unstored updates are dropped (never shown), and what waited on them
    /// is answered with an error. Its clients stay, fed from the store like any other replica's.
    pub fn leave(&self) {
        let failed: Vec<Deferred> = {
            let mut f = self.fanout();
            f.unreleased.clear();
            self.seq.assigned.store(f.released, Ordering::Release);
            f.deferred.drain(..).map(|(_, what)| what).collect()
        };
        self.take_binding();
        tracing::warn!(session = %self.id, "session now served by another replica; left its agent process here");
        for what in failed {
            match what {
                Deferred::Respond(to, id, _) => {
                    let e = RpcError::internal("this session moved to another gateway replica; send the request again");
                    to.push(Utf8Bytes::from(protocol::error(Some(id.get()), &e)));
                }
                Deferred::Ask(request) => {
                    self.ctx.handle.spawn(async move { request.give_up().await });
                }
                Deferred::TellQueue => self.tell_queue_if_watched(),
            }
        }
    }
}
