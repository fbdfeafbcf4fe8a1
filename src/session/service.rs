//! The one door to session rows and transcripts: the store, the transcript writer and the
//! sessions in memory together, so their rules are written once.
//!
//! - A session is looked up by owner: an unknown id and another user's id get the same `-32002`.
//! - A session leaves memory only with nothing unstored, so a session loaded from the store
//!   carries the `last_seq` it left with, and numbers continue above every seq ever sent.
//! - Deleting closes the session on its agent first, then removes it and its transcript.
//! - A request that needs the database answers within [`REQUEST_DEADLINE`]: each store call is
//!   bounded ([`crate::store::in_time`]), and so is the whole of a method that waits for the
//!   transcript writer first; a database that does not answer in time gets `-32603`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::list::{self, ListParams};
use super::{Context, LiveSession, Registry, SessionOptions};
use crate::agents::pool::Pools;
use crate::infra::cap::CapReached;
use crate::protocol::RpcError;
use crate::store::cursor::CursorCodec;
use crate::store::{NewSession, SessionRecord, Store, StoreError, in_time};

/// Longest a request waits for the database as a whole (the contract says 5 s).
pub const REQUEST_DEADLINE: Duration = Duration::from_millis(4500);

/// Runs `f`, answering [`StoreError::Timeout`] (`-32603`) if it takes longer than
/// [`REQUEST_DEADLINE`].
async fn within<T>(f: impl std::future::Future<Output = Result<T, RpcError>>) -> Result<T, RpcError> {
    match tokio::time::timeout(REQUEST_DEADLINE, f).await {
        Ok(r) => r,
        Err(_) => Err(StoreError::Timeout(REQUEST_DEADLINE).into()),
    }
}

/// Sessions: stored, being written, and in memory.
#[derive(Debug)]
pub struct Sessions {
    /// The store, the transcript writer, the replicas, the tracker: what the service and every
    /// session in memory share.
    pub(super) context: Arc<Context>,
    /// Sessions in memory.
    pub(super) registry: Arc<Registry>,
    /// Signs `session/list` cursors.
    pub(super) cursors: CursorCodec,
    /// Each user's stored transcript bytes, as last read (see [`Sessions::check_stored_bytes`]).
    usage: parking_lot::Mutex<std::collections::HashMap<Arc<str>, (u64, Instant)>>,
}

/// How long a user's stored byte count is trusted before it is read again: the cap may be
/// overrun by what one user stores in that time.
const USAGE_TTL: Duration = Duration::from_secs(5);

impl Sessions {
    /// The service over `store`, its writer and cursor key.
    pub(crate) fn new(store: Arc<dyn Store>, options: SessionOptions, cursors: CursorCodec) -> Self {
        Self {
            context: Context::new(options, store),
            registry: Arc::default(),
            cursors,
            usage: Default::default(),
        }
    }

    /// Refuses with `stored_bytes` when `user` has `max` bytes of transcript stored or more
    /// (`max` 0: no cap). The count is read from the store at most every [`USAGE_TTL`] per user.
    pub async fn check_stored_bytes(&self, user: &Arc<str>, max: u64) -> Result<(), RpcError> {
        if max == 0 {
            return Ok(());
        }
        let now = Instant::now();
        let cached = self
            .lock_usage()
            .get(user)
            .filter(|(_, at)| now - *at < USAGE_TTL)
            .map(|(n, _)| *n);
        let used = match cached {
            Some(n) => n,
            None => {
                let n = in_time(self.context.store.stored_bytes(user)).await?;
                let mut usage = self.lock_usage();
                if usage.len() >= 4096 {
                    usage.retain(|_, (_, at)| now - *at < USAGE_TTL);
                }
                usage.insert(user.clone(), (n, now));
                n
            }
        };
        if used >= max {
            return Err(CapReached::new("stored_bytes", max).rpc());
        }
        Ok(())
    }

