//! The write path: creating, renaming, the transcript writer's commits and deleting, timed with
//! and without the search index's triggers; on Postgres, the writer's statements with and without
//! the stored-bytes term.

use super::*;

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
pub(crate) async fn write_path(backend: Backend, n: i64) {
    let variants = &[Variant::AsMigrated, Variant::NoSearchIndex];
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
pub(crate) async fn stored_bytes_statements(n: i64) {
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
