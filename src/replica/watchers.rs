//! Which replicas have clients attached to a session that may answer its agent's requests
//! (`session_watchers`, written by [`Replica::follow`]), so the replica serving it knows where
//! else to ask an agent's request; and sweeping the rows of replicas gone.

use super::{LOCK_CLASS, Replica};
use crate::store::StoreError;

impl Replica {
    /// This replica has no clients of `session` that may answer its agent's requests any more
    /// (its row in `session_followers` goes on its own: [`Replica::unfollow`]). Under the
    /// follow lock: a controller attaching meanwhile notes the session again only after the row
    /// is deleted, so its own row is written after, not deleted by this.
    pub async fn unwatch(&self, session: &str) -> Result<(), StoreError> {
        let _follows = self.follows.lock().await;
        self.watching.forget(session);
        sqlx::query("DELETE FROM session_watchers WHERE session_id = $1 AND replica = $2")
            .bind(session)
            .bind(&*self.id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The other replicas watching `session`, the one whose client attached last first.
    pub async fn watchers(&self, session: &str) -> Result<Vec<String>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT replica FROM session_watchers WHERE session_id = $1 AND replica <> $2 ORDER BY since DESC",
        )
        .bind(session)
        .bind(&*self.id)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Removes what replicas gone from the database left behind: messages and watcher rows
    /// addressed to a replica that holds no advisory lock (its process ended; messages only once
    /// older than a lease time, so a replica re-establishing its listening connection keeps
    /// them), and messages older than `max_age` whoever they are for (nobody read them: a
    /// replica reads its messages at once). Returns how many rows went. Two indexed statements; run every few lease times.
    pub async fn sweep_dead(&self, max_age: std::time::Duration) -> Result<u64, StoreError> {
        let alive = "EXISTS (SELECT 1 FROM pg_locks k WHERE k.locktype = 'advisory' AND k.granted
                     AND k.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                     AND k.classid = $1::oid AND k.objid = hashtext(t.replica)::oid AND k.objsubid = 2)";
        let messages = sqlx::query(&format!(
            "DELETE FROM replica_messages m
             WHERE m.created_at < now() - make_interval(secs => $2)
                OR m.created_at < now() - make_interval(secs => $3) AND m.target IN (SELECT DISTINCT t.replica FROM (SELECT target AS replica FROM replica_messages) t
                                WHERE NOT {alive})"
        ))
        .bind(LOCK_CLASS)
        .bind(max_age.as_secs_f64())
        .bind(self.ttl.as_secs_f64())
        .execute(&self.pool)
        .await?
        .rows_affected();
        let mut rows = messages;
        for table in ["session_watchers", "session_followers"] {
            rows += sqlx::query(&format!(
                "DELETE FROM {table} w
                 WHERE w.replica IN (SELECT DISTINCT t.replica FROM {table} t WHERE NOT {alive})"
            ))
            .bind(LOCK_CLASS)
            .execute(&self.pool)
            .await?
            .rows_affected();
        }
        Ok(rows)
    }
}