    fn lock_usage(&self) -> parking_lot::MutexGuard<'_, std::collections::HashMap<Arc<str>, (u64, Instant)>> {
        self.usage.lock()
    }

    /// The store (for `/readyz`, replays, tests and benchmarks). A caller a request waits on
    /// bounds each call with [`crate::store::in_time`].
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.context.store
    }

    /// How the transcript writer is doing (for `/readyz`): `Err` says what is wrong.
    pub fn writer_health(&self) -> Result<(), crate::store::persister::WriterTrouble> {
        self.context.persister.health()
    }

    /// Waits until everything queued for the transcript is written, however long that takes
    /// (shutdown bounds it by its grace period; requests use the bounded flush).
    pub async fn flush(&self) {
        let _ = self
            .context
            .persister
            .flush_within(Duration::from_secs(u32::MAX.into()))
            .await;
    }

    /// [`Self::flush`] for a request: at most [`crate::store::persister::FLUSH_TIMEOUT`] (then
    /// [`StoreError::Timeout`]), so that it reads the rows what was just stored advanced.
    pub async fn flush_for_request(&self) -> Result<(), StoreError> {
        self.context.persister.flush().await
    }

    /// Sessions in memory (for metrics).
    pub fn in_memory(&self) -> usize {
        self.registry.len()
    }

    /// Drops sessions nobody uses from memory.
    pub fn sweep(&self) {
        self.registry.sweep();
    }

    /// How many of `user`'s sessions are on a live agent process.
    pub fn live_count(&self, user: &str) -> usize {
        self.registry.live_of(user)
    }

    /// Every session on an agent process of this replica (for admins).
    pub fn all_bound(&self) -> Vec<Arc<LiveSession>> {
        self.registry.all().into_iter().filter(|s| s.is_bound_now()).collect()
    }

    /// Session `id` of any user, if it is in memory (for admins).
    pub fn any_live(&self, id: &str) -> Option<Arc<LiveSession>> {
        self.registry.get(id)
    }

    /// `user`'s session `id` if it is in memory.
    pub fn live(&self, user: &str, id: &str) -> Option<Arc<LiveSession>> {
        self.registry.get(id).filter(|s| &*s.owner == user)
    }

    /// `user`'s session `id`, loaded into memory if needed.
    pub async fn owned(&self, user: &str, id: &str) -> Result<Arc<LiveSession>, RpcError> {
        if let Some(s) = self.live(user, id) {
            return Ok(s);
        }
        let record = in_time(self.context.store.get_session(user, id))
            .await?
            .ok_or_else(RpcError::session_not_found)?;
        let session = self.registry.insert(LiveSession::from_record(&record, &self.context));
        if *session.owner != *user {
            return Err(RpcError::session_not_found());
        }
        Ok(session)
    }

    /// Stores a new session and puts it in memory.
    pub async fn create(&self, record: &SessionRecord) -> Result<Arc<LiveSession>, RpcError> {
        in_time(self.context.store.create_session(&NewSession {
            id: &record.id,
            owner: &record.owner,
            agent: &record.agent,
            agent_session_id: record.agent_session_id.as_deref(),
            cwd: &record.cwd,
            additional_dirs: &record.additional_dirs,
            meta: &record.meta,
            now: record.created_at,
        }))
        .await?;
        Ok(self.registry.insert(LiveSession::from_record(record, &self.context)))
    }

    /// Forgets a session that was created and then refused (nothing was published to it).
    pub async fn discard(&self, user: &str, id: &str) {
        self.registry.remove(id);
        if let Err(e) = in_time(self.context.store.delete_session(user, id)).await {
            tracing::error!(session = %id, error = %e, "cannot remove a refused session");
        }
    }

    /// Ends `session`'s binding and, if the agent supports it, closes it there.
    pub async fn close_on_agent(&self, session: &LiveSession, pools: &Pools) {
        let Some(b) = session.take_binding() else { return };
        let Some(pool) = pools.get(&session.agent) else { return };
        // Its own process's answer: that is the agent the session lives on.
        if b.process
            .info()
            .or_else(|| pool.cached_info())
            .is_some_and(|i| i.can_close())
        {
            let params = serde_json::json!({ "sessionId": &*b.agent_session_id }).to_string();
            if let Err(e) = b
                .process
                .request("session/close", &params, pool.request_timeout())
                .await
            {
                tracing::warn!(session = %session.id, error = %e, "agent did not close the session cleanly");
            }
        }
    }

    /// Deletes `user`'s session `id`: closes it on its agent, forgets it, removes it and its
    /// transcript from the store. Unknown and foreign ids get `-32002`.
    pub async fn delete(&self, user: &str, id: &str, pools: &Pools) -> Result<(), RpcError> {
        if let Some(s) = self.live(user, id) {
            self.close_on_agent(&s, pools).await;
            self.registry.remove(id);
        }
        // Nothing of it may still be on its way to the store once it is gone.
        let deleted = within(async {
            self.context.persister.flush().await?;
            Ok(in_time(self.context.store.delete_session(user, id)).await?)
        })
        .await?;
        if deleted {
            // What the deleted transcript held no longer counts against the user's cap.
            self.lock_usage().remove(user);
            tracing::info!(user, session = id, "session deleted");
            Ok(())
        } else {
            Err(RpcError::session_not_found())
        }
    }

    /// Archives (`true`) or restores `user`'s session `id`; `-32002` for unknown and foreign ids.
    pub async fn set_archived(&self, user: &str, id: &str, archived: bool) -> Result<(), RpcError> {
        let at = archived.then(crate::store::now_micros);
        if within(async { Ok(in_time(self.context.store.set_archived(user, id, at)).await?) }).await? {
            Ok(())
        } else {
            Err(RpcError::session_not_found())
        }
    }

    /// Retention deleted `user`'s session `id`: what it held no longer counts against their cap.
    pub fn forget_stored(&self, user: &str, id: &str) {
        self.lock_usage().remove(user);
        tracing::info!(user, session = id, "session deleted by retention");
    }

    /// `user`'s session `id` as stored, with everything already on its way to the store (its
    /// title, counts, updates); `-32002` for unknown and foreign ids alike.
    pub async fn stored(&self, user: &str, id: &str) -> Result<SessionRecord, RpcError> {
        within(async {
            self.context.persister.flush().await?;
            Ok(in_time(self.context.store.get_session(user, id)).await?)
        })
        .await?
        .ok_or_else(RpcError::session_not_found)
    }

    /// `session/list` for `user`, `params` raw JSON.
    pub async fn list_raw(&self, user: &str, params: &str) -> Result<Value, RpcError> {
        within(list::list_sessions(self, user, params)).await
    }

    /// `session/list` for `user` (`GET /api/sessions`).
    pub async fn list(&self, user: &str, params: ListParams) -> Result<Value, RpcError> {
        within(list::list(self, user, params)).await
    }
}
