//! `session/list` at scale: fills a SQLite file and a Postgres database with `LIST_BENCH_ROWS`
//! sessions (default 1,000,000) over ~1000 users, one of them "heavy" with a tenth of all rows,
//! then times `Store::list_sessions` for that user and prints the query plans. Searches are timed
//! twice, side by side: "scan" is the query as it was before the search indexes (every one of the
//! user's sessions tested with `LIKE`/`ILIKE`, run as the store ran it), "store" is what
//! `Store::list_sessions` does now; both must return the same rows.
//!
//! `Store::stored_bytes` (a sum over the user's sessions) is timed beside them.
//!
//! Then the write path, on fresh databases of `LIST_BENCH_WRITES` sessions (default 5,000), with
//! the search index's triggers and without them (and, on SQLite, with the trigger that advances a
//! session as it was before it counted stored bytes): creating sessions, renaming them, the
//! transcript writer's commits, deleting. On Postgres, where the writer's own `UPDATE` counts the
//! bytes, its two statements per commit are timed with and without that term.
//!
//! ```text
//! cargo bench --bench list_sessions                      # full size
//! LIST_BENCH_ROWS=50000 cargo bench --bench list_sessions # CI size
//! LIST_BENCH_BACKENDS=postgres cargo bench --bench list_sessions
//! LIST_BENCH_PARTS=writes cargo bench --bench list_sessions  # only the write path (or "reads")
//! ```
//!
//! Postgres: `DATABASE_URL=postgres://…` names a server to use; otherwise a throwaway server is
//! started (as the test harness does). The gateway's role there is an ordinary one, and request
//! work runs as the request role, so the timings include row-level security where the gateway has
//! it.

#[allow(dead_code, reason = "shared with the tests; the bench uses part of it")]
#[path = "../tests/common/pg.rs"]
mod pg;

use std::str::FromStr;
use std::time::{Duration, Instant};

use acp_gateway::store::{self, ListFilter, Position, SearchBy, SearchIndex, SessionRecord, Store};
use sqlx::{Connection, Executor, PgConnection, QueryBuilder, Row, SqliteConnection};

/// Runs per measured case.
const RUNS: usize = 50;
/// Page size the API asks the store for (`limit` 50, plus one to see whether more remain).
const PAGE: u32 = 51;
/// Rows per bulk-insert transaction.
const BATCH: i64 = 100_000;
/// Newest `updated_at` in the data (epoch µs).
const NOW: i64 = 1_790_000_000_000_000;
/// Spread of `updated_at`: 90 days.
const SPREAD: i64 = 90 * 86_400 * 1_000_000;
/// A word in about one title in a thousand (`g % 997 == 0`).
const RARE: &str = "needle";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
}

struct Case {
    name: &'static str,
    filter: ListFilter,
    after: Option<(i64, String)>,
}

#[tokio::main]
async fn main() {
    let rows: i64 = env_number("LIST_BENCH_ROWS", 1_000_000);
    let writes: i64 = env_number("LIST_BENCH_WRITES", 5_000);
    let which = std::env::var("LIST_BENCH_BACKENDS").unwrap_or_else(|_| "sqlite,postgres".into());
    let parts = std::env::var("LIST_BENCH_PARTS").unwrap_or_else(|_| "reads,writes".into());
    for backend in [Backend::Sqlite, Backend::Postgres] {
        if !which.contains(backend.key()) {
            continue;
        }
        if parts.contains("reads") {
            println!(
                "=== {}: list_sessions, {rows} sessions, ~1000 users, user \"heavy\" has {} ===",
                backend.label(),
                rows / 10
            );
            println!("each case: {RUNS} runs (limit {PAGE}) after 3 warm-up runs\n");
            let (url, _dir) = fresh(backend).await;
            run(backend, &url, rows).await;
        }
        if parts.contains("writes") {
            write_path(backend, writes).await;
            if backend == Backend::Postgres {
                stored_bytes_statements(writes).await;
            }
        }
    }
}

fn env_number(name: &str, default: i64) -> i64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

impl Backend {
    fn key(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Backend::Sqlite => "SQLite",
            Backend::Postgres => "Postgres",
        }
    }
}

