//! Transcripts: chunks stored and read back, skipped when they cannot be, counted per user, kept
//! across migrations, and the writer storing everything in order.

use super::*;

on_both_backends!(
    events_round_trip,
    a_page_ends_past_its_size,
    writes_for_deleted_sessions_are_dropped,
    a_conflicting_chunk_is_skipped_not_retried,
    delete_removes_the_transcript,
    cursor_key_is_stable,
    persister_stores_everything_in_order,
    stored_bytes_count_each_users_stored_transcript,
    migrations_fill_in_sessions_stored_before_them,
);

/// A page of the transcript ends at the first chunk that starts past about 256 KiB of payload,
/// so a replay's memory stays flat however large the chunks; small chunks come many to a page.
async fn a_page_ends_past_its_size(backend: Backend) {
    let db = open(backend).await;
    let s = &*db.store;
    create(s, "big", "alice", "/w", "{}", BASE).await;
    create(s, "small", "alice", "/w", "{}", BASE).await;
    let range = |c: &[EventChunk]| c.iter().map(|c| (c.seq_from, c.seq_to)).collect::<Vec<_>>();
    let text = "x".repeat(100 << 10);
    for n in 1..=5 {
        let mut c = chunk(n, n);
        c.payload = serde_json::json!({ "n": n, "text": text }).to_string();
        s.write_batch(&[events("big", c, BASE + n)]).await.expect("write");
    }
    let page = s.read_events("alice", "big", 0, 100).await.expect("read");
    assert_eq!(
        range(&page),
        [(1, 1), (2, 2), (3, 3)],
        "the third starts within 256 KiB, the fourth past it"
    );
    let next = s.read_events("alice", "big", 3, 100).await.expect("read");
    assert_eq!(range(&next), [(4, 4), (5, 5)]);
    let one = s.read_events("alice", "big", 0, 1).await.expect("read");
    assert_eq!(range(&one), [(1, 1)], "never more than max_chunks");
    for n in 1..=300 {
        s.write_batch(&[events("small", chunk(n, n), BASE + n)])
            .await
            .expect("write");
    }
    let page = s.read_events("alice", "small", 0, 1024).await.expect("read");
    assert_eq!(page.len(), 300, "small chunks: one page");
    assert_eq!(read_all(s, "alice", "big").await.len(), 5);
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
    let seqs = |id: &'static str| {
        let store = store.clone();
        async move {
            let chunks = store.read_events(if id == "old1" { "alice" } else { "bob" }, id, 0, 100);
            chunks
                .await
                .expect("read")
                .iter()
                .map(|c| (c.seq_from, c.seq_to))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        seqs("old1").await,
        [(1, 2), (3, 3), (4, 4)],
        "chunks stored before read back in order"
    );
    assert_eq!(seqs("old2").await, [(1, 1)]);
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
        let chunks = read_all(&*db.store, "alice", id).await;
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
