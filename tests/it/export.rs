//! Issue 21, item 1: a session's stored transcript exported as JSON Lines or Markdown, by its
//! owner only, streamed from the store at the client's pace.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use acp_gateway::export::{self, Format};
use acp_gateway::store::{self, EventChunk, NewSession, SessionWrite, Store};
use common::serve_process::ServeProcess;
use common::{Db, SECRET, TestGateway};
use futures_util::StreamExt;
use serde_json::Value;

/// 2026-11-26 09:00:00 UTC, in epoch µs.
const BASE: i64 = 1_795_683_600_000_000;

async fn create(s: &dyn Store, id: &str, owner: &str, now: i64) {
    s.create_session(&NewSession {
        id,
        owner,
        agent: "default",
        agent_session_id: None,
        cwd: "/work/app",
        additional_dirs: "[]",
        meta: "{}",
        now,
    })
    .await
    .expect("create session");
}

/// The fixture's groups of lines (a blank line between groups), each stored as one chunk a
/// minute after the one before.
async fn store_fixture(s: &dyn Store, id: &str) {
    let fixture = std::fs::read_to_string("tests/fixtures/export/transcript.jsonl").expect("fixture");
    let mut seq = 0;
    for (i, group) in fixture.split("\n\n").enumerate() {
        let lines: Vec<&str> = group.lines().filter(|l| !l.is_empty()).collect();
        let from = seq + 1;
        seq += lines.len() as i64;
        s.write_batch(&[SessionWrite {
            session_id: Arc::from(id),
            chunk: Some(EventChunk {
                seq_from: from,
                seq_to: seq,
                payload: lines.join("\n"),
                stored_at: 0,
            }),
            prompts: i64::from(lines.iter().any(|l| l.contains("user_message_chunk"))),
            agent_title: (i == 3).then(|| String::from("Empty password crash")),
            updated_at: BASE + i as i64 * 60_000_000,
            ..Default::default()
        }])
        .await
        .expect("store a chunk");
    }
}

async fn export_text(s: Arc<dyn Store>, owner: &str, id: &str, format: Format) -> String {
    let record = s.get_session(owner, id).await.expect("get").expect("the session");
    let mut out = Vec::new();
    let mut pieces = Box::pin(export::stream(s, record, format));
    while let Some(piece) = pieces.next().await {
        out.extend_from_slice(&piece.expect("a piece"));
    }
    String::from_utf8(out).expect("utf-8")
}

/// The Markdown of a transcript with every kind of update a reader sees (and two it does not)
/// is the fixed file `tests/fixtures/export/expected.md`, byte for byte.
#[tokio::test]
async fn markdown_export_reads_as_the_expected_file() {
    let dir = tempfile::tempdir().expect("tmp");
    let s = store::connect(&format!("sqlite://{}/gw.db", dir.path().display()))
        .await
        .expect("store");
    create(&*s, "0b1c2d3e", "alice", BASE).await;
    store_fixture(&*s, "0b1c2d3e").await;
    let md = export_text(s.clone(), "alice", "0b1c2d3e", Format::Markdown).await;
    let expected_path = "tests/fixtures/export/expected.md";
    if std::env::var_os("BLESS").is_some() {
        std::fs::write(expected_path, &md).expect("write the expected file");
    }
    let expected = std::fs::read_to_string(expected_path).expect("the expected file");
    assert_eq!(md, expected, "the Markdown export changed:\n{md}");

    // The JSON Lines of the same session: every stored update, in order, with its chunk's time.
    let jsonl = export_text(s.clone(), "alice", "0b1c2d3e", Format::Jsonl).await;
    let lines: Vec<Value> = jsonl
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let fixture = std::fs::read_to_string("tests/fixtures/export/transcript.jsonl").expect("fixture");
    let updates: Vec<Value> = fixture
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert_eq!(lines.len(), updates.len());
    for (i, (line, update)) in lines.iter().zip(&updates).enumerate() {
        assert_eq!(line["seq"], i as u64 + 1);
        assert_eq!(&line["update"], update);
    }
    assert_eq!(lines[0]["time"], "2026-11-26T09:00:00.000000Z");
    assert_eq!(lines.last().expect("last")["time"], "2026-11-26T09:04:00.000000Z");

    // Another user's export of it is not found, before anything is read.
    assert_eq!(s.get_session("bob", "0b1c2d3e").await.expect("get"), None);
}

