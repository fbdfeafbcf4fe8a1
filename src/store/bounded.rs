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
    async fn put_secrets(&self, owner: &str, secrets: &[StoredSecret]) -> Result<(), StoreError> {
        self.within(self.inner.put_secrets(owner, secrets)).await
    }
    async fn secrets(&self, owner: &str, agent: Option<&str>) -> Result<Vec<StoredSecret>, StoreError> {
        self.within(self.inner.secrets(owner, agent)).await
    }
    async fn delete_secrets(&self, owner: &str, agent: &str) -> Result<u64, StoreError> {
        self.within(self.inner.delete_secrets(owner, agent)).await
    }
    async fn put_login(&self, owner: &str, login: &StoredLogin) -> Result<(), StoreError> {
        self.within(self.inner.put_login(owner, login)).await
    }
    async fn logins(&self, owner: &str) -> Result<Vec<StoredLogin>, StoreError> {
        self.within(self.inner.logins(owner)).await
    }
    async fn put_web_session(&self, s: &WebSession) -> Result<(), StoreError> {
        self.within(self.inner.put_web_session(s)).await
    }
    async fn web_session(&self, id: &str) -> Result<Option<WebSession>, StoreError> {
        self.within(self.inner.web_session(id)).await
    }
    async fn revoke_web_session(&self, id: &str, reason: &str) -> Result<(), StoreError> {
        self.within(self.inner.revoke_web_session(id, reason)).await
    }
    async fn due_web_sessions(&self, checked_before: i64, limit: i64) -> Result<Vec<WebSession>, StoreError> {
        self.within(self.inner.due_web_sessions(checked_before, limit)).await
    }
    async fn claim_web_session(&self, id: &str, seen: i64, now: i64) -> Result<bool, StoreError> {
        self.within(self.inner.claim_web_session(id, seen, now)).await
    }
    async fn bind_identity(&self, user: &str, issuer: &str, subject: &str) -> Result<(String, String), StoreError> {
        self.within(self.inner.bind_identity(user, issuer, subject)).await
    }
    async fn append_audit(&self, entries: &[AuditEntry]) -> Result<(), StoreError> {
        self.within(self.inner.append_audit(entries)).await
    }
    async fn audit_page(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>, StoreError> {
        self.within(self.inner.audit_page(filter)).await
    }
    async fn prune_audit(&self, before: i64) -> Result<(), StoreError> {
        self.within(self.inner.prune_audit(before)).await
    }
    async fn users_overview(&self, limit: i64) -> Result<Vec<UserOverview>, StoreError> {
        self.within(self.inner.users_overview(limit)).await
    }
    async fn last_sign_ins(&self) -> Result<Vec<(String, i64)>, StoreError> {
        self.within(self.inner.last_sign_ins()).await
    }
    async fn record_usage(&self, sample: &UsageSample) -> Result<(), StoreError> {
        self.within(self.inner.record_usage(sample)).await
    }
    async fn usage(&self, owner: Option<&str>, since: &str) -> Result<Vec<UsageRow>, StoreError> {
        self.within(self.inner.usage(owner, since)).await
    }
    async fn cost_since(&self, owner: &str, since: &str, currency: &str) -> Result<f64, StoreError> {
        self.within(self.inner.cost_since(owner, since, currency)).await
    }
    async fn create_share(&self, s: &NewShare<'_>, max: i64) -> Result<bool, StoreError> {
        self.within(self.inner.create_share(s, max)).await
    }
    async fn purge_expired_shares(&self, now: i64, limit: i64) -> Result<u64, StoreError> {
        self.within(self.inner.purge_expired_shares(now, limit)).await
    }
    async fn shares(&self, owner: &str, session_id: &str, now: i64) -> Result<Vec<ShareRow>, StoreError> {
        self.within(self.inner.shares(owner, session_id, now)).await
    }
    async fn delete_share(&self, owner: &str, session_id: &str, id: &str) -> Result<bool, StoreError> {
        self.within(self.inner.delete_share(owner, session_id, id)).await
    }
    async fn link_share(&self, token_hash: &[u8], now: i64) -> Result<Option<ShareRow>, StoreError> {
        self.within(self.inner.link_share(token_hash, now)).await
    }
    async fn join_share(&self, id: &str, member: &str, now: i64) -> Result<(), StoreError> {
        self.within(self.inner.join_share(id, member, now)).await
    }
    async fn share_access(&self, user: &str, session_id: &str, now: i64) -> Result<Option<ShareAccess>, StoreError> {
        self.within(self.inner.share_access(user, session_id, now)).await
    }
    async fn share_accesses(&self, pairs: &[(&str, &str)], now: i64) -> Result<Vec<super::MemberAccess>, StoreError> {
        self.within(self.inner.share_accesses(pairs, now)).await
    }
    async fn shared_with(&self, user: &str, now: i64, limit: i64) -> Result<Vec<SharedSession>, StoreError> {
        self.within(self.inner.shared_with(user, now, limit)).await
    }
}