/// A new, empty database (and the directory that holds it, for SQLite).
async fn fresh(backend: Backend) -> (String, Option<tempfile::TempDir>) {
    match backend {
        Backend::Sqlite => {
            let dir = tempfile::tempdir().expect("tempdir");
            (format!("sqlite://{}/bench.db", dir.path().display()), Some(dir))
        }
        Backend::Postgres => (pg::fresh_database().await, None),
    }
}

async fn run(backend: Backend, url: &str, rows: i64) {
    // Migrate through the store, then bulk-load beside it.
    drop(store::connect(url).await.expect("connect and migrate"));
    let started = Instant::now();
    match backend {
        Backend::Sqlite => fill_sqlite(url, rows).await,
        Backend::Postgres => fill_postgres(url, rows).await,
    }
    println!(
        "filled {rows} rows (the search index's triggers included) + ANALYZE in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // A fresh store, so that every connection has the new statistics.
    let store = store::connect(url).await.expect("connect");
    let heavy = rows / 10;
    let deep = deep_position(backend, url, heavy / 2).await;
    let search = |s: &str| ListFilter {
        search: Some(s.into()),
        ..Default::default()
    };
    let case = |name, filter, after| Case { name, filter, after };
    let cases = vec![
        case("first page", ListFilter::default(), None),
        case(
            "deep page (cursor at row ~50%)",
            ListFilter::default(),
            Some(deep.clone()),
        ),
        case(
            "cwd filter",
            ListFilter {
                cwd: Some("/home/heavy/proj7".into()),
                ..Default::default()
            },
            None,
        ),
        case("search (0.1% of rows match)", search(RARE), None),
        case("search (no match)", search("no-such-text"), None),
        case("search, deep page", search(RARE), Some(deep)),
        case("search (3.7% match: \"module 17\")", search("module 17"), None),
        case("search (all match: \"MODULE\")", search("MODULE"), None),
        case("search in meta (20%: \"feature-40\")", search("feature-40"), None),
        case("search, 2% of all, none of heavy's", search("feature-42"), None),
        case("search, 2 characters (\"17\")", search("17"), None),
        case(
            "search + cwd (0.1% of rows)",
            ListFilter {
                cwd: Some("/home/heavy/proj7".into()),
                search: Some(RARE.into()),
                ..Default::default()
            },
            None,
        ),
        case("light user, first page", ListFilter::default(), None),
        case("light user, search (no match)", search("no-such-text"), None),
        case("light user, search (0.1%)", search(RARE), None),
    ];
    let mut before = Before::open(backend, url).await;
    println!(
        "{:<36} {:>10} {:>10} | {:>10} {:>10} | {:>5}",
        "case", "scan p50", "scan p95", "store p50", "store p95", "rows"
    );
    for case in &cases {
        let owner = if case.name.starts_with("light") {
            "user042"
        } else {
            "heavy"
        };
        let (median, p95, page) = time_store(&*store, owner, case).await;
        let before = if case.filter.search.is_some() {
            let (median, p95, old) = time_scan(&mut before, owner, case).await;
            assert_eq!(ids(&old), ids(&page), "{}: the store and the scan disagree", case.name);
            format!("{:>10} {:>10}", fmt(median), fmt(p95))
        } else {
            format!("{:>10} {:>10}", "", "")
        };
        println!(
            "{:<36} {before} | {:>10} {:>10} | {:>5}",
            case.name,
            fmt(median),
            fmt(p95),
            page.len()
        );
    }
    for (name, owner) in [
        ("stored_bytes, heavy", "heavy"),
        ("stored_bytes, light user", "user042"),
    ] {
        let (median, p95, _) = time_runs(async || {
            store.stored_bytes(owner).await.expect("stored bytes");
            Vec::new()
        })
        .await;
        println!(
            "{name:<36} {:>10} {:>10} | {:>10} {:>10} |",
            "",
            "",
            fmt(median),
            fmt(p95)
        );
    }
    println!();
    // The store picks one of these per search (see `Sql::list_sessions` in src/store/sql.rs).
    let index = match backend {
        Backend::Sqlite => SearchIndex::Fts5,
        Backend::Postgres => SearchIndex::Trigram,
    };
    for case in cases.iter().filter(|c| !c.name.starts_with("light")) {
        let ways: &[(&str, SearchBy)] = match case.filter.search.as_deref() {
            None => &[("", SearchBy::Scan)],
            Some(s) if index.can_find(s) => &[
                (" (scan, as before)", SearchBy::Scan),
                (" (newest 2000 in list order)", SearchBy::Newest(store::SEARCH_PROBE)),
                (" (from the index)", SearchBy::Index(index)),
            ],
            Some(_) => &[
                (" (scan, as before)", SearchBy::Scan),
                (" (newest 2000 in list order)", SearchBy::Newest(store::SEARCH_PROBE)),
            ],
        };
        for (way, by) in ways {
            println!("--- plan: {}{way} ---", case.name);
            println!("{}", plan(backend, url, "heavy", case, *by).await);
        }
    }
}

fn ids(rows: &[SessionRecord]) -> Vec<&str> {
    rows.iter().map(|r| r.id.as_str()).collect()
}

fn fmt(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.0} µs")
    } else {
        format!("{:.2} ms", us / 1000.0)
    }
}

