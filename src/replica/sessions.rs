//! This replica as the session layer reaches it ([`crate::session::Replicas`]): leases, the
//! followers' and watchers' rows, and the notes about agent requests asked across replicas, sent
//! on the bus as [`Message`]s from this replica.

use std::sync::Arc;

use async_trait::async_trait;

use super::{Message, Replica};
use crate::session::{Followed, Holder, Note, Replicas, Served};
use crate::store::StoreError;

impl Note {
    /// The bus message that carries this note from replica `from`.
    fn into_message(self, from: &str) -> Message {
        let from = from.to_string();
        match self {
            Note::Ask {
                key,
                session,
                method,
                params,
                after_seq,
            } => Message::Ask {
                from,
                key,
                session,
                method,
                params,
                after_seq,
            },
            Note::Answered { key, result, error } => Message::Answered {
                from,
                key,
                result,
                error,
            },
            Note::Settled { key } => Message::Settled { from, key },
            Note::Watching { session } => Message::Watching { from, session },
        }
    }
}

#[async_trait]
impl Replicas for Replica {
    fn id(&self) -> &Arc<str> {
        &self.id
    }

    fn holds(&self, session: &str) -> bool {
        Replica::holds(self, session)
    }

    async fn acquire(&self, session: &str) -> Result<Holder, StoreError> {
        Replica::acquire(self, session).await
    }

    async fn acquire_new(&self, session: &str) -> Result<Holder, StoreError> {
        Replica::acquire_new(self, session).await
    }

    async fn follow(&self, session: &str, controls: bool) -> Result<Option<Followed>, StoreError> {
        Replica::follow(self, session, controls).await
    }

    async fn announce(&self, session: &str) -> Result<Option<Served>, StoreError> {
        Replica::announce(self, session).await
    }

    fn follows(&self, session: &str) -> bool {
        Replica::follows(self, session)
    }

    async fn unfollow(&self, session: &str, unattended: &(dyn Fn() -> bool + Send + Sync)) -> Result<bool, StoreError> {
        Replica::unfollow(self, session, unattended).await
    }

    fn forget_following(&self, session: &str) {
        Replica::forget_following(self, session);
    }

    async fn unwatch(&self, session: &str) -> Result<(), StoreError> {
        Replica::unwatch(self, session).await
    }

    async fn watchers(&self, session: &str) -> Result<Vec<String>, StoreError> {
        Replica::watchers(self, session).await
    }

    async fn tell(&self, target: &str, note: Note) -> Result<(), StoreError> {
        self.send(target, &note.into_message(&self.id)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_goes_on_the_bus_as_the_message_it_always_was_from_this_replica() {
        let ask = Note::Ask {
            key: 7,
            session: "s1".into(),
            method: "session/request_permission".into(),
            params: "{}".into(),
            after_seq: 3,
        }
        .into_message("r1");
        let wire = serde_json::to_value(&ask).expect("json");
        assert_eq!(wire["kind"], "ask", "{wire}");
        assert_eq!(wire["from"], "r1");
        assert_eq!(wire["afterSeq"], 3);
        let watching = serde_json::to_value(Note::Watching { session: "s1".into() }.into_message("r2")).expect("json");
        assert_eq!((&watching["from"], &watching["session"]), (&"r2".into(), &"s1".into()));
    }
}
