//! What only one backend has: Postgres without pg_trgm, its chunks compressed with LZ4, its
//! transcript writer's connection; SQLite rows left behind their chunks.

use super::*;

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

/// SQLite keys a chunk by its session's number and its seq_from: a session's chunks are one range
/// of the table's rowid. Numbers must stay each session's own through deletes (a new session may
/// take a deleted one's number, never a live one's) and VACUUM (which may renumber the rowids
/// of `sessions`, never its `num` column), and a seq past the key's 32 bits is refused, not stored in
/// the next session's range.
#[tokio::test]
async fn sqlite_chunks_stay_with_their_session_through_deletes_and_vacuum() {
    let db = open(Backend::Sqlite).await;
    let s = &*db.store;
    for id in ["v1", "v2", "v3"] {
        create(s, id, "alice", "/w", "{}", BASE).await;
    }
    let write = |id: &'static str, from: i64| events(id, chunk(from, from + 1), BASE + from);
    s.write_batch(&[write("v1", 1), write("v2", 1), write("v3", 1)])
        .await
        .expect("write");
    // The newest session goes (its number is the next one's), then an older one.
    assert!(s.delete_session("alice", "v3").await.expect("delete"));
    create(s, "v4", "alice", "/w", "{}", BASE).await;
    assert!(s.delete_session("alice", "v1").await.expect("delete"));
    let raw = sqlx::SqlitePool::connect(&db.url).await.expect("sqlite");
    raw.execute("VACUUM").await.expect("vacuum");
    create(s, "v5", "alice", "/w", "{}", BASE).await;
    s.write_batch(&[write("v2", 3), write("v4", 1), write("v5", 1), write("v5", 3)])
        .await
        .expect("write");
    let seqs = |id: &'static str| async move {
        s.read_events("alice", id, 0, 100)
            .await
            .expect("read")
            .iter()
            .map(|c| (c.seq_from, c.seq_to))
            .collect::<Vec<_>>()
    };
    assert_eq!(seqs("v1").await, [], "a deleted session reads nothing");
    assert_eq!(seqs("v2").await, [(1, 2), (3, 4)]);
    assert_eq!(seqs("v3").await, []);
    assert_eq!(seqs("v4").await, [(1, 2)], "a number used again brings no chunk back");
    assert_eq!(seqs("v5").await, [(1, 2), (3, 4)]);
    let numbers: Vec<(String, i64)> = sqlx::query_as("SELECT id, num FROM sessions ORDER BY num")
        .fetch_all(&raw)
        .await
        .expect("numbers");
    let distinct: std::collections::HashSet<_> = numbers.iter().map(|(_, n)| *n).collect();
    assert_eq!(
        distinct.len(),
        3,
        "each live session has a number of its own: {numbers:?}"
    );

    let past = 1_i64 << 32;
    let refused = s.write_batch(&[write("v2", past)]).await;
    assert!(refused.is_err(), "a seq past 32 bits is refused, not stored elsewhere");
    assert_eq!(seqs("v2").await, [(1, 2), (3, 4)]);
    assert_eq!(seqs("v4").await, [(1, 2)]);
    raw.close().await;
}

/// A long chunk (a streamed burst) is compressed with LZ4 on a Postgres that has it (pglz cost
/// as much CPU as the gateway's own work while streaming), and reads back whole.
#[tokio::test]
async fn postgres_compresses_long_chunks_with_lz4_where_it_can() {
    let db = open(Backend::Postgres).await;
    create(&*db.store, "s", "alice", "/w", "{}", BASE).await;
    let c = chunk(1, 2_000);
    let payload = c.payload.clone();
    db.store.write_batch(&[events("s", c, BASE + 1)]).await.expect("stored");
    let mut conn = PgConnection::connect(&db.url).await.expect("connect");
    let has_lz4: bool =
        sqlx::query_scalar("SELECT 'lz4' = ANY (enumvals) FROM pg_settings WHERE name = 'default_toast_compression'")
            .fetch_optional(&mut conn)
            .await
            .expect("settings")
            .unwrap_or(false);
    let method: Option<String> = sqlx::query_scalar("SELECT pg_column_compression(payload) FROM session_events")
        .fetch_one(&mut conn)
        .await
        .expect("compression");
    let _ = conn.close().await;
    assert_eq!(
        method.as_deref(),
        Some(if has_lz4 { "lz4" } else { "pglz" }),
        "a {} byte chunk",
        payload.len()
    );
    let back = db.store.read_events("alice", "s", 0, 10).await.expect("read");
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].payload, payload, "whole");
}