/// Median, 95th percentile and the last result of `RUNS` runs of `f`, after 3 warm-up runs.
async fn time_runs<F>(mut f: F) -> (Duration, Duration, Vec<SessionRecord>)
where
    F: AsyncFnMut() -> Vec<SessionRecord>,
{
    for _ in 0..3 {
        f().await;
    }
    let mut times = Vec::with_capacity(RUNS);
    let mut last = Vec::new();
    for _ in 0..RUNS {
        let t = Instant::now();
        last = f().await;
        times.push(t.elapsed());
    }
    times.sort();
    let p95 = times[(RUNS * 95).div_ceil(100) - 1];
    (times[RUNS / 2], p95, last)
}

async fn time_store(store: &dyn Store, owner: &str, case: &Case) -> (Duration, Duration, Vec<SessionRecord>) {
    let after = case.after.as_ref().map(|(t, id)| Position { updated_at: *t, id });
    time_runs(async || {
        store
            .list_sessions(owner, &case.filter, after, PAGE)
            .await
            .expect("list")
    })
    .await
}

/// The list query as it was before the search indexes, run as the stores ran it (Postgres: in a
/// transaction as the request role, naming the user with its signed identity, so under row-level
/// security; the connection is the tables' owner's, with the database's identity key).
enum Before {
    Sqlite(SqliteConnection),
    Postgres(PgConnection, Vec<u8>),
}

impl Before {
    async fn open(backend: Backend, url: &str) -> Self {
        match backend {
            Backend::Sqlite => Before::Sqlite(SqliteConnection::connect(url).await.expect("sqlite")),
            Backend::Postgres => {
                let mut c = PgConnection::connect(url).await.expect("postgres");
                let key = pg::identity_key(&mut c).await;
                Before::Postgres(c, key)
            }
        }
    }
}

async fn time_scan(scan: &mut Before, owner: &str, case: &Case) -> (Duration, Duration, Vec<SessionRecord>) {
    let after = case.after.as_ref().map(|(t, id)| Position { updated_at: *t, id });
    match scan {
        Before::Sqlite(c) => {
            time_runs(async || {
                store::list_query::<sqlx::Sqlite>("", owner, &case.filter, after, PAGE, "LIKE", SearchBy::Scan)
                    .build_query_as()
                    .fetch_all(&mut *c)
                    .await
                    .expect("scan")
            })
            .await
        }
        Before::Postgres(c, key) => {
            let identity = pg::signed_identity(key, owner);
            time_runs(async || {
                let mut tx = c.begin().await.expect("begin");
                sqlx::query(pg::ACT_AS)
                    .bind(&identity)
                    .execute(&mut *tx)
                    .await
                    .expect("user");
                let rows =
                    store::list_query::<sqlx::Postgres>("", owner, &case.filter, after, PAGE, "ILIKE", SearchBy::Scan)
                        .build_query_as()
                        .fetch_all(&mut *tx)
                        .await
                        .expect("scan");
                tx.commit().await.expect("commit");
                rows
            })
            .await
        }
    }
}

