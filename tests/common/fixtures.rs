//! Rows written straight into a store, for the tests of the store itself.

use acp_gateway::store::{NewSession, Store};

/// Creates `owner`'s session `id` (agent `demo`, working directory `/w`) as of `now` (epoch µs).
pub async fn create_session(store: &dyn Store, id: &str, owner: &str, now: i64) {
    create_session_in(store, id, owner, "/w", "{}", now).await;
}

/// [`create_session`] in working directory `cwd`, with `meta` (a JSON object) stored beside it.
pub async fn create_session_in(store: &dyn Store, id: &str, owner: &str, cwd: &str, meta: &str, now: i64) {
    store
        .create_session(&NewSession {
            id,
            owner,
            agent: "demo",
            agent_session_id: None,
            cwd,
            additional_dirs: "[]",
            meta,
            now,
        })
        .await
        .unwrap_or_else(|e| panic!("create session {id} of {owner}: {e}"));
}
