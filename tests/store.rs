//! The `Store` contract, checked the same way against SQLite (a temp file) and Postgres (a fresh
//! database per test), plus the transcript writer end to end (Postgres row-level security:
//! tests/rls.rs).

mod common;

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
                    super::$name(super::Backend::Sqlite).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::Backend::Postgres).await;
                }
            )*
        }
    };
}

on_both_backends!(
    create_get_list_delete,
    foreign_sessions_are_invisible,
    list_never_crosses_owners_under_any_filter,
    keyset_pagination_sees_each_session_once_while_sessions_are_added,
    events_round_trip,
    writes_for_deleted_sessions_are_dropped,
    a_conflicting_chunk_is_skipped_not_retried,
    delete_removes_the_transcript,
    cursor_key_is_stable,
    persister_stores_everything_in_order,
    search_is_a_case_insensitive_substring_of_title_or_meta,
    search_follows_renames_and_deletes,
    common_and_rare_searches_page_alike,
    stored_bytes_count_each_users_stored_transcript,
    migrations_fill_in_sessions_stored_before_them,
);

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

async fn create_get_list_delete(backend: Backend) {
    let db = open(backend).await;
    let s = &*db.store;
    s.ping().await.expect("ping");
    create(s, "s1", "alice", "/w", r#"{"k":1}"#, BASE).await;
    create(s, "s2", "alice", "/w", "{}", BASE + 10).await;
    create(s, "s3", "alice", "/x", "{}", BASE + 20).await;

    let got = s.get_session("alice", "s1").await.expect("get").expect("s1 exists");
    assert_eq!(
        got,
        SessionRecord {
            id: "s1".into(),
            owner: "alice".into(),
            agent: "demo".into(),
            agent_session_id: None,
            cwd: "/w".into(),
            additional_dirs: "[]".into(),
            title: None,
            meta: r#"{"k":1}"#.into(),
            message_count: 0,
            last_seq: 0,
            created_at: BASE,
            updated_at: BASE,
            archived_at: None,
        }
    );
    assert_eq!(s.get_session("alice", "nope").await.expect("get"), None);

    let all = list_all(s, "alice", &ListFilter::default()).await;
    assert_eq!(ids(&all), ["s3", "s2", "s1"], "newest updated_at first");
    let page = s
        .list_sessions("alice", &ListFilter::default(), None, 2)
        .await
        .expect("list");
    assert_eq!(ids(&page), ["s3", "s2"]);
    let after = Position {
        updated_at: page[1].updated_at,
        id: &page[1].id,
    };
    let rest = s
        .list_sessions("alice", &ListFilter::default(), Some(after), 2)
        .await
        .expect("list");
    assert_eq!(ids(&rest), ["s1"]);

    // A write moves a session to the front and updates its counters.
    s.write_batch(&[SessionWrite {
        session_id: Arc::from("s1"),
        chunk: Some(chunk(1, 3)),
        prompt_title: Some("first prompt".into()),
        prompts: 1,
        updated_at: BASE + 100,
        ..Default::default()
    }])
    .await
    .expect("write");
    let s1 = s.get_session("alice", "s1").await.expect("get").expect("s1");
    assert_eq!((s1.last_seq, s1.message_count, s1.updated_at), (3, 1, BASE + 100));
    assert_eq!(s1.title.as_deref(), Some("first prompt"));
    assert_eq!(
        ids(&list_all(s, "alice", &ListFilter::default()).await),
        ["s1", "s3", "s2"]
    );
    // A later prompt title does not replace it; the agent's title does.
    s.write_batch(&[SessionWrite {
        session_id: Arc::from("s1"),
        prompt_title: Some("second prompt".into()),
        prompts: 1,
        updated_at: BASE + 50,
        ..Default::default()
    }])
    .await
    .expect("write");
    let s1 = s.get_session("alice", "s1").await.expect("get").expect("s1");
    assert_eq!(s1.title.as_deref(), Some("first prompt"));
    assert_eq!(
        (s1.message_count, s1.updated_at),
        (2, BASE + 100),
        "updated_at never goes back"
    );
    set_title(s, "s1", "agent title").await;
    assert_eq!(
        s.get_session("alice", "s1")
            .await
            .expect("get")
            .expect("s1")
            .title
            .as_deref(),
        Some("agent title")
    );

    assert!(s.delete_session("alice", "s2").await.expect("delete"));
    assert_eq!(s.get_session("alice", "s2").await.expect("get"), None);
    assert!(
        !s.delete_session("alice", "s2").await.expect("delete again"),
        "second delete finds nothing"
    );
    assert_eq!(ids(&list_all(s, "alice", &ListFilter::default()).await), ["s1", "s3"]);
}

async fn foreign_sessions_are_invisible(backend: Backend) {
    let db = open(backend).await;
    let s = &*db.store;
    create(s, "a1", "alice", "/w", "{}", BASE).await;
    create(s, "b1", "bob", "/w", "{}", BASE).await;
    s.write_batch(&[events("a1", chunk(1, 2), BASE + 1)])
        .await
        .expect("write");

    assert_eq!(
        s.get_session("bob", "a1").await.expect("get"),
        None,
        "another owner's session is not found"
    );
    assert!(s.get_session("alice", "a1").await.expect("get").is_some());
    assert_eq!(
        s.read_events("bob", "a1", 0, 100).await.expect("read"),
        [],
        "nor its transcript"
    );
    assert_eq!(s.read_events("alice", "a1", 0, 100).await.expect("read").len(), 1);
    assert!(
        !s.delete_session("bob", "a1").await.expect("delete"),
        "bob cannot delete alice's session"
    );
    assert!(
        s.get_session("alice", "a1").await.expect("get").is_some(),
        "still there"
    );
    assert_eq!(
        s.read_events("alice", "a1", 0, 100).await.expect("read").len(),
        1,
        "transcript too"
    );
    assert_eq!(ids(&list_all(s, "bob", &ListFilter::default()).await), ["b1"]);
    assert_eq!(
        ids(&list_all(s, "", &ListFilter::default()).await),
        Vec::<&str>::new(),
        "the empty user owns nothing"
    );
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

async fn list_never_crosses_owners_under_any_filter(backend: Backend) {
    let db = open(backend).await;
    let s = &*db.store;
    let titles = [
        Some("Fix the 100% CPU bug"),
        Some("Fix the 1000 CPU bug"),
        Some("snake_case names"),
        Some("snakeXcase names"),
        Some(r"back\slash"),
        None,
        Some("Hello World"),
        Some("hello world two"),
    ];
    let metas = [
        r#"{"tag":"50%_off"}"#,
        "{}",
        r#"{"note":"under_score"}"#,
        r#"{"note":"underXscore"}"#,
    ];
    let cwds = ["/w/a", "/w/b", "/w/a%", "/w/a_"];
    // Alice and Bob get the same sessions (same times, titles, directories); Bob's metadata also
    // names him, so a search for it must find nothing for Alice.
    for owner in ["alice", "bob"] {
        for i in 0..40_i64 {
            let id = format!("{}-{i:02}", &owner[..1]);
            let meta = if owner == "bob" {
                metas[i as usize % metas.len()]
                    .replace('{', r#"{"who":"bob-secret","#)
                    .replace(",}", "}")
            } else {
                metas[i as usize % metas.len()].to_string()
            };
            create(s, &id, owner, cwds[i as usize % cwds.len()], &meta, BASE + i * 10).await;
            // Pairs share updated_at, so the id tie-break matters.
            s.write_batch(&[SessionWrite {
                session_id: Arc::from(id.as_str()),
                updated_at: BASE + 1_000 + (i / 2) * 100,
                ..Default::default()
            }])
            .await
            .expect("touch");
            if let Some(t) = titles[i as usize % titles.len()] {
                set_title(s, &id, t).await;
            }
        }
    }
    let mut all = list_all(s, "alice", &ListFilter::default()).await;
    all.extend(list_all(s, "bob", &ListFilter::default()).await);
    assert_eq!(all.len(), 80);

    let search = |q: &str| ListFilter {
        search: Some(q.into()),
        ..Default::default()
    };
    let filters = vec![
        ListFilter::default(),
        ListFilter {
            cwd: Some("/w/a".into()),
            ..Default::default()
        },
        ListFilter {
            cwd: Some("/w/a%".into()),
            ..Default::default()
        },
        ListFilter {
            cwd: Some("/w/%".into()),
            ..Default::default()
        },
        ListFilter {
            cwd: Some("/w/a_".into()),
            ..Default::default()
        },
        ListFilter {
            created_after: Some(BASE + 150),
            ..Default::default()
        },
        ListFilter {
            created_before: Some(BASE + 150),
            ..Default::default()
        },
        ListFilter {
            created_after: Some(BASE + 100),
            created_before: Some(BASE + 300),
            ..Default::default()
        },
        ListFilter {
            updated_after: Some(BASE + 2_000),
            ..Default::default()
        },
        ListFilter {
            updated_after: Some(BASE + 1_000),
            ..Default::default()
        },
        search("100%"),
        search("%"),
        search("_"),
        search("e_c"),
        search("r_s"),
        search("%_"),
        search("HELLO"),
        search(r"\"),
        search(r"k\s"),
        search("bob-secret"),
        search("bob"),
        search("zzz-nothing"),
        ListFilter {
            cwd: Some("/w/a".into()),
            search: Some("fix".into()),
            created_after: Some(BASE + 50),
            updated_after: Some(BASE + 1_100),
            ..Default::default()
        },
    ];
    let mut nonempty = 0;
    for f in &filters {
        for owner in ["alice", "bob"] {
            let want = expected(&all, owner, f);
            let got = list_all(s, owner, f).await;
            assert!(
                got.iter().all(|r| r.owner == owner),
                "{owner} got another owner's row under {f:?}"
            );
            assert_eq!(ids(&got), want, "{owner}, filter {f:?}");
            // The same through small pages.
            let mut paged = Vec::new();
            let mut last: Option<(i64, String)> = None;
            loop {
                let after = last.as_ref().map(|(t, id)| Position { updated_at: *t, id });
                let page = s.list_sessions(owner, f, after, 3).await.expect("page");
                assert!(
                    page.iter().all(|r| r.owner == owner),
                    "{owner} got another owner's row on a page under {f:?}"
                );
                paged.extend(page.iter().map(|r| r.id.clone()));
                match page.last() {
                    Some(r) if page.len() == 3 => last = Some((r.updated_at, r.id.clone())),
                    _ => break,
                }
            }
            assert_eq!(paged, want, "{owner}, paged, filter {f:?}");
            nonempty += usize::from(!want.is_empty());
        }
    }
    assert!(nonempty > 30, "the filters are meant to match something");
    // The literal matches are what they should be.
    assert_eq!(expected(&all, "alice", &search("100%")).len(), 5);
    assert_eq!(expected(&all, "alice", &search("bob")).len(), 0);
    assert_eq!(expected(&all, "bob", &search("bob")).len(), 40);
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

/// The search index finds what `LIKE` found: substrings anywhere, in any ASCII case, with `%`,
/// `_`, `\` and `"` taken literally, in the title or the metadata, of short and of long searches,
/// and only the caller's.
async fn search_is_a_case_insensitive_substring_of_title_or_meta(backend: Backend) {
    let db = open(backend).await;
    let s = &*db.store;
    let long_title = format!("{} tail", "0123456789abcdef".repeat(20));
    let sessions: [(&str, Option<&str>, &str); 10] = [
        ("mid", Some("Refactor the Persister queue"), "{}"),
        ("case", Some("HELLO World"), "{}"),
        ("pct", Some("Fix the 100% CPU bug"), "{}"),
        ("pct-not", Some("Fix the 1000 CPU bug"), "{}"),
        ("under", Some("snake_case names"), "{}"),
        ("under-not", Some("snakeXcase names"), "{}"),
        ("quote", Some(r#"say "hi" \ back\slash"#), "{}"),
        ("meta", None, r#"{"branch":"feature-XYZ","tag":"50%_off"}"#),
        ("umlaut", Some("Größe prüfen"), "{}"),
        ("long", Some(&long_title), "{}"),
    ];
    for owner in ["alice", "bob"] {
        for (i, (id, title, meta)) in sessions.iter().enumerate() {
            let id = format!("{owner}-{id}");
            create(s, &id, owner, "/w", meta, BASE + i as i64).await;
            if let Some(t) = title {
                set_title(s, &id, t).await;
            }
        }
    }
    let all = list_all(s, "alice", &ListFilter::default()).await;
    let cases: &[(&str, &[&str])] = &[
        ("persist", &["mid"]),
        ("ter QUE", &["mid"]),
        ("hello", &["case"]),
        ("LLO wOR", &["case"]),
        ("100%", &["pct"]),
        ("0% C", &["pct"]),
        ("%", &["meta", "pct"]),
        ("e_c", &["under"]),
        ("_", &["meta", "under"]),
        ("%_", &["meta"]),
        (r#""hi""#, &["quote"]),
        (r"\ back\s", &["quote"]),
        (r"\", &["quote"]),
        ("feature-xyz", &["meta"]),
        ("\"branch\"", &["meta"]),
        ("50%_off", &["meta"]),
        ("GRößE", &["umlaut"]),
        ("prü", &["umlaut"]),
        ("ll", &["case"]),
        ("LL", &["case"]),
        ("xy", &["meta"]),
        ("fix the 10", &["pct", "pct-not"]),
        (&long_title[40..296], &["long"]),
        ("no such text", &[]),
        ("alice", &[]),
    ];
    for (q, want) in cases {
        let f = ListFilter {
            search: Some(q.to_string()),
            ..Default::default()
        };
        let mut own = expected(&all, "alice", &f);
        own.sort();
        assert_eq!(own, expected_ids("alice", want), "the test's own answer for {q:?}");
        for owner in ["alice", "bob"] {
            let mut got = search(s, owner, q).await;
            got.sort();
            assert_eq!(got, expected_ids(owner, want), "{owner} searching {q:?}");
        }
    }
    assert_eq!(
        cases.iter().find(|c| c.0.chars().count() == 256).map(|c| c.1),
        Some(&["long"][..])
    );
}

/// `want`'s ids as `owner`'s, sorted.
fn expected_ids(owner: &str, want: &[&str]) -> Vec<String> {
    let mut ids: Vec<String> = want.iter().map(|id| format!("{owner}-{id}")).collect();
    ids.sort();
    ids
}

/// A renamed session is found under its new title and not its old one; changed metadata
/// likewise; a deleted session is found no more, nor is a new session under its old id.
async fn search_follows_renames_and_deletes(backend: Backend) {
    let db = open(backend).await;
    let s = &*db.store;
    create(s, "a", "alice", "/w", r#"{"ticket":"OPS-1234"}"#, BASE).await;
    create(s, "b", "alice", "/w", "{}", BASE + 1).await;
    set_title(s, "a", "Original name").await;
    set_title(s, "b", "Original too").await;
    assert_eq!(search(s, "alice", "original").await, ["b", "a"]);

    set_title(s, "a", "Renamed entirely").await;
    assert_eq!(search(s, "alice", "original").await, ["b"], "the old title is gone");
    assert_eq!(search(s, "alice", "renamed").await, ["a"], "the new one is found");
    assert_eq!(search(s, "alice", "ops-1234").await, ["a"], "its metadata still is");
    // The writer's metadata updates name the title even when they keep it.
    s.write_batch(&[SessionWrite {
        session_id: Arc::from("a"),
        chunk: Some(chunk(1, 2)),
        prompt_title: Some("a prompt title, not taken".into()),
        prompts: 1,
        updated_at: BASE + 10,
        ..Default::default()
    }])
    .await
    .expect("write");
    assert_eq!(search(s, "alice", "renamed").await, ["a"]);
    assert_eq!(search(s, "alice", "not taken").await, Vec::<String>::new());

    assert!(s.delete_session("alice", "b").await.expect("delete"));
    assert_eq!(search(s, "alice", "original").await, Vec::<String>::new(), "deleted");
    assert_eq!(
        search(s, "alice", "or").await,
        Vec::<String>::new(),
        "deleted, short search"
    );
    create(s, "b", "alice", "/w", "{}", BASE + 20).await;
    assert_eq!(
        search(s, "alice", "original").await,
        Vec::<String>::new(),
        "a new session under the old id"
    );
    assert_eq!(search(s, "alice", "renamed").await, ["a"]);
}

/// However a search is answered (scanning a small owner's sessions; the newest of a big owner's
/// in list order, for a search common among them; from the index, for a rare one; scanning them
/// all, for one common among everyone's sessions but not this owner's newest, or too short for
/// the index), it pages the same.
async fn common_and_rare_searches_page_alike(backend: Backend) {
    // Alice and Bob get more sessions than the store counts to before it decides.
    let bulk = 2 * store::SEARCH_PROBE + 100;
    let db = open(backend).await;
    let s = &*db.store;
    bulk_sessions(backend, &db.url, bulk).await;
    for (id, at) in [("needle-old", 5), ("needle-mid", 1_000), ("needle-new", bulk + 5)] {
        create(s, id, "alice", "/w", "{}", BASE + at * 10).await;
        set_title(s, id, &format!("Common thing with a NEEDLE: {id}")).await;
    }
    // All of Bob's sessions are zebras; Alice's two are older than her newest 2,000.
    for (id, at) in [("zebra-1", -2), ("zebra-2", -1)] {
        create(s, id, "alice", "/w", "{}", BASE + at * 10).await;
        set_title(s, id, "A Zebra").await;
    }
    for (owner, id) in [("bob", "needle-bob"), ("carol", "needle-carol")] {
        create(s, id, owner, "/w", "{}", BASE).await;
        set_title(s, id, "Common thing with a needle").await;
    }
    create(s, "carol-other", "carol", "/w", "{}", BASE + 1).await;
    set_title(s, "carol-other", "Something else").await;

    let mut all = list_all(s, "alice", &ListFilter::default()).await;
    assert_eq!(all.len() as i64, bulk / 2 + 5);
    all.extend(list_all(s, "carol", &ListFilter::default()).await);
    // Common; rare; about a quarter of all; rare; none; too short for an index; common among
    // Bob's only.
    for q in [
        "common thing",
        "needle",
        "ommon thing 1",
        "ng 7",
        "no such thing",
        "Zz",
        "zebra",
    ] {
        let f = ListFilter {
            search: Some(q.into()),
            ..Default::default()
        };
        for owner in ["alice", "carol"] {
            let want = expected(&all, owner, &f);
            assert_eq!(search_pages(s, owner, q, 50).await, want, "{owner}, {q:?}, pages of 50");
            assert_eq!(search_pages(s, owner, q, 7).await, want, "{owner}, {q:?}, pages of 7");
        }
    }
    assert_eq!(
        search(s, "alice", "needle").await,
        ["needle-new", "needle-mid", "needle-old"]
    );
    assert_eq!(search(s, "alice", "zebra").await, ["zebra-2", "zebra-1"]);
    assert_eq!(search(s, "bob", "needle").await, ["needle-bob"]);
    assert_eq!(search(s, "carol", "needle").await, ["needle-carol"]);
}

/// `n` sessions "Common thing N" (updated at `BASE + N * 10`), alternately Alice's and Bob's
/// (whose titles end in "zebra"), written beside the store (one statement, not `n` round trips).
async fn bulk_sessions(backend: Backend, url: &str, n: i64) {
    let insert = "INSERT INTO sessions (id, owner, agent, cwd, title, meta, created_at, updated_at)
                  SELECT 'bulk-' || g, CASE WHEN g % 2 = 0 THEN 'alice' ELSE 'bob' END, 'demo', '/w',
                         'Common thing ' || g || CASE WHEN g % 2 = 0 THEN '' ELSE ' zebra' END, '{}',
                         $2 + g * 10, $2 + g * 10
                  FROM gen";
    match backend {
        Backend::Sqlite => {
            let mut c = sqlx::SqliteConnection::connect(url).await.expect("sqlite");
            sqlx::query(&format!(
                "WITH RECURSIVE gen(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM gen WHERE g < $1) {insert}"
            ))
            .bind(n)
            .bind(BASE)
            .execute(&mut c)
            .await
            .expect("bulk insert");
        }
        Backend::Postgres => {
            let mut c = PgConnection::connect(url).await.expect("postgres");
            // As the tables' owner, which row-level security does not apply to.
            let mut tx = c.begin().await.expect("begin");
            sqlx::query(&format!(
                "WITH gen(g) AS (SELECT generate_series(1, $1::bigint)) {insert}"
            ))
            .bind(n)
            .bind(BASE)
            .execute(&mut *tx)
            .await
            .expect("bulk insert");
            // As autovacuum would: the planner's counts of session_search.
            tx.execute("ANALYZE session_search").await.expect("analyze");
            tx.commit().await.expect("commit");
        }
    }
}

async fn keyset_pagination_sees_each_session_once_while_sessions_are_added(backend: Backend) {
    let db = open(backend).await;
    let s = &*db.store;
    let mut originals = HashSet::new();
    for i in 0..100_i64 {
        // Triples share updated_at; Bob's sessions interleave with Alice's.
        let id = format!("a{:03}", (i * 37) % 100);
        create(s, &id, "alice", "/w", "{}", BASE + (i / 3) * 10).await;
        create(s, &format!("b{i:03}"), "bob", "/w", "{}", BASE + (i / 3) * 10).await;
        originals.insert(id);
    }
    let f = ListFilter::default();
    let mut seen: Vec<SessionRecord> = Vec::new();
    let mut added = 0;
    loop {
        let after = seen.last().map(|r| Position {
            updated_at: r.updated_at,
            id: &r.id,
        });
        let page = s.list_sessions("alice", &f, after, 7).await.expect("page");
        let done = page.len() < 7;
        seen.extend(page);
        if done {
            break;
        }
        // New sessions arrive between pages (newest of all: before the cursor).
        added += 1;
        create(
            s,
            &format!("new{added:03}"),
            "alice",
            "/w",
            "{}",
            BASE + 1_000_000 + added,
        )
        .await;
        create(
            s,
            &format!("bnew{added:03}"),
            "bob",
            "/w",
            "{}",
            BASE + 1_000_000 + added,
        )
        .await;
    }
    let got: Vec<&str> = ids(&seen);
    let unique: HashSet<&str> = got.iter().copied().collect();
    assert_eq!(unique.len(), got.len(), "no session twice: {got:?}");
    assert_eq!(
        unique,
        originals.iter().map(String::as_str).collect::<HashSet<_>>(),
        "every session once"
    );
    for w in seen.windows(2) {
        assert!(
            (w[0].updated_at, &w[0].id) > (w[1].updated_at, &w[1].id),
            "newest first: {} then {}",
            w[0].id,
            w[1].id
        );
    }
    assert!(added >= 14);
    // A fresh listing shows the new ones first.
    let first = s.list_sessions("alice", &f, None, 3).await.expect("list");
    assert_eq!(
        ids(&first),
        [
            format!("new{added:03}"),
            format!("new{:03}", added - 1),
            format!("new{:03}", added - 2)
        ]
    );
}

async fn events_round_trip(backend: Backend) {
    let db = open(backend).await;
    let s = &*db.store;
    create(s, "s", "alice", "/w", "{}", BASE).await;
    create(s, "t", "alice", "/w", "{}", BASE).await;
    // One flush writes several sessions; several flushes append chunks.
    s.write_batch(&[events("s", chunk(1, 10), BASE + 1), events("t", chunk(1, 1), BASE + 1)])
        .await
        .expect("write 1");
    s.write_batch(&[events("s", chunk(11, 25), BASE + 2)])
        .await
        .expect("write 2");
    s.write_batch(&[events("s", chunk(26, 26), BASE + 3)])
        .await
        .expect("write 3");

    let all = s.read_events("alice", "s", 0, 100).await.expect("read");
    let at = |c: EventChunk, stored_at| EventChunk { stored_at, ..c };
    assert_eq!(
        all,
        [
            at(chunk(1, 10), BASE + 1),
            at(chunk(11, 25), BASE + 2),
            at(chunk(26, 26), BASE + 3)
        ],
        "each chunk with when it was stored"
    );
    let range = |c: &[EventChunk]| c.iter().map(|c| (c.seq_from, c.seq_to)).collect::<Vec<_>>();
    assert_eq!(
        range(&s.read_events("alice", "s", 9, 100).await.expect("read")),
        [(1, 10), (11, 25), (26, 26)]
    );
    assert_eq!(
        range(&s.read_events("alice", "s", 10, 100).await.expect("read")),
        [(11, 25), (26, 26)]
    );
    assert_eq!(
        range(&s.read_events("alice", "s", 12, 100).await.expect("read")),
        [(11, 25), (26, 26)],
        "mid-chunk"
    );
    assert_eq!(
        range(&s.read_events("alice", "s", 25, 100).await.expect("read")),
        [(26, 26)]
    );
    assert_eq!(range(&s.read_events("alice", "s", 26, 100).await.expect("read")), []);
    assert_eq!(
        range(&s.read_events("alice", "s", 0, 2).await.expect("read")),
        [(1, 10), (11, 25)],
        "max_chunks"
    );
    assert_eq!(
        range(&s.read_events("alice", "t", 0, 100).await.expect("read")),
        [(1, 1)]
    );
    assert_eq!(s.read_events("bob", "s", 0, 100).await.expect("read"), []);
    assert_eq!(s.read_events("alice", "missing", 0, 100).await.expect("read"), []);
    let rec = s.get_session("alice", "s").await.expect("get").expect("s");
    assert_eq!((rec.last_seq, rec.updated_at), (26, BASE + 3));
}

async fn writes_for_deleted_sessions_are_dropped(backend: Backend) {
    let db = open(backend).await;
    let s = &*db.store;
    create(s, "gone", "alice", "/w", "{}", BASE).await;
    create(s, "kept", "alice", "/w", "{}", BASE).await;
    assert!(s.delete_session("alice", "gone").await.expect("delete"));
    s.write_batch(&[
        events("gone", chunk(1, 5), BASE + 1),
        SessionWrite {
            session_id: Arc::from("gone"),
            prompts: 1,
            agent_title: Some("x".into()),
            updated_at: BASE + 1,
            ..Default::default()
        },
        events("kept", chunk(1, 5), BASE + 1),
    ])
    .await
    .expect("a batch naming a deleted session still succeeds");
    s.write_batch(&[events("never-existed", chunk(1, 1), BASE + 2)])
        .await
        .expect("unknown session: dropped");
    assert_eq!(
        s.get_session("alice", "gone").await.expect("get"),
        None,
        "not resurrected"
    );
    assert_eq!(s.read_events("alice", "gone", 0, 100).await.expect("read"), []);
    assert_eq!(
        s.read_events("alice", "kept", 0, 100).await.expect("read"),
        [EventChunk {
            stored_at: BASE + 1,
            ..chunk(1, 5)
        }],
        "the rest of the batch is stored, with when it was stored"
    );
    // Recreating the id later starts with an empty transcript.
    create(s, "gone", "alice", "/w", "{}", BASE + 3).await;
    assert_eq!(s.read_events("alice", "gone", 0, 100).await.expect("read"), []);
}

/// Two writers numbering the same session (two replicas without affinity) must not wedge the
/// transcript writer: the second chunk for a seq range is skipped and the rest of its batch lands.
async fn a_conflicting_chunk_is_skipped_not_retried(backend: Backend) {
    let db = open(backend).await;
    let s = &*db.store;
    create(s, "a", "alice", "/w", "{}", BASE).await;
    create(s, "b", "alice", "/w", "{}", BASE).await;
    s.write_batch(&[events("a", chunk(1, 5), BASE + 1)])
        .await
        .expect("first write");
    s.write_batch(&[events("a", chunk(1, 3), BASE + 2), events("b", chunk(1, 2), BASE + 2)])
        .await
        .expect("a batch with a conflicting chunk still succeeds");
    assert_eq!(
        s.read_events("alice", "a", 0, 100).await.expect("read"),
        [EventChunk {
            stored_at: BASE + 1,
            ..chunk(1, 5)
        }],
        "the first writer's chunk stays"
    );
    assert_eq!(
        s.read_events("alice", "b", 0, 100).await.expect("read"),
        [EventChunk {
            stored_at: BASE + 2,
            ..chunk(1, 2)
        }],
        "the rest of the batch is stored"
    );
}

async fn delete_removes_the_transcript(backend: Backend) {
    let db = open(backend).await;
    let s = &*db.store;
    create(s, "s", "alice", "/w", "{}", BASE).await;
    create(s, "other", "alice", "/w", "{}", BASE).await;
    for k in 0..5 {
        s.write_batch(&[
            events("s", chunk(k * 10 + 1, k * 10 + 10), BASE + k),
            events("other", chunk(k + 1, k + 1), BASE + k),
        ])
        .await
        .expect("write");
    }
    assert_eq!(s.read_events("alice", "s", 0, 100).await.expect("read").len(), 5);
    assert!(s.delete_session("alice", "s").await.expect("delete"));
    // Recreate the same id: any transcript row left behind would show up again.
    create(s, "s", "alice", "/w", "{}", BASE + 100).await;
    assert_eq!(s.read_events("alice", "s", 0, 100).await.expect("read"), []);
    assert_eq!(s.get_session("alice", "s").await.expect("get").expect("s").last_seq, 0);
    assert_eq!(
        s.read_events("alice", "other", 0, 100).await.expect("read").len(),
        5,
        "other sessions keep theirs"
    );
}

async fn cursor_key_is_stable(backend: Backend) {
    let db = open(backend).await;
    let k1 = db.store.cursor_key().await.expect("key");
    let k2 = db.store.cursor_key().await.expect("key again");
    assert_eq!(k1.len(), 32);
    assert_eq!(k1, k2, "same key on one connection pool");
    let second = store::connect(&db.url).await.expect("second connection");
    assert_eq!(
        second.cursor_key().await.expect("key from a second pool"),
        k1,
        "every replica shares it"
    );
    // A brand-new database gets its own key.
    let other = open(backend).await;
    assert_ne!(other.store.cursor_key().await.expect("key"), k1);
}

/// `owner`'s stored bytes, through the store and through its bounded wrapper alike.
async fn stored(store: &Arc<dyn Store>, owner: &str) -> u64 {
    let bytes = store.stored_bytes(owner).await.expect("stored bytes");
    let bounded = store::Bounded::new(store.clone(), std::time::Duration::from_secs(5));
    assert_eq!(bounded.stored_bytes(owner).await.expect("bounded"), bytes);
    bytes
}

/// Bytes of every stored chunk of `owner`'s session `id`, read back.
async fn read_back(store: &dyn Store, owner: &str, id: &str) -> u64 {
    let chunks = store.read_events(owner, id, 0, 100_000).await.expect("read");
    chunks.iter().map(|c| c.payload.len() as u64).sum()
}

/// A user's stored bytes are the bytes of the payloads stored for their sessions, whichever way
/// the writer stores them; chunks not stored do not count, nor do deleted sessions or other
/// users' sessions.
async fn stored_bytes_count_each_users_stored_transcript(backend: Backend) {
    let db = open(backend).await;
    let s = &*db.store;
    for (id, owner) in [("a1", "alice"), ("a2", "alice"), ("b1", "bob")] {
        create(s, id, owner, "/w", "{}", BASE).await;
    }
    assert_eq!(stored(&db.store, "alice").await, 0);
    assert_eq!(stored(&db.store, "nobody").await, 0);

    // One session's updates alone.
    let c1 = chunk(1, 10);
    s.write_batch(&[events("a1", c1.clone(), BASE + 1)])
        .await
        .expect("write");
    assert_eq!(stored(&db.store, "alice").await, c1.payload.len() as u64);
    // Several sessions, metadata and a multi-byte payload in one flush.
    let wide = EventChunk {
        seq_from: 1,
        seq_to: 2,
        payload: "{\"text\":\"Grüße, 世界\"}\n{\"text\":\"🙂\"}".into(),
        stored_at: 0,
    };
    assert!(
        wide.payload.len() > wide.payload.chars().count(),
        "bytes, not characters"
    );
    s.write_batch(&[
        events("a1", chunk(11, 12), BASE + 2),
        SessionWrite {
            session_id: Arc::from("a2"),
            chunk: Some(wide.clone()),
            prompt_title: Some("hello".into()),
            prompts: 1,
            updated_at: BASE + 2,
            ..Default::default()
        },
        events("b1", chunk(1, 3), BASE + 2),
    ])
    .await
    .expect("write");
    // Metadata alone, a chunk already stored (skipped), and a deleted session's chunk change nothing.
    set_title(s, "a1", "renamed").await;
    s.write_batch(&[
        events("a1", chunk(1, 4), BASE + 3),
        events("gone", chunk(1, 4), BASE + 3),
    ])
    .await
    .expect("write");
    let (a1, a2) = (read_back(s, "alice", "a1").await, read_back(s, "alice", "a2").await);
    assert_eq!(a1, (c1.payload.len() + chunk(11, 12).payload.len()) as u64);
    assert_eq!(a2, wide.payload.len() as u64);
    assert_eq!(stored(&db.store, "alice").await, a1 + a2);
    assert_eq!(stored(&db.store, "bob").await, chunk(1, 3).payload.len() as u64);

    assert!(s.delete_session("alice", "a1").await.expect("delete"));
    assert_eq!(
        stored(&db.store, "alice").await,
        a2,
        "a deleted session no longer counts"
    );
    create(s, "a1", "alice", "/w", "{}", BASE + 10).await;
    assert_eq!(stored(&db.store, "alice").await, a2, "nor does a new one under its id");
    assert!(s.delete_session("alice", "a2").await.expect("delete"));
    assert_eq!(stored(&db.store, "alice").await, 0);
    assert_eq!(stored(&db.store, "bob").await, chunk(1, 3).payload.len() as u64);
}

/// A database migrated before the search index and the stored-bytes column: the sessions in it
/// are found by search, and their transcripts counted, once the gateway has migrated it.
async fn migrations_fill_in_sessions_stored_before_them(backend: Backend) {
    /// The first migration of the search index; the stored bytes come after it.
    const FIRST_NEW: i64 = 20261123000001;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = match backend {
        Backend::Sqlite => format!("sqlite://{}/old.db", dir.path().display()),
        Backend::Postgres => common::pg::fresh_database().await,
    };
    let folder = match backend {
        Backend::Sqlite => "migrations/sqlite",
        Backend::Postgres => "migrations/postgres",
    };
    let mut old = sqlx::migrate::Migrator::new(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(folder))
        .await
        .expect("migrations");
    old.migrations = old
        .migrations
        .iter()
        .filter(|m| m.version < FIRST_NEW)
        .cloned()
        .collect::<Vec<_>>()
        .into();
    // With the `last_seq` the gateway of those migrations gave them (SQLite's trigger then, the
    // writer's statement on Postgres, each advanced the row with the chunk).
    let sessions = "INSERT INTO sessions (id, owner, agent, cwd, title, meta, created_at, updated_at, last_seq)
                    VALUES ('old1', 'alice', 'demo', '/w', 'Written before the index', '{\"ticket\":\"OPS-77\"}', 1, 1, 3),
                           ('old2', 'bob', 'demo', '/w', 'Also written before', '{}', 1, 1, 1)";
    let transcript = "INSERT INTO session_events (session_id, seq_from, seq_to, payload, created_at)
                  VALUES ('old1', 1, 2, 'twelve bytes', 1), ('old1', 3, 3, 'é', 1), ('old2', 1, 1, 'xyz', 1)";
    match backend {
        Backend::Sqlite => {
            let options = sqlx::sqlite::SqliteConnectOptions::from_str(&url)
                .expect("url")
                .create_if_missing(true);
            let pool = sqlx::SqlitePool::connect_with(options).await.expect("sqlite");
            old.run(&pool).await.expect("old migrations");
            pool.execute(sessions).await.expect("sessions");
            pool.execute(transcript).await.expect("events");
            pool.close().await;
        }
        Backend::Postgres => {
            let pool = sqlx::PgPool::connect(&url).await.expect("postgres");
            old.run(&pool).await.expect("old migrations");
            // Under those migrations' row-level security, FORCEd on the owner: system work.
            let mut tx = pool.begin().await.expect("begin");
            tx.execute("SELECT set_config('acp_gateway.system', 'on', true)")
                .await
                .expect("system");
            tx.execute(sessions).await.expect("sessions");
            tx.execute(transcript).await.expect("events");
            tx.commit().await.expect("commit");
            pool.close().await;
        }
    }

    let store = store::connect(&url).await.expect("the gateway migrates the rest");
    assert_eq!(search(&*store, "alice", "BEFORE THE").await, ["old1"]);
    assert_eq!(search(&*store, "alice", "ops-77").await, ["old1"]);
    assert_eq!(search(&*store, "alice", "be").await, ["old1"], "a short search");
    assert_eq!(search(&*store, "bob", "before").await, ["old2"]);
    assert_eq!(stored(&store, "alice").await, 12 + 2);
    assert_eq!(stored(&store, "bob").await, 3);
    // And both go on from there.
    store
        .write_batch(&[events("old1", chunk(4, 4), 2)])
        .await
        .expect("write");
    assert_eq!(stored(&store, "alice").await, 14 + chunk(4, 4).payload.len() as u64);
    set_title(&*store, "old1", "Renamed after").await;
    assert_eq!(search(&*store, "alice", "before").await, Vec::<String>::new());
    assert_eq!(search(&*store, "alice", "renamed after").await, ["old1"]);
}

/// Records one session's commit notices from the writer.
#[derive(Default)]
struct Told(std::sync::Mutex<Vec<u64>>);

impl acp_gateway::store::persister::Committed for Told {
    fn committed(&self, seq: u64) {
        self.0.lock().expect("lock").push(seq);
    }
    /// These writes never fail for good; the seqs told are what the tests check.
    fn lost(&self) {}
}

async fn persister_stores_everything_in_order(backend: Backend) {
    const PER_SESSION: u64 = 10_000;
    let db = open(backend).await;
    let sessions: Vec<Arc<str>> = ["p1", "p2", "p3"].into_iter().map(Arc::from).collect();
    for id in &sessions {
        create(&*db.store, id, "alice", "/w", "{}", BASE).await;
    }
    let cancel = CancellationToken::new();
    let (persister, task) = Persister::spawn(db.store.clone(), 256, 1 << 20, cancel.clone());
    let told: Vec<Arc<Told>> = sessions.iter().map(|_| Arc::new(Told::default())).collect();
    for seq in 1..=PER_SESSION {
        for (k, id) in sessions.iter().enumerate() {
            if seq == 1 {
                persister
                    .send(Item::Prompt {
                        session: id.clone(),
                        title: Some(format!("title {k}")),
                        through: 0,
                    })
                    .await;
            }
            let update =
                format!(r#"{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"{k}:{seq}"}}}}"#);
            persister
                .send(Item::Update {
                    session: id.clone(),
                    notify: told[k].clone(),
                    seq,
                    update: update.into(),
                    at: BASE + seq as i64,
                    more: false,
                })
                .await;
        }
    }
    persister
        .flush_within(std::time::Duration::from_secs(60))
        .await
        .expect("the writer flushes");
    for told in &told {
        let told = told.0.lock().expect("lock").clone();
        assert_eq!(
            told.last(),
            Some(&PER_SESSION),
            "the writer says how far updates are committed"
        );
        assert!(told.windows(2).all(|w| w[0] < w[1]), "only ever forwards: {told:?}");
    }
    let mut stored_by_writer = 0;
    for (k, id) in sessions.iter().enumerate() {
        let chunks = db.store.read_events("alice", id, 0, 1_000_000).await.expect("read");
        let mut next = 1;
        for c in &chunks {
            assert_eq!(c.seq_from, next, "{id}: chunks are contiguous");
            let lines: Vec<&str> = c.payload.split('\n').collect();
            assert_eq!(
                lines.len() as i64,
                c.seq_to - c.seq_from + 1,
                "{id}: one line per update"
            );
            for line in lines {
                let v: serde_json::Value = serde_json::from_str(line).expect("each line is JSON");
                assert_eq!(
                    v["content"]["text"],
                    format!("{k}:{next}"),
                    "{id}: update {next} in order"
                );
                next += 1;
            }
        }
        assert_eq!(next, PER_SESSION as i64 + 1, "{id}: all {PER_SESSION} updates stored");
        let rec = db.store.get_session("alice", id).await.expect("get").expect("session");
        assert_eq!((rec.last_seq, rec.message_count), (PER_SESSION as i64, 1));
        stored_by_writer += chunks.iter().map(|c| c.payload.len() as u64).sum::<u64>();
        assert_eq!(rec.updated_at, BASE + PER_SESSION as i64);
        assert_eq!(rec.title, Some(format!("title {k}")));
        assert!(
            chunks.len() < PER_SESSION as usize / 4,
            "{id}: updates were batched ({} chunks)",
            chunks.len()
        );
    }
    assert_eq!(
        stored(&db.store, "alice").await,
        stored_by_writer,
        "the writer's chunks are counted as stored"
    );
    drop(persister);
    tokio::time::timeout(common::WAIT, task)
        .await
        .expect("writer stops when its handles are dropped")
        .expect("writer task");
}

/// A role that may not create pg_trgm (not the database's owner; Postgres 15 lets no one else
/// create in `public` unless granted) still starts the gateway: the migration goes on without the
/// trigram indexes, and searches scan as they did before them.
#[tokio::test]
async fn postgres_search_works_without_pg_trgm() {
    let name = uuid::Uuid::new_v4().simple().to_string();
    let (role, database) = (format!("no_trgm_{name}"), format!("no_trgm_{name}"));
    let mut admin = PgConnection::connect(&common::pg::admin_url("postgres").await)
        .await
        .expect("admin");
    for sql in [
        format!("CREATE ROLE {role} LOGIN NOSUPERUSER NOBYPASSRLS PASSWORD 'pw'"),
        format!("CREATE DATABASE {database}"),
    ] {
        admin.execute(sql.as_str()).await.expect("role and database");
    }
    let mut in_db = PgConnection::connect(&common::pg::admin_url(&database).await)
        .await
        .expect("admin in the database");
    in_db
        .execute(format!("GRANT CREATE ON SCHEMA public TO {role}").as_str())
        .await
        .expect("grant");
    let preinstalled: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm')")
        .fetch_one(&mut in_db)
        .await
        .expect("extensions");
    let _ = in_db.close().await;

    common::pg::provision_request_role(&mut admin, &role)
        .await
        .expect("request role");
    let url = common::pg::url_as(&role, "pw", &database).await;
    let s = store::connect(&url).await.expect("starts without pg_trgm");
    let mut c = PgConnection::connect(&url).await.expect("connect");
    let indexed: bool = sqlx::query_scalar("SELECT to_regclass('session_search_title_trgm') IS NOT NULL")
        .fetch_one(&mut c)
        .await
        .expect("index");
    let _ = c.close().await;
    assert!(preinstalled || !indexed, "the index needs the extension");
    for (i, (id, owner, title)) in [
        ("a1", "alice", "Fix the 100% CPU bug"),
        ("a2", "alice", "Fix the 1000 CPU bug"),
        ("b1", "bob", "Fix the 100% CPU bug"),
    ]
    .into_iter()
    .enumerate()
    {
        create(&*s, id, owner, "/w", "{}", BASE + i as i64).await;
        set_title(&*s, id, title).await;
    }
    assert_eq!(search(&*s, "alice", "100%").await, ["a1"]);
    assert_eq!(search(&*s, "alice", "fix THE").await, ["a2", "a1"]);
    assert_eq!(search(&*s, "alice", "1000").await, ["a2"]);
    assert_eq!(search(&*s, "bob", "cpu").await, ["b1"]);
    set_title(&*s, "a2", "Renamed").await;
    assert_eq!(search(&*s, "alice", "1000").await, Vec::<String>::new());

    drop(s);
    let _ = admin
        .execute(format!("DROP DATABASE {database} WITH (FORCE)").as_str())
        .await;
    let _ = admin.execute(format!("DROP ROLE {role}").as_str()).await;
    let _ = admin.close().await;
}

/// SQLite's transcript writer stores chunks without touching their sessions and advances the
/// rows once the queue is quiet. A gateway killed in between leaves rows behind their chunks:
/// the session still reads with its newest stored seq (updates go on numbering above it), and
/// opening the database again advances the rows (last_seq, updated_at, stored bytes).
#[tokio::test]
async fn sqlite_rows_left_behind_their_chunks_are_advanced_when_opened() {
    let db = open(Backend::Sqlite).await;
    create(&*db.store, "k1", "alice", "/w", "{}", BASE).await;
    create(&*db.store, "k2", "alice", "/w", "{}", BASE).await;
    let (first, lone, second) = (chunk(1, 5), chunk(6, 6), chunk(1, 2));
    {
        let mut writer = db
            .store
            .transcript_writer()
            .expect("a file has a writer of its own")
            .expect("writer opens");
        writer
            .write_batch(&[
                events("k1", first.clone(), BASE + 5),
                events("k2", second.clone(), BASE + 7),
            ])
            .expect("batch");
        writer
            .write_batch(&[events("k1", lone.clone(), BASE + 6)])
            .expect("lone chunk");
        assert!(writer.unsettled_since().is_some(), "the rows are put off");
        // Dropped without settling: as if the gateway were killed here.
    }
    let rec = db.store.get_session("alice", "k1").await.expect("get").expect("k1");
    assert_eq!(rec.last_seq, 6, "a session reads with its newest stored seq");
    let rows = list_all(&*db.store, "alice", &ListFilter::default()).await;
    assert!(
        rows.iter().all(|r| r.last_seq == 0),
        "the rows themselves lag: {rows:?}"
    );
    assert_eq!(stored(&db.store, "alice").await, 0);

    let reopened: Arc<dyn Store> = store::connect(&db.url).await.expect("reopen");
    let rows = list_all(&*reopened, "alice", &ListFilter::default()).await;
    let row = |id: &str| rows.iter().find(|r| r.id == id).cloned().expect("row");
    assert_eq!((row("k1").last_seq, row("k1").updated_at), (6, BASE + 6));
    assert_eq!((row("k2").last_seq, row("k2").updated_at), (2, BASE + 7));
    let all = first.payload.len() + lone.payload.len() + second.payload.len();
    assert_eq!(stored(&reopened, "alice").await, all as u64);
    assert_eq!(
        read_back(&*reopened, "alice", "k1").await + read_back(&*reopened, "alice", "k2").await,
        all as u64
    );

    // Settled rows are left alone by the next opening, and a settle counts each chunk once.
    let mut writer = reopened.transcript_writer().expect("writer").expect("opens");
    writer
        .write_batch(&[events("k1", chunk(7, 8), BASE + 9)])
        .expect("write");
    writer.settle().expect("settle");
    assert!(writer.unsettled_since().is_none());
    drop(writer);
    let again: Arc<dyn Store> = store::connect(&db.url).await.expect("reopen");
    assert_eq!(stored(&again, "alice").await, (all + chunk(7, 8).payload.len()) as u64);
    let rec = again.get_session("alice", "k1").await.expect("get").expect("k1");
    assert_eq!((rec.last_seq, rec.updated_at), (8, BASE + 9));
}