async fn fill_sqlite(url: &str, rows: i64) {
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(url).expect("url");
    let mut c = SqliteConnection::connect_with(&options).await.expect("sqlite");
    c.execute("PRAGMA synchronous = OFF").await.expect("pragma");
    let mut from = 1;
    while from <= rows {
        let to = (from + BATCH - 1).min(rows);
        let mut tx = c.begin().await.expect("begin");
        sqlx::query(&format!(
            "INSERT INTO sessions (id, owner, agent, cwd, title, meta, message_count, last_seq, created_at, updated_at)
             WITH RECURSIVE seq(g) AS (SELECT ?1 UNION ALL SELECT g + 1 FROM seq WHERE g < ?2),
             gen(g, owner, u) AS (
                 SELECT g,
                        CASE WHEN g % 10 = 0 THEN 'heavy' ELSE 'user' || printf('%03d', (g * 7919) % 999) END,
                        {NOW} - abs(random() % {SPREAD})
                 FROM seq)
             SELECT lower(hex(randomblob(16))), owner, 'demo',
                    '/home/' || owner || '/proj' || ((g / 10) % 20),
                    'Session ' || g || CASE WHEN g % 997 = 0 THEN ' {RARE}' ELSE ' about module ' || (g % 300) END,
                    '{{\"branch\":\"feature-' || (g % 50) || '\"}}',
                    g % 40, g % 500, u - abs(random() % 86400000000), u
             FROM gen"
        ))
        .bind(from)
        .bind(to)
        .execute(&mut *tx)
        .await
        .expect("bulk insert");
        tx.commit().await.expect("commit");
        from = to + 1;
    }
    c.execute("ANALYZE").await.expect("analyze");
    let _ = c.close().await;
}

async fn fill_postgres(url: &str, rows: i64) {
    let mut c = PgConnection::connect(url).await.expect("postgres");
    let mut from = 1;
    while from <= rows {
        let to = (from + BATCH - 1).min(rows);
        // System work, as the tables' owner (row-level security does not apply to it).
        let mut tx = c.begin().await.expect("begin");
        sqlx::query(&format!(
            "INSERT INTO sessions (id, owner, agent, cwd, title, meta, message_count, last_seq, created_at, updated_at)
             SELECT md5(g::text), owner, 'demo',
                    '/home/' || owner || '/proj' || ((g / 10) % 20),
                    'Session ' || g || CASE WHEN g % 997 = 0 THEN ' {RARE}' ELSE ' about module ' || (g % 300) END,
                    '{{\"branch\":\"feature-' || (g % 50) || '\"}}',
                    g % 40, g % 500, u - (random() * 86400000000)::bigint, u
             FROM (SELECT g,
                          CASE WHEN g % 10 = 0 THEN 'heavy' ELSE 'user' || lpad(((g * 7919) % 999)::text, 3, '0') END AS owner,
                          {NOW} - (random() * {SPREAD})::bigint AS u
                   FROM generate_series($1::bigint, $2::bigint) g) s"
        ))
        .bind(from)
        .bind(to)
        .execute(&mut *tx)
        .await
        .expect("bulk insert");
        tx.commit().await.expect("commit");
        from = to + 1;
    }
    // Autovacuum may be off (it is on the test server); the migration analysed an empty table.
    c.execute("VACUUM ANALYZE sessions, session_search")
        .await
        .expect("analyze");
    let _ = c.close().await;
}

/// `(updated_at, id)` of the heavy user's row at `offset` in list order.
async fn deep_position(backend: Backend, url: &str, offset: i64) -> (i64, String) {
    let sql =
        "SELECT updated_at, id FROM sessions WHERE owner = 'heavy' ORDER BY updated_at DESC, id DESC LIMIT 1 OFFSET ";
    match backend {
        Backend::Sqlite => {
            let mut c = SqliteConnection::connect(url).await.expect("sqlite");
            let r = sqlx::query(&format!("{sql}{offset}"))
                .fetch_one(&mut c)
                .await
                .expect("position");
            (r.get(0), r.get(1))
        }
        Backend::Postgres => {
            let mut c = PgConnection::connect(url).await.expect("postgres");
            let r = sqlx::query(&format!("{sql}{offset}"))
                .fetch_one(&mut c)
                .await
                .expect("position");
            (r.get(0), r.get(1))
        }
    }
}

