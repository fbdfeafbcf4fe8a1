//! [`Bounded`]: a store whose calls on a request's path answer in time.

use std::sync::Arc;

use async_trait::async_trait;

use super::*;

/// A [`Store`] whose calls on a request's path answer within `limit`: a database that does not
/// answer gets [`StoreError::Timeout`], so clients hear `-32603` instead of waiting. Transcript
/// writes are not bounded here: a write given up on might still commit, and the writer retries.
#[derive(Debug)]
pub struct Bounded {
    inner: Arc<dyn Store>,
    limit: std::time::Duration,
}

impl Bounded {
    /// `inner`, each read and session change bounded by `limit`.
    pub fn new(inner: Arc<dyn Store>, limit: std::time::Duration) -> Self {
        Self { inner, limit }
    }

    async fn within<T>(&self, f: impl std::future::Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
        tokio::time::timeout(self.limit, f)
            .await
            .unwrap_or(Err(StoreError::Timeout(self.limit)))
    }
}

#[async_trait]
impl Store for Bounded {
    async fn ping(&self) -> Result<(), StoreError> {
        self.within(self.inner.ping()).await
    }
    async fn create_session(&self, s: &NewSession<'_>) -> Result<(), StoreError> {
        self.within(self.inner.create_session(s)).await
    }
    async fn get_session(&self, owner: &str, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        self.within(self.inner.get_session(owner, id)).await
    }
    async fn list_sessions(
        &self,
        owner: &str,
        filter: &ListFilter,
        after: Option<Position<'_>>,
        limit: u32,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        self.within(self.inner.list_sessions(owner, filter, after, limit)).await
    }
    async fn delete_session(&self, owner: &str, id: &str) -> Result<bool, StoreError> {
        self.within(self.inner.delete_session(owner, id)).await
    }
    async fn write_batch(&self, writes: &[SessionWrite]) -> Result<(), StoreError> {
        self.inner.write_batch(writes).await
    }
    async fn write_batch_leased(&self, writes: &[SessionWrite], holder: &str) -> Result<Vec<Arc<str>>, StoreError> {
        self.inner.write_batch_leased(writes, holder).await
    }
    async fn write_chunks_unsettled(
        &self,
        writes: &[SessionWrite],
        holder: Option<&str>,
    ) -> Result<super::ChunksStored, StoreError> {
        self.inner.write_chunks_unsettled(writes, holder).await
    }
    async fn settle_sessions(&self, sessions: &[Arc<str>]) -> Result<(), StoreError> {
        self.inner.settle_sessions(sessions).await
    }
    async fn read_events(
        &self,
        owner: &str,
        id: &str,
        after_seq: i64,
        max_chunks: u32,
    ) -> Result<Vec<EventChunk>, StoreError> {
        self.within(self.inner.read_events(owner, id, after_seq, max_chunks))
            .await
    }
    async fn cursor_key(&self) -> Result<Vec<u8>, StoreError> {
        self.within(self.inner.cursor_key()).await
    }
    async fn set_archived(&self, owner: &str, id: &str, at: Option<i64>) -> Result<bool, StoreError> {
        self.within(self.inner.set_archived(owner, id, at)).await
    }
    async fn stale_sessions(
        &self,
        before: i64,
        after: Option<(i64, &str)>,
        limit: i64,
    ) -> Result<Vec<StaleSession>, StoreError> {
        self.within(self.inner.stale_sessions(before, after, limit)).await
    }
    async fn delete_stale(&self, sessions: &[StaleSession], before: i64) -> Result<Vec<StaleSession>, StoreError> {
        self.within(self.inner.delete_stale(sessions, before)).await
    }
    async fn stored_bytes(&self, owner: &str) -> Result<u64, StoreError> {
        self.within(self.inner.stored_bytes(owner)).await
    }
    async fn session_controls(&self, owner: &str, id: &str) -> Result<Option<String>, StoreError> {
        self.within(self.inner.session_controls(owner, id)).await
    }
    async fn users_overview(&self, limit: i64) -> Result<Vec<UserOverview>, StoreError> {
        self.within(self.inner.users_overview(limit)).await
    }
}
