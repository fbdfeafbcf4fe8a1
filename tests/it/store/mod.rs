//! The `Store` contract, checked the same way against SQLite (a temp file) and Postgres (a fresh
//! database per test), plus the transcript writer end to end (Postgres row-level security:
//! tests/rls.rs).

use crate::common;

use std::collections::HashSet;
use std::str::FromStr;
use std::sync::Arc;

use acp_gateway::store::persister::{Item, Persister};
use acp_gateway::store::{self, EventChunk, ListFilter, Position, SessionRecord, SessionWrite, Store};
use sqlx::{Connection, Executor, PgConnection};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
}

/// An opened store and what keeps it alive.
struct Db {
    store: Arc<dyn Store>,
    url: String,
    _dir: Option<tempfile::TempDir>,
}

async fn open(backend: Backend) -> Db {
    let (url, dir) = match backend {
        Backend::Sqlite => {
            let dir = tempfile::tempdir().expect("tempdir");
            (format!("sqlite://{}/store.db", dir.path().display()), Some(dir))
        }
        Backend::Postgres => (common::pg::fresh_database().await, None),
    };
    let store = store::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    Db { store, url, _dir: dir }
}

/// Runs each named `async fn(Backend)` as one test per backend.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(crate::store::Backend::Sqlite).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(crate::store::Backend::Postgres).await;
                }
            )*
        }
    };
}

// After the macro: the modules below use it.
mod listing;
mod one_backend;
mod search;
mod transcript;

const BASE: i64 = 1_700_000_000_000_000;

async fn create(store: &dyn Store, id: &str, owner: &str, cwd: &str, meta: &str, now: i64) {
    common::fixtures::create_session_in(store, id, owner, cwd, meta, now).await;
}

/// Sets a session's title (as the agent would) without touching `updated_at`.
async fn set_title(store: &dyn Store, id: &str, title: &str) {
    store
        .write_batch(&[SessionWrite {
            session_id: Arc::from(id),
            agent_title: Some(title.to_string()),
            ..Default::default()
        }])
        .await
        .expect("title write");
}

async fn list_all(store: &dyn Store, owner: &str, filter: &ListFilter) -> Vec<SessionRecord> {
    store.list_sessions(owner, filter, None, 10_000).await.expect("list")
}

fn ids(rows: &[SessionRecord]) -> Vec<&str> {
    rows.iter().map(|r| r.id.as_str()).collect()
}

fn chunk(from: i64, to: i64) -> EventChunk {
    let payload = (from..=to)
        .map(|n| format!("{{\"n\":{n}}}"))
        .collect::<Vec<_>>()
        .join("\n");
    EventChunk {
        seq_from: from,
        seq_to: to,
        payload,
        stored_at: 0,
    }
}

fn events(id: &str, c: EventChunk, at: i64) -> SessionWrite {
    SessionWrite {
        session_id: Arc::from(id),
        chunk: Some(c),
        updated_at: at,
        ..Default::default()
    }
}

/// Every page of `owner`'s sessions matching `search`, `page` at a time.
async fn search_pages(store: &dyn Store, owner: &str, search: &str, page: u32) -> Vec<String> {
    let f = ListFilter {
        search: Some(search.into()),
        ..Default::default()
    };
    let mut got = Vec::new();
    let mut last: Option<(i64, String)> = None;
    loop {
        let after = last.as_ref().map(|(t, id)| Position { updated_at: *t, id });
        let rows = store.list_sessions(owner, &f, after, page).await.expect("search");
        assert!(
            rows.iter().all(|r| r.owner == owner),
            "{owner} got another's row for {search:?}"
        );
        got.extend(rows.iter().map(|r| r.id.clone()));
        match rows.last() {
            Some(r) if rows.len() == page as usize => last = Some((r.updated_at, r.id.clone())),
            _ => return got,
        }
    }
}

/// `search` as `owner` (one page of up to 10,000).
async fn search(store: &dyn Store, owner: &str, search: &str) -> Vec<String> {
    let f = ListFilter {
        search: Some(search.into()),
        ..Default::default()
    };
    list_all(store, owner, &f).await.into_iter().map(|r| r.id).collect()
}

/// What `list_sessions` must return, computed in Rust.
fn expected(all: &[SessionRecord], owner: &str, f: &ListFilter) -> Vec<String> {
    let mut rows: Vec<&SessionRecord> = all
        .iter()
        .filter(|r| r.owner == owner)
        .filter(|r| f.cwd.as_ref().is_none_or(|c| &r.cwd == c))
        .filter(|r| f.created_after.is_none_or(|t| r.created_at > t))
        .filter(|r| f.created_before.is_none_or(|t| r.created_at < t))
        .filter(|r| f.updated_after.is_none_or(|t| r.updated_at > t))
        .filter(|r| {
            f.search.as_ref().is_none_or(|q| {
                let q = q.to_lowercase();
                r.title.as_deref().is_some_and(|t| t.to_lowercase().contains(&q)) || r.meta.to_lowercase().contains(&q)
            })
        })
        .collect();
    rows.sort_by(|a, b| (b.updated_at, &b.id).cmp(&(a.updated_at, &a.id)));
    rows.into_iter().map(|r| r.id.clone()).collect()
}

/// `owner`'s stored bytes, as the session service reads them (bounded in time).
async fn stored(store: &Arc<dyn Store>, owner: &str) -> u64 {
    store::in_time(store.stored_bytes(owner)).await.expect("stored bytes")
}

/// Bytes of every stored chunk of `owner`'s session `id`, read back.
async fn read_back(store: &dyn Store, owner: &str, id: &str) -> u64 {
    let chunks = read_all(store, owner, id).await;
    chunks.iter().map(|c| c.payload.len() as u64).sum()
}

/// Every stored chunk of `owner`'s session `id`, page by page as a replay reads them.
async fn read_all(store: &dyn Store, owner: &str, id: &str) -> Vec<EventChunk> {
    let mut all: Vec<EventChunk> = Vec::new();
    loop {
        let after = all.last().map_or(0, |c| c.seq_to);
        let page = store.read_events(owner, id, after, 1024).await.expect("read");
        if page.is_empty() {
            return all;
        }
        all.extend(page);
    }
}