/// The list query for `case`, searching `by`, behind `prefix` (`EXPLAIN ...`).
fn list_query<'a, DB: sqlx::Database>(
    backend: Backend,
    prefix: &str,
    owner: &'a str,
    case: &'a Case,
    by: SearchBy,
) -> QueryBuilder<'a, DB>
where
    &'a str: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    String: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
{
    let like = if backend == Backend::Sqlite { "LIKE" } else { "ILIKE" };
    let after = case.after.as_ref().map(|(t, id)| store::Position {
        updated_at: *t,
        id: id.as_str(),
    });
    store::list_query(&format!("{prefix} "), owner, &case.filter, after, PAGE, like, by)
}

/// The plan of the list query for `case`, searching `by` (one of the ways the store may pick).
async fn plan(backend: Backend, url: &str, owner: &str, case: &Case, by: SearchBy) -> String {
    let lines: Vec<String> = match backend {
        Backend::Sqlite => {
            let mut c = SqliteConnection::connect(url).await.expect("sqlite");
            let mut q = list_query::<sqlx::Sqlite>(backend, "EXPLAIN QUERY PLAN", owner, case, by);
            let rows = q.build().fetch_all(&mut c).await.expect("explain");
            rows.iter().map(|r| r.get::<String, _>("detail")).collect()
        }
        Backend::Postgres => {
            // As the gateway runs it: a search the trigram index can take as the tables' owner
            // (src/store/postgres.rs says why), everything else as the request role for the user.
            let mut c = PgConnection::connect(url).await.expect("postgres");
            let mut tx = c.begin().await.expect("begin");
            if !case
                .filter
                .search
                .as_deref()
                .is_some_and(|s| SearchIndex::Trigram.can_find(s))
            {
                pg::act_for(&mut tx, owner).await;
            }
            let mut q = list_query::<sqlx::Postgres>(backend, "EXPLAIN (ANALYZE, BUFFERS)", owner, case, by);
            let rows = q.build().fetch_all(&mut *tx).await.expect("explain");
            rows.iter().map(|r| r.get::<String, _>(0)).collect()
        }
    };
    lines.iter().map(|l| format!("  {l}")).collect::<Vec<_>>().join("\n")
}

/// Fresh sets of databases the write path is timed on.
const WRITE_ROUNDS: usize = 3;
/// Operations timed on one database before the next takes its turn: the variants are timed
/// interleaved, so that a busy moment of the machine (or a checkpoint) falls on all of them.
const WRITE_BLOCK: usize = 100;

/// What the write path is timed without.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// The schema as migrated.
    AsMigrated,
    /// The search index's triggers dropped: sessions and their titles are written as before it.
    NoSearchIndex,
    /// SQLite: the trigger that advances a session for each stored chunk as it was before it
    /// counted stored bytes. (Postgres counts them in the writer's own `UPDATE`; see
    /// [`stored_bytes_statements`].)
    NoStoredBytes,
}

/// The operations timed, in order.
#[derive(Debug, Clone, Copy)]
enum Op {
    Create,
    Rename,
    Commit,
    CommitWithPrompt,
    Delete,
}

impl Op {
    const ALL: [Op; 5] = [Op::Create, Op::Rename, Op::Commit, Op::CommitWithPrompt, Op::Delete];

    fn name(self) -> &'static str {
        match self {
            Op::Create => "create a session",
            Op::Rename => "rename it (agent title)",
            Op::Commit => "transcript commit (one 1 KiB chunk)",
            Op::CommitWithPrompt => "transcript commit + prompt (title kept)",
            Op::Delete => "delete a session",
        }
    }
}

/// The write path with the search index and without it: µs per operation, median over
/// [`WRITE_ROUNDS`] sets of fresh databases, `n` operations of each kind on each.
async fn write_path(backend: Backend, n: i64) {
    let variants: &[Variant] = match backend {
        Backend::Sqlite => &[Variant::AsMigrated, Variant::NoSearchIndex, Variant::NoStoredBytes],
        Backend::Postgres => &[Variant::AsMigrated, Variant::NoSearchIndex],
    };
    println!(
        "=== {}: write path, {n} sessions, µs per operation (median of {WRITE_ROUNDS} sets of fresh databases, \
         variants interleaved every {WRITE_BLOCK} operations) ===",
        backend.label()
    );
    // runs[round][variant][op]
    let mut runs = Vec::new();
    for _ in 0..WRITE_ROUNDS {
        runs.push(write_round(backend, variants, n).await);
    }
    print!("{:<44}", "operation");
    for v in variants {
        print!(" {:>16}", format!("{v:?}"));
    }
    println!();
    for (i, op) in Op::ALL.iter().enumerate() {
        print!("{:<44}", op.name());
        for k in 0..variants.len() {
            let mut v: Vec<f64> = runs.iter().map(|r: &Vec<Vec<f64>>| r[k][i]).collect();
            v.sort_by(f64::total_cmp);
            print!(" {:>16.1}", v[v.len() / 2]);
        }
        println!();
    }
    println!();
}

