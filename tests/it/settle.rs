//! Sessions' rows settled after their chunks (`Store::write_chunks_unsettled`, then
//! `Store::settle_sessions`): on Postgres the transcript writer's commit stores chunks alone and
//! the rows catch up later, by a recount that must count each chunk once however many settle at
//! once, and must happen when a gateway stopped before it settled. Checked on both backends.

use crate::common;

use std::sync::Arc;

use acp_gateway::store::{self, EventChunk, ListFilter, SessionWrite, Store};

const BASE: i64 = 1_700_000_000_000_000;

#[derive(Clone, Copy)]
enum Backend {
    Sqlite,
    Postgres,
}

/// A store's url and what keeps it alive (the SQLite file's directory).
async fn url(backend: Backend) -> (String, Option<tempfile::TempDir>) {
    match backend {
        Backend::Sqlite => {
            let dir = tempfile::tempdir().expect("tempdir");
            (format!("sqlite://{}/store.db", dir.path().display()), Some(dir))
        }
        Backend::Postgres => (common::pg::fresh_database().await, None),
    }
}

async fn connect(url: &str) -> Arc<dyn Store> {
    store::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"))
}

/// Session `id`'s updates `from..=to`, received at `at`: each update's payload differs in length,
/// so a chunk counted twice or missed shows in the bytes.
fn chunk(id: &str, from: i64, to: i64, at: i64) -> SessionWrite {
    let payload: String = (from..=to)
        .map(|n| format!("{{\"n\":{n},\"pad\":\"{}\"}}\n", "é".repeat((n % 7) as usize)))
        .collect();
    SessionWrite {
        session_id: Arc::from(id),
        chunk: Some(EventChunk {
            seq_from: from,
            seq_to: to,
            payload,
            stored_at: 0,
        }),
        updated_at: at,
        ..Default::default()
    }
}

fn bytes(writes: &[SessionWrite]) -> u64 {
    writes
        .iter()
        .filter_map(|w| w.chunk.as_ref())
        .map(|c| c.payload.len() as u64)
        .sum()
}

/// Session `id` as `alice`'s list shows it: (`updated_at`, `lastSeq`).
async fn listed(store: &dyn Store, id: &str) -> (i64, i64) {
    let rows = store
        .list_sessions("alice", &ListFilter::default(), None, 100)
        .await
        .expect("list");
    let r = rows
        .iter()
        .find(|r| r.id == id)
        .unwrap_or_else(|| panic!("{id} listed"));
    (r.updated_at, r.last_seq)
}

macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(super::Backend::Sqlite).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(super::Backend::Postgres).await;
                }
            )*
        }
    };
}

on_both_backends!(
    a_session_reads_its_newest_chunk_before_its_row_settles,
    settles_at_once_count_each_chunk_once,
    a_restart_settles_rows_left_behind,
);

async fn a_session_reads_its_newest_chunk_before_its_row_settles(backend: Backend) {
    let (url, _dir) = url(backend).await;
    let s = connect(&url).await;
    common::fixtures::create_session(&*s, "a", "alice", BASE).await;
    let writes = [chunk("a", 1, 4, BASE + 10), chunk("a", 5, 9, BASE + 20)];
    for w in &writes {
        let stored = s
            .write_chunks_unsettled(std::slice::from_ref(w), None)
            .await
            .expect("write");
        assert!(stored.refused.is_empty(), "no leases: nothing refused");
        assert_eq!(
            stored.rows_behind,
            matches!(backend, Backend::Postgres),
            "Postgres leaves the row for a settle; SQLite's pool writes it in the same transaction"
        );
    }
    let read = s.get_session("alice", "a").await.expect("get").expect("a");
    assert_eq!(
        read.last_seq, 9,
        "a session loaded again numbers above every stored update"
    );

    s.settle_sessions(&[Arc::from("a")]).await.expect("settle");
    assert_eq!(s.stored_bytes("alice").await.expect("bytes"), bytes(&writes));
    assert_eq!(listed(&*s, "a").await, (BASE + 20, 9));
    // Settling again changes nothing.
    s.settle_sessions(&[Arc::from("a"), Arc::from("gone")])
        .await
        .expect("settle again");
    assert_eq!(s.stored_bytes("alice").await.expect("bytes"), bytes(&writes));
    assert_eq!(listed(&*s, "a").await, (BASE + 20, 9));
}

async fn settles_at_once_count_each_chunk_once(backend: Backend) {
    let (url, _dir) = url(backend).await;
    let s = connect(&url).await;
    let sessions: Vec<Arc<str>> = ["x", "y", "z"].into_iter().map(Arc::from).collect();
    for id in &sessions {
        common::fixtures::create_session(&*s, id, "alice", BASE).await;
    }
    // One writer stores each session's chunks in seq order (one a metadata write through the
    // other path, which settles first), while four others settle all three sessions in a loop.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let s = s.clone();
        let sessions = sessions.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let mut written = Vec::new();
            for n in 0..60i64 {
                let id = &sessions[(n % 3) as usize];
                let seq = n / 3 * 3 + 1;
                let mut w = chunk(id, seq, seq + 2, BASE + n);
                if n % 10 == 9 {
                    w.prompts = 1;
                    s.write_batch(std::slice::from_ref(&w)).await.expect("batch");
                } else {
                    s.write_chunks_unsettled(std::slice::from_ref(&w), None)
                        .await
                        .expect("chunks");
                }
                written.push(w);
            }
            done.store(true, std::sync::atomic::Ordering::Release);
            written
        })
    };
    let settlers: Vec<_> = (0..4)
        .map(|_| {
            let s = s.clone();
            let sessions = sessions.clone();
            let done = done.clone();
            tokio::spawn(async move {
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    s.settle_sessions(&sessions).await.expect("settle");
                    // A store that settles as it writes (SQLite) returns at once.
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    let written = writer.await.expect("writer");
    for t in settlers {
        t.await.expect("settler");
    }
    s.settle_sessions(&sessions).await.expect("last settle");
    assert_eq!(
        s.stored_bytes("alice").await.expect("bytes"),
        bytes(&written),
        "each stored chunk counted once"
    );
    for (i, id) in sessions.iter().enumerate() {
        let last = written
            .iter()
            .filter(|w| w.session_id == *id)
            .map(|w| (w.updated_at, w.chunk.as_ref().map_or(0, |c| c.seq_to)))
            .max()
            .expect("written");
        assert_eq!(listed(&*s, id).await, last, "session {i}");
    }
}

async fn a_restart_settles_rows_left_behind(backend: Backend) {
    let (url, _dir) = url(backend).await;
    let writes = [chunk("r", 1, 3, BASE + 5), chunk("r", 4, 8, BASE + 7)];
    {
        let s = connect(&url).await;
        common::fixtures::create_session(&*s, "r", "alice", BASE).await;
        for w in &writes {
            s.write_chunks_unsettled(std::slice::from_ref(w), None)
                .await
                .expect("write");
        }
        // Stopped without settling.
    }
    let s = connect(&url).await;
    assert_eq!(s.stored_bytes("alice").await.expect("bytes"), bytes(&writes));
    assert_eq!(listed(&*s, "r").await, (BASE + 7, 8));
}