/// The backends of the database other than the asking one, after `SELECT`.
const OTHERS: &str = "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()";

/// Ends every other connection to the test's database and waits until their backends are gone
/// (`pg_terminate_backend` only signals them).
async fn terminate_others(url: &str) {
    let mut conn = PgConnection::connect(url).await.expect("connect");
    sqlx::query(&format!("SELECT pg_terminate_backend(pid) {OTHERS}"))
        .execute(&mut conn)
        .await
        .expect("terminate");
    assert!(
        others_end(&mut conn).await,
        "the other backends did not end within 10 s"
    );
    let _ = conn.close().await;
}

/// Whether the backends of `conn`'s database other than its own are all gone within 10 s.
async fn others_end(conn: &mut PgConnection) -> bool {
    let count = format!("SELECT count(*) {OTHERS}");
    tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while sqlx::query_scalar::<_, i64>(&count)
            .fetch_one(&mut *conn)
            .await
            .expect("count")
            > 0
        {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .is_ok()
}

/// Postgres's transcript writer keeps its connection between writes (sqlx would ping one given
/// back to the pool on every commit), and gives it back once it has been idle for 10 s: a
/// connection ended while the gateway was quiet (a server restart, an idle timeout, a firewall)
/// fails one write right after, which the writer retries on a new one, but not a write after
/// the pause.
#[tokio::test]
async fn postgres_transcript_writer_keeps_its_connection_and_gives_it_back_when_idle() {
    let db = open(Backend::Postgres).await;
    create(&*db.store, "s", "alice", "/w", "{}", BASE).await;
    let write = |n: i64| {
        let store = db.store.clone();
        async move {
            store
                .write_chunks_unsettled(&[events("s", chunk(n, n), BASE + n)], None)
                .await
        }
    };
    write(1).await.expect("first write");
    // The kept connection is the one ended: the next write fails on it, and the one after
    // takes a new connection.
    terminate_others(&db.url).await;
    assert!(write(2).await.is_err(), "a write on the ended connection fails");
    write(2).await.expect("the retry, on a new connection");
    // Ended again, then 10 s without a write: the writer does not write on it.
    terminate_others(&db.url).await;
    tokio::time::sleep(std::time::Duration::from_millis(10_500)).await;
    write(3).await.expect("a write after the writer was idle for 10 s");
    let seqs: Vec<i64> = db
        .store
        .read_events("alice", "s", 0, 10)
        .await
        .expect("read")
        .iter()
        .map(|c| c.seq_from)
        .collect();
    assert_eq!(seqs, [1, 2, 3], "every update stored once");
}

/// A Postgres store dropped where no Tokio runtime runs (after its runtime, as a program's main
/// thread may drop it) closes the transcript writer's kept connection instead of panicking: sqlx
/// gives a pooled connection back in a task of its own, which needs a runtime. The benchmark's
/// Postgres runs all ended in that panic.
#[test]
fn postgres_store_dropped_outside_a_runtime_closes_the_writers_connection() {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    };
    let db = runtime().block_on(async {
        let db = open(Backend::Postgres).await;
        create(&*db.store, "s", "alice", "/w", "{}", BASE).await;
        db.store
            .write_chunks_unsettled(&[events("s", chunk(1, 1), BASE + 1)], None)
            .await
            .expect("write");
        db
    });
    // Its runtime is gone: the writer keeps the connection it wrote through.
    let url = db.url.clone();
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(db)));
    assert!(dropped.is_ok(), "dropping the store outside a runtime panicked");
    runtime().block_on(async {
        let mut conn = PgConnection::connect(&url).await.expect("connect");
        assert!(
            others_end(&mut conn).await,
            "the store's connections were still open 10 s after it was dropped"
        );
        let _ = conn.close().await;
    });
}