/// Postgres: the transcript writer's two statements per commit (store a chunk, advance its
/// session), with the session's `UPDATE` as it is and as it was before it added the chunk's bytes
/// to `stored_bytes`, on one database, interleaved. Mirrors `write_batch` in src/store/sql.rs.
async fn stored_bytes_statements(n: i64) {
    let url = pg::fresh_database().await;
    let store = store::connect(&url).await.expect("connect");
    let mut c = PgConnection::connect(&url).await.expect("postgres");
    let ids: Vec<String> = (0..n).map(|i| format!("w{i:07}")).collect();
    for id in &ids {
        store
            .create_session(&acp_gateway::store::NewSession {
                id,
                owner: "writer",
                agent: "demo",
                agent_session_id: None,
                cwd: "/w",
                additional_dirs: "[]",
                meta: "{}",
                now: NOW,
            })
            .await
            .expect("create");
    }
    let advance = |bytes: bool| {
        format!(
            "UPDATE sessions SET
                last_seq = GREATEST(last_seq, $2),
                updated_at = GREATEST(updated_at, $3),
                message_count = message_count + $4,
                title = COALESCE($5, title, $6){}
             WHERE id = $1",
            if bytes {
                ", stored_bytes = stored_bytes + $7"
            } else {
                ""
            }
        )
    };
    let payload = "x".repeat(1024);
    let mut spent = [Duration::ZERO; 2];
    for (b, block) in ids.chunks(WRITE_BLOCK).enumerate() {
        for (k, bytes) in [true, false].into_iter().enumerate() {
            let update = advance(bytes);
            let t = Instant::now();
            for id in block {
                let seq = (b as i64) * 2 + k as i64 + 1;
                let mut tx = c.begin().await.expect("begin");
                sqlx::query(
                    "INSERT INTO session_events (session_id, seq_from, seq_to, payload, created_at)
                     SELECT $1, $2, $3, $4, $5 WHERE EXISTS (SELECT 1 FROM sessions WHERE id = $1)
                     ON CONFLICT (session_id, seq_from) DO NOTHING",
                )
                .bind(id)
                .bind(seq)
                .bind(seq)
                .bind(payload.as_str())
                .bind(NOW + seq)
                .execute(&mut *tx)
                .await
                .expect("insert chunk");
                let mut q = sqlx::query(&update)
                    .bind(id)
                    .bind(seq)
                    .bind(NOW + seq)
                    .bind(0_i64)
                    .bind(None::<&str>)
                    .bind(None::<&str>);
                if bytes {
                    q = q.bind(payload.len() as i64);
                }
                q.execute(&mut *tx).await.expect("advance");
                tx.commit().await.expect("commit");
            }
            spent[k] += t.elapsed();
        }
    }
    let per = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
    println!(
        "Postgres transcript commit (chunk + session UPDATE, {n} each, interleaved), µs: \
         with stored_bytes {:.1}, without {:.1}\n",
        per(spent[0]),
        per(spent[1])
    );
}