/// Over HTTP on both backends: the owner downloads what the agent said, as JSON Lines (every
/// update the client saw, with the same seqs) and as Markdown; another user, a forged token, an
/// unknown id and an unknown format are refused, the foreign id exactly as the unknown one.
async fn export_over_http(db: Db) {
    let gw = TestGateway::start(db, |_| {}).await;
    let mut c = gw.client("alice").await;
    let s = c.new_session().await;
    let r = c.prompt(&s, "hello export [chunks=4]").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let seen: Vec<Value> = c.take_updates(&s);
    assert!(!seen.is_empty());

    let http = reqwest::Client::new();
    let get = |user: Option<&str>, path: String| {
        let mut req = http.get(gw.http_url(&path));
        if let Some(user) = user {
            req = req.bearer_auth(gw.token(user));
        }
        req.send()
    };
    let res = get(Some("alice"), format!("/api/sessions/{s}/export?format=jsonl"))
        .await
        .expect("export");
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "application/x-ndjson; charset=utf-8");
    assert_eq!(res.headers()["cache-control"], "no-store");
    let disposition = res.headers()["content-disposition"]
        .to_str()
        .expect("ascii")
        .to_string();
    assert!(
        disposition.starts_with("attachment; filename=\"hello-export") && disposition.ends_with(".jsonl\""),
        "{disposition}"
    );
    let body = res.text().await.expect("body");
    let lines: Vec<Value> = body.lines().map(|l| serde_json::from_str(l).expect("json")).collect();
    assert_eq!(lines.len(), seen.len(), "one line per update the client saw");
    for (line, update) in lines.iter().zip(&seen) {
        assert_eq!(line["seq"].as_u64(), Some(common::seq(update)));
        assert_eq!(line["update"], update["params"]["update"]);
        assert!(store::parse_iso8601(line["time"].as_str().expect("time")).is_some());
    }

    let res = get(Some("alice"), format!("/api/sessions/{s}/export?format=markdown"))
        .await
        .expect("export");
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "text/markdown; charset=utf-8");
    let md = res.text().await.expect("body");
    assert!(md.starts_with("# hello export"), "{md}");
    assert!(
        md.contains("## User · ") && md.contains("hello export [chunks=4]"),
        "{md}"
    );
    assert!(md.contains("## Agent · "), "{md}");

    let foreign = get(Some("bob"), format!("/api/sessions/{s}/export"))
        .await
        .expect("export");
    let unknown = get(Some("bob"), String::from("/api/sessions/no-such-session/export"))
        .await
        .expect("export");
    assert_eq!(foreign.status(), 404);
    assert_eq!(unknown.status(), 404);
    assert_eq!(
        foreign.text().await.expect("body"),
        unknown.text().await.expect("body"),
        "another user's session answers as an unknown one"
    );
    let nobody = get(None, format!("/api/sessions/{s}/export")).await.expect("export");
    assert_eq!(nobody.status(), 401);
    let forged = http
        .get(gw.http_url(&format!("/api/sessions/{s}/export")))
        .bearer_auth(format!("{}x", gw.token("alice")))
        .send()
        .await
        .expect("export");
    assert_eq!(forged.status(), 401);
    let bad = get(Some("alice"), format!("/api/sessions/{s}/export?format=pdf"))
        .await
        .expect("export");
    assert_eq!(bad.status(), 400);
    let err: Value = bad.json().await.expect("json");
    assert!(err["error"].as_str().expect("error").contains("\"pdf\""), "{err}");
    c.close().await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_over_http_sqlite() {
    export_over_http(Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_over_http_postgres() {
    export_over_http(Db::Postgres).await;
}

/// Peak resident memory of a process, in MiB.
fn peak_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmHWM");
    kib / 1024.0
}

/// A 100,000-update session (about 50 MB of JSON Lines) exported by a real `acp-gateway serve`:
/// every update arrives once and in order, and the gateway's peak memory grows by a small part
/// of the export's size: it reads the store as the client reads, and holds only one page. The
/// client stops reading for a while midway, so the gateway has to wait for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100000_update_session_is_exported_in_bounded_memory() {
    const UPDATES: i64 = 100_000;
    const PER_CHUNK: i64 = 50;
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().canonicalize().expect("canon");
    let db_url = format!("sqlite://{}", dir.join("data/acp-gateway.db").display());
    {
        let s = store::connect(&db_url).await.expect("store");
        create(&*s, "long", "alice", BASE).await;
        let text = "x".repeat(400);
        for k in 0..UPDATES / PER_CHUNK {
            let payload: Vec<String> = (0..PER_CHUNK)
                .map(|i| {
                    format!(
                        r#"{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"{} {text}"}}}}"#,
                        k * PER_CHUNK + i + 1
                    )
                })
                .collect();
            s.write_batch(&[SessionWrite {
                session_id: Arc::from("long"),
                chunk: Some(EventChunk {
                    seq_from: k * PER_CHUNK + 1,
                    seq_to: (k + 1) * PER_CHUNK,
                    payload: payload.join("\n"),
                    stored_at: 0,
                }),
                updated_at: BASE + k,
                ..Default::default()
            }])
            .await
            .expect("write");
        }
    }
    let config = dir.join("gw.toml");
    std::fs::write(
        &config,
        format!("data_dir = {:?}\n", dir.join("data").display().to_string()),
    )
    .expect("config");
    let gw = ServeProcess::start(&config, &db_url, SECRET).await;
    let pid = gw.pid();
    let before = peak_mib(pid);

    let mut res = reqwest::Client::new()
        .get(format!("http://{}/api/sessions/long/export?format=jsonl", gw.addr))
        .bearer_auth(gw.token("alice"))
        .send()
        .await
        .expect("export");
    assert_eq!(res.status(), 200);
    let (mut bytes, mut lines, mut next_seq, mut partial) = (0usize, 0i64, 1i64, Vec::new());
    let mut paused = false;
    while let Some(piece) = tokio::time::timeout(common::WAIT, res.chunk())
        .await
        .expect("the export goes on")
        .expect("a piece")
    {
        bytes += piece.len();
        partial.extend_from_slice(&piece);
        while let Some(end) = partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = partial.drain(..=end).collect();
            let v: Value = serde_json::from_slice(&line).expect("a JSON line");
            assert_eq!(v["seq"], next_seq, "every update once, in order");
            next_seq += 1;
            lines += 1;
        }
        if !paused && bytes > 4 << 20 {
            // The client stops reading: the gateway must wait, not read the rest into memory.
            paused = true;
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
    let after = peak_mib(pid);
    eprintln!(
        "exported {lines} updates, {:.1} MB; gateway peak memory {before:.1} -> {after:.1} MiB",
        bytes as f64 / 1e6
    );
    assert_eq!(lines, UPDATES);
    assert!(partial.is_empty());
    assert!(bytes > 45_000_000, "{bytes}");
    // Holding it all would take more than the export's size; one page at a time takes a few MiB.
    assert!(
        after - before < bytes as f64 / 2.0 / (1 << 20) as f64,
        "the gateway's peak memory grew {:.1} MiB for a {:.1} MB export",
        after - before,
        bytes as f64 / 1e6
    );
    gw.kill().await;
}
