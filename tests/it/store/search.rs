//! Searching sessions: what the index finds, after renames and deletes, and how searches page.

use super::*;

on_both_backends!(
    search_is_a_case_insensitive_substring_of_title_or_meta,
    search_follows_renames_and_deletes,
    common_and_rare_searches_page_alike,
);

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