/// One fresh database per variant: µs per operation of each of [`Op::ALL`], `n` times each.
async fn write_round(backend: Backend, variants: &[Variant], n: i64) -> Vec<Vec<f64>> {
    use std::sync::Arc;

    let mut targets = Vec::new();
    for variant in variants {
        let (url, dir) = fresh(backend).await;
        let store = store::connect(&url).await.expect("connect");
        let mut c = connect_raw(backend, &url).await;
        match variant {
            Variant::AsMigrated => {}
            Variant::NoSearchIndex => {
                let on = if backend == Backend::Postgres {
                    " ON sessions"
                } else {
                    ""
                };
                for t in [
                    "session_search_insert",
                    "session_search_update",
                    "session_search_delete",
                ] {
                    c.run(&format!("DROP TRIGGER {t}{on}")).await;
                }
            }
            Variant::NoStoredBytes => {
                // As in migrations/sqlite/20261122000001_events_advance_session.sql.
                c.run(
                    "DROP TRIGGER session_events_advance_session;
                     CREATE TRIGGER session_events_advance_session AFTER INSERT ON session_events
                     BEGIN
                         UPDATE sessions SET
                             last_seq = MAX(last_seq, NEW.seq_to),
                             updated_at = MAX(updated_at, NEW.created_at)
                         WHERE id = NEW.session_id;
                     END;",
                )
                .await;
            }
        }
        targets.push((store, dir));
    }
    let ids: Vec<Arc<str>> = (0..n).map(|i| Arc::from(format!("w{i:07}").as_str())).collect();
    let mut out = vec![Vec::new(); variants.len()];
    for op in Op::ALL {
        let mut spent = vec![Duration::ZERO; variants.len()];
        for (b, block) in ids.chunks(WRITE_BLOCK).enumerate() {
            for (k, (store, _)) in targets.iter().enumerate() {
                let t = Instant::now();
                for (j, id) in block.iter().enumerate() {
                    write_op(&**store, op, id, (b * WRITE_BLOCK + j) as i64, n).await;
                }
                spent[k] += t.elapsed();
            }
        }
        for (k, d) in spent.iter().enumerate() {
            out[k].push(d.as_secs_f64() * 1e6 / n as f64);
        }
    }
    out
}

/// One operation of kind `op` on session `id`, the `i`th of `n`.
async fn write_op(store: &dyn Store, op: Op, id: &std::sync::Arc<str>, i: i64, n: i64) {
    use acp_gateway::store::{EventChunk, NewSession, SessionWrite};

    // Five updates of about 200 bytes, as a streaming agent's message chunks.
    let chunk = |k: i64| EventChunk {
        seq_from: k * 5 + 1,
        seq_to: k * 5 + 5,
        payload: (0..5)
            .map(|u| {
                format!(
                    r#"{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"{}"}}}}"#,
                    "x".repeat(130 + u)
                )
            })
            .collect::<Vec<_>>()
            .join("\n"),
        stored_at: 0,
    };
    match op {
        Op::Create => store
            .create_session(&NewSession {
                id,
                owner: "writer",
                agent: "demo",
                agent_session_id: None,
                cwd: "/w",
                additional_dirs: "[]",
                meta: r#"{"branch":"main"}"#,
                now: NOW,
            })
            .await
            .expect("create"),
        Op::Rename => store
            .write_batch(&[SessionWrite {
                session_id: id.clone(),
                agent_title: Some(format!("Refactor the session store, part {i}")),
                updated_at: NOW + 1,
                ..Default::default()
            }])
            .await
            .expect("rename"),
        Op::Commit => store
            .write_batch(&[SessionWrite {
                session_id: id.clone(),
                chunk: Some(chunk(0)),
                updated_at: NOW + 2 + i,
                ..Default::default()
            }])
            .await
            .expect("commit"),
        Op::CommitWithPrompt => store
            .write_batch(&[SessionWrite {
                session_id: id.clone(),
                chunk: Some(chunk(1)),
                prompt_title: Some("a later prompt".into()),
                prompts: 1,
                updated_at: NOW + 2 + n + i,
                ..Default::default()
            }])
            .await
            .expect("commit with prompt"),
        Op::Delete => assert!(store.delete_session("writer", id).await.expect("delete")),
    }
}

/// A plain connection beside the store, for schema changes.
enum Raw {
    Sqlite(SqliteConnection),
    Postgres(PgConnection),
}

async fn connect_raw(backend: Backend, url: &str) -> Raw {
    match backend {
        Backend::Sqlite => Raw::Sqlite(SqliteConnection::connect(url).await.expect("sqlite")),
        Backend::Postgres => Raw::Postgres(PgConnection::connect(url).await.expect("postgres")),
    }
}

impl Raw {
    async fn run(&mut self, sql: &str) {
        match self {
            Raw::Sqlite(c) => c.execute(sql).await.map(drop),
            Raw::Postgres(c) => c.execute(sql).await.map(drop),
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}
