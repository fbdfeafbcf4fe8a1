//! The bus: one listening connection per replica (LISTEN/NOTIFY), which also holds the replica's
//! advisory lock, the sign that it is alive.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio_util::sync::CancellationToken;

use super::{Answer, COMMITTED_CHANNEL, Handler, LOCK_CLASS, MESSAGE_CHANNEL, Message, Replica};
use crate::store::StoreError;

impl Replica {
    /// Listens until `stop`, handing what arrives to `handler`. A lost connection is
    /// re-established (the lock taken again, pending messages read, `resync` called).
    pub async fn run_bus(self: Arc<Self>, handler: Arc<dyn Handler>, stop: CancellationToken) {
        let mut backoff = Duration::from_millis(100);
        loop {
            let listener = tokio::select! {
                l = self.listen() => l,
                () = stop.cancelled() => return,
            };
            match listener {
                Ok(mut listener) => {
                    backoff = Duration::from_millis(100);
                    // Whatever was committed or sent while nobody listened.
                    handler.resync();
                    self.read_messages(&*handler).await;
                    if let Err(e) = self.listen_on(&mut listener, &*handler, &stop).await {
                        tracing::warn!(error = %e, "replica bus connection lost; reconnecting");
                    } else {
                        return;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot listen on the replica bus; retrying"),
            }
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = stop.cancelled() => return,
            }
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    /// A listening connection holding this replica's advisory lock.
    async fn listen(&self) -> Result<PgListener, StoreError> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.ignore_pool_close_event(true);
        sqlx::query("SELECT pg_advisory_lock($1, hashtext($2))")
            .bind(LOCK_CLASS)
            .bind(&*self.id)
            .execute(&mut listener)
            .await?;
        listener.listen_all([COMMITTED_CHANNEL, MESSAGE_CHANNEL]).await?;
        Ok(listener)
    }

    /// Hands notifications to `handler` until `stop` (`Ok`) or the connection fails (`Err`).
    async fn listen_on(
        &self,
        listener: &mut PgListener,
        handler: &dyn Handler,
        stop: &CancellationToken,
    ) -> Result<(), StoreError> {
        loop {
            let n = tokio::select! {
                n = listener.try_recv() => n?,
                () = stop.cancelled() => return Ok(()),
            };
            // `None`: the connection was lost (and is back, without the lock): start over.
            let Some(n) = n else {
                return Err(StoreError::Db(sqlx::Error::Protocol(
                    "listening connection lost".into(),
                )));
            };
            let payload = n.payload();
            if n.channel() == COMMITTED_CHANNEL {
                if let Some((session, seq)) = payload.rsplit_once(':')
                    && let Ok(seq) = seq.parse()
                {
                    handler.committed(session, seq);
                }
            } else if payload.rsplit_once(':').is_some_and(|(target, _)| target == &*self.id) {
                self.read_messages(handler).await;
            }
        }
    }

    /// Takes this replica's messages from `replica_messages` and handles them in order.
    async fn read_messages(&self, handler: &dyn Handler) {
        let rows: Result<Vec<(i64, String)>, sqlx::Error> = sqlx::query_as(
            "DELETE FROM replica_messages WHERE id IN
                 (SELECT id FROM replica_messages WHERE target = $1 ORDER BY id FOR UPDATE SKIP LOCKED)
             RETURNING id, body",
        )
        .bind(&*self.id)
        .fetch_all(&self.pool)
        .await;
        let mut rows = match rows {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read replica messages");
                return;
            }
        };
        // DELETE … RETURNING promises no order: in the order they were sent.
        rows.sort_unstable_by_key(|(id, _)| *id);
        for (_, body) in rows {
            match serde_json::from_str::<Message>(&body) {
                Ok(Message::Answer {
                    reply,
                    frame,
                    after_seq,
                }) => self.answered(reply, Answer { frame, after_seq }),
                Ok(message) => handler.message(message),
                Err(e) => tracing::warn!(error = %e, "unreadable replica message dropped"),
            }
        }
    }
}
