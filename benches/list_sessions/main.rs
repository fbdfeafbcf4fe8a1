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
//! the search index's triggers and without them: creating sessions, renaming them, the
//! transcript writer's commits, deleting. (SQLite's stored chunks no longer touch their sessions,
//! `migrations/sqlite/20261130000001_chunks_leave_sessions_alone.sql`, so the variant with the
//! trigger that advanced a session per chunk is gone.) On Postgres, where the writer's own `UPDATE` counts the
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

// Tests and benchmarks spawn freely: their runtime ends with them.
#![allow(clippy::disallowed_methods)]

#[allow(dead_code, reason = "shared with the tests; the bench uses part of it")]
#[path = "../../tests/common/pg.rs"]
mod pg;
mod writes;

use writes::{stored_bytes_statements, write_path};

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
