//! Creating, reading, listing and deleting sessions, each owner apart, and paging through them.

use super::*;

on_both_backends!(
    create_get_list_delete,
    foreign_sessions_are_invisible,
    list_never_crosses_owners_under_any_filter,
    keyset_pagination_sees_each_session_once_while_sessions_are_added,
);

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
