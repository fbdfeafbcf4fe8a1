//! `session/list` at scale: fills a SQLite file and a Postgres database with `LIST_BENCH_ROWS`
//! sessions (default 1,000,000) over ~1000 users, one of them "heavy" with a tenth of all rows,
//! then times `Store::list_sessions` for that user and prints the query plans.
//!
//! ```text
//! cargo bench --bench list_sessions                      # full size
//! LIST_BENCH_ROWS=50000 cargo bench --bench list_sessions # CI size
//! LIST_BENCH_BACKENDS=postgres cargo bench --bench list_sessions
//! ```
//!
//! Postgres: `DATABASE_URL=postgres://…` names a server to use; otherwise a throwaway server is
//! started (as the test harness does). The gateway's role there is an ordinary one, so the timings
//! include row-level security.

#[allow(dead_code, reason = "shared with the tests; the bench uses part of it")]
#[path = "../tests/common/pg.rs"]
mod pg;

use std::str::FromStr;
use std::time::{Duration, Instant};

use acp_gateway::store::{self, ListFilter, Position, Store};
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
    let rows: i64 = std::env::var("LIST_BENCH_ROWS")
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(1_000_000);
    let which = std::env::var("LIST_BENCH_BACKENDS").unwrap_or_else(|_| "sqlite,postgres".into());
    println!(
        "list_sessions benchmark: {rows} sessions, ~1000 users, user \"heavy\" has {}",
        rows / 10
    );
    println!("each case: {RUNS} runs of Store::list_sessions(limit {PAGE}) after 3 warm-up runs\n");
    if which.contains("sqlite") {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}/bench.db", dir.path().display());
        run(Backend::Sqlite, &url, rows).await;
    }
    if which.contains("postgres") {
        let url = pg::fresh_database().await;
        run(Backend::Postgres, &url, rows).await;
    }
}

async fn run(backend: Backend, url: &str, rows: i64) {
    let label = if backend == Backend::Sqlite {
        "SQLite"
    } else {
        "Postgres"
    };
    println!("=== {label} ===");
    // Migrate through the store, then bulk-load beside it.
    drop(store::connect(url).await.expect("connect and migrate"));
    let started = Instant::now();
    match backend {
        Backend::Sqlite => fill_sqlite(url, rows).await,
        Backend::Postgres => fill_postgres(url, rows).await,
    }
    println!(
        "filled {rows} rows + ANALYZE in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // A fresh store, so that every connection has the new statistics.
    let store = store::connect(url).await.expect("connect");
    let heavy = rows / 10;
    let deep = deep_position(backend, url, heavy / 2).await;
    let cases = vec![
        Case {
            name: "first page",
            filter: ListFilter::default(),
            after: None,
        },
        Case {
            name: "deep page (cursor at row ~50%)",
            filter: ListFilter::default(),
            after: Some(deep.clone()),
        },
        Case {
            name: "cwd filter",
            filter: ListFilter {
                cwd: Some("/home/heavy/proj7".into()),
                ..Default::default()
            },
            after: None,
        },
        Case {
            name: "search (0.1% of rows match)",
            filter: ListFilter {
                search: Some(RARE.into()),
                ..Default::default()
            },
            after: None,
        },
        Case {
            name: "search (no match)",
            filter: ListFilter {
                search: Some("no-such-text".into()),
                ..Default::default()
            },
            after: None,
        },
        Case {
            name: "search, deep page",
            filter: ListFilter {
                search: Some(RARE.into()),
                ..Default::default()
            },
            after: Some(deep),
        },
        Case {
            name: "light user, first page",
            filter: ListFilter::default(),
            after: None,
        },
        Case {
            name: "light user, search (no match)",
            filter: ListFilter {
                search: Some("no-such-text".into()),
                ..Default::default()
            },
            after: None,
        },
    ];
    println!("{:<34} {:>10} {:>10} {:>6}", "case", "median", "p95", "rows");
    for case in &cases {
        let owner = if case.name.starts_with("light") {
            "user042"
        } else {
            "heavy"
        };
        let (median, p95, n) = time_case(&*store, owner, case).await;
        println!("{:<34} {:>10} {:>10} {:>6}", case.name, fmt(median), fmt(p95), n);
    }
    println!();
    for case in &cases[..6] {
        println!("--- plan: {} ---", case.name);
        println!("{}", plan(backend, url, "heavy", case).await);
    }
}

fn fmt(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.0} µs")
    } else {
        format!("{:.2} ms", us / 1000.0)
    }
}

async fn time_case(store: &dyn Store, owner: &str, case: &Case) -> (Duration, Duration, usize) {
    let after = case.after.as_ref().map(|(t, id)| Position { updated_at: *t, id });
    let mut n = 0;
    for _ in 0..3 {
        n = store
            .list_sessions(owner, &case.filter, after, PAGE)
            .await
            .expect("list")
            .len();
    }
    let mut times = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let t = Instant::now();
        let page = store
            .list_sessions(owner, &case.filter, after, PAGE)
            .await
            .expect("list");
        times.push(t.elapsed());
        n = page.len();
    }
    times.sort();
    let p95 = times[(RUNS * 95).div_ceil(100) - 1];
    (times[RUNS / 2], p95, n)
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
        let mut tx = c.begin().await.expect("begin");
        // Row-level security: bulk loading is system work.
        tx.execute("SELECT set_config('acp_gateway.system', 'on', true)")
            .await
            .expect("system");
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
    c.execute("VACUUM ANALYZE sessions").await.expect("analyze");
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
            let mut tx = c.begin().await.expect("begin");
            tx.execute("SELECT set_config('acp_gateway.user', 'heavy', true)")
                .await
                .expect("user");
            let r = sqlx::query(&format!("{sql}{offset}"))
                .fetch_one(&mut *tx)
                .await
                .expect("position");
            (r.get(0), r.get(1))
        }
    }
}

/// The query the stores build for `case`, after `prefix` (`EXPLAIN …`), with the same bind
/// parameters (kept in step with `src/store/{sqlite,postgres}.rs`: SQLite plans can depend on how
/// values are bound).
/// The production `session/list` query for `case`, behind `prefix` (`EXPLAIN ...`).
fn list_query<'a, DB: sqlx::Database>(
    backend: Backend,
    prefix: &str,
    owner: &'a str,
    case: &'a Case,
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
    store::list_query(&format!("{prefix} "), owner, &case.filter, after, PAGE, like)
}

async fn plan(backend: Backend, url: &str, owner: &str, case: &Case) -> String {
    let lines: Vec<String> = match backend {
        Backend::Sqlite => {
            let mut c = SqliteConnection::connect(url).await.expect("sqlite");
            let mut q = list_query::<sqlx::Sqlite>(backend, "EXPLAIN QUERY PLAN", owner, case);
            let rows = q.build().fetch_all(&mut c).await.expect("explain");
            rows.iter().map(|r| r.get::<String, _>("detail")).collect()
        }
        Backend::Postgres => {
            // As the gateway runs it: an ordinary role, in a transaction naming the user.
            let mut c = PgConnection::connect(url).await.expect("postgres");
            let mut tx = c.begin().await.expect("begin");
            sqlx::query("SELECT set_config('acp_gateway.user', $1, true)")
                .bind(owner)
                .execute(&mut *tx)
                .await
                .expect("user");
            let mut q = list_query::<sqlx::Postgres>(backend, "EXPLAIN (ANALYZE, BUFFERS)", owner, case);
            let rows = q.build().fetch_all(&mut *tx).await.expect("explain");
            rows.iter().map(|r| r.get::<String, _>(0)).collect()
        }
    };
    lines.iter().map(|l| format!("  {l}")).collect::<Vec<_>>().join("\n")
}
