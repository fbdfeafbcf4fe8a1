//! Issue 9 item 4: database faults. While the database is unreachable (or the transcript cannot
//! be written) `/readyz` is 503, requests that need it answer `-32603` within 5 s, nothing is shown
//! to a client that is not stored, and once it is back everything resumes in the same process.

use crate::common;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{Client, Db, TestGateway, WAIT, seq};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use sqlx::{Connection, Executor, PgConnection, SqliteConnection};

/// The contract: a method that needs the database answers within this while it is unreachable.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// `/readyz`'s status and body.
async fn readyz(gw: &TestGateway) -> (u16, Value) {
    let r = reqwest::Client::new()
        .get(gw.http_url("/readyz"))
        .timeout(WAIT)
        .send()
        .await
        .expect("/readyz answers");
    let status = r.status().as_u16();
    (status, r.json().await.expect("/readyz is JSON"))
}

/// Asks `/readyz` until it answers `status` (with a short pause between answers, which take up
/// to 3 s each while the database does not answer); returns the body.
async fn readyz_until(gw: &TestGateway, status: u16) -> Value {
    readyz_until_body(gw, status, |_| true).await
}

/// [`readyz_until`] `status` with a body that satisfies `pred`.
async fn readyz_until_body(gw: &TestGateway, status: u16, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let (s, body) = readyz(gw).await;
        if s == status && pred(&body) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz never answered {status} as expected; last {s}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn writer_failing(body: &Value) -> bool {
    body["checks"]["transcriptWriter"]
        .as_str()
        .is_some_and(|w| w.starts_with("error"))
}

/// `session/list`, timed: it must fail with `-32603` within [`ANSWER_WITHIN`].
async fn list_fails_in_time(c: &mut Client) {
    let started = Instant::now();
    let r = c.request("session/list", json!({})).await;
    let took = started.elapsed();
    assert_eq!(r["error"]["code"], -32603, "session/list with the store down: {r}");
    assert!(took < ANSWER_WITHIN, "session/list answered after {took:?}");
    eprintln!("session/list answered -32603 in {took:?}");
}

/// Loads `session` on a fresh connection and returns every replayed update.
async fn replay_all(gw: &TestGateway, user: &str, session: &str) -> Vec<Value> {
    let mut c = gw.client(user).await;
    let r = c
        .request("session/load", json!({"sessionId": session, "mcpServers": []}))
        .await;
    assert!(r.get("result").is_some(), "load failed: {r}");
    c.take_updates(session)
}

/// `alice`'s `session` replayed holds exactly what she saw ([`assert_all_stored`]).
async fn assert_replays_what_was_seen(gw: &TestGateway, session: &str, seen: &[Value]) {
    let replay = replay_all(gw, "alice", session).await;
    assert_eq!(replay.len(), seen.len());
    assert_all_stored(seen, &replay);
}

/// Every update a client saw is in the replay, the same, and the replay has no gaps.
fn assert_all_stored(seen: &[Value], replay: &[Value]) {
    let seqs: Vec<u64> = replay.iter().map(seq).collect();
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, expected, "the stored transcript has no gaps");
    for u in seen {
        let stored = &replay[(seq(u) - 1) as usize];
        assert_eq!(
            stored["params"]["update"], u["params"]["update"],
            "what the client saw is what is stored"
        );
    }
}

/// Sends a prompt while transcript writes fail, waits until `/readyz` reports the writer failing,
/// checks `session/list` fails in time, and that nothing of the prompt was shown nor answered
/// meanwhile (anything released before the list's answer would have reached the client first).
async fn start_held_prompt(gw: &TestGateway, c: &mut Client, session: &str) -> u64 {
    let prompt = c.start("session/prompt", prompt_params(session, "while down")).await;
    let body = readyz_until_body(gw, 503, writer_failing).await;
    eprintln!("writer failing: {body}");
    list_fails_in_time(c).await;
    assert!(
        c.take_updates(session).is_empty(),
        "updates shown before they were stored"
    );
    assert!(
        !c.inbox.iter().any(|m| m["id"] == json!(prompt)),
        "the prompt was answered before its updates were stored"
    );
    prompt
}

fn prompt_params(session: &str, text: &str) -> Value {
    json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]})
}

/// A Postgres server of this test's own, so the whole server can be frozen (`SIGSTOP` to the
/// postmaster and every backend: connections hang, as with a network partition) and thawed.
struct OwnPostgres {
    child: Child,
    cluster: common::pg::Cluster,
    port: u16,
}

impl OwnPostgres {
    async fn start() -> Self {
        let cluster = common::pg::Cluster::init("dbfaults-pg-");
        let port = common::pg::free_port();
        let child = Self::spawn(&cluster, port);
        let pg = Self { child, cluster, port };
        let mut admin = pg.wait_up().await;
        admin.execute("CREATE DATABASE gw").await.expect("create database");
        let _ = admin.close().await;
        pg
    }

    fn spawn(cluster: &common::pg::Cluster, port: u16) -> Child {
        cluster
            .command("postgres")
            .arg("-D")
            .arg(cluster.data())
            .args(["-p", &port.to_string(), "-k"])
            .arg(&cluster.dir)
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("postgres starts")
    }

    /// Waits until it accepts connections (a process coming up: no event to wait on).
    async fn wait_up(&self) -> PgConnection {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match PgConnection::connect(&self.url("postgres")).await {
                Ok(c) => return c,
                Err(e) => {
                    assert!(Instant::now() < deadline, "postgres did not come up: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// Stops the server (fast shutdown: connections are closed, new ones refused).
    fn stop(&mut self) {
        kill(Pid::from_raw(self.child.id() as i32), Signal::SIGINT).expect("SIGINT postgres");
        self.child.wait().expect("postgres stops");
    }

    /// Starts it again on the same port and data.
    async fn start_again(&mut self) {
        self.child = Self::spawn(&self.cluster, self.port);
        let _ = self.wait_up().await.close().await;
    }

    fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Stops (or continues) the postmaster and all its backends (each backend is a process group
    /// of its own, so the postmaster's group is not enough). The postmaster is stopped first, so
    /// it starts no backend meanwhile.
    fn signal(&self, signal: Signal) {
        let postmaster = self.child.id() as i32;
        let _ = kill(Pid::from_raw(postmaster), signal);
        for pid in descendants(postmaster) {
            let _ = kill(Pid::from_raw(pid), signal);
        }
    }
}

/// Every process below `root`, from /proc.
fn descendants(root: i32) -> Vec<i32> {
    let parents: Vec<(i32, i32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let ppid = stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(parents.iter().filter(|(_, pp)| *pp == parent).map(|(p, _)| *p));
        i += 1;
    }
    found.remove(0);
    found
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        self.signal(Signal::SIGCONT);
        // Immediate shutdown (the postmaster cleans up its shared memory); killed if it hangs.
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGQUIT);
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.signal(Signal::SIGKILL);
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.cluster.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_frozen_then_back_without_a_restart() {
    let pg = OwnPostgres::start().await;
    let gw = TestGateway::start(Db::Url(pg.url("gw")), |_| {}).await;
    let mut c = gw.client("alice").await;
    let s = c.new_session().await;
    let r = c.prompt(&s, "before").await;
    assert!(r.get("result").is_some(), "{r}");
    let mut seen = c.take_updates(&s);
    let last = seq(seen.last().expect("the first prompt streamed"));
    readyz_until(&gw, 200).await;

    // Frozen: connections open, nothing answers.
    pg.signal(Signal::SIGSTOP);
    let started = Instant::now();
    let body = readyz_until(&gw, 503).await;
    eprintln!("/readyz 503 after {:?}: {body}", started.elapsed());
    assert!(
        body["checks"]["database"]
            .as_str()
            .is_some_and(|d| d.starts_with("error")),
        "{body}"
    );
    // A prompt now cannot be stored, so nothing of it is shown until the database is back.
    let prompt = start_held_prompt(&gw, &mut c, &s).await;

    pg.signal(Signal::SIGCONT);
    let started = Instant::now();
    let body = readyz_until(&gw, 200).await;
    eprintln!("/readyz 200 again {:?} after SIGCONT: {body}", started.elapsed());
    let r = c.answer(prompt).await;
    assert!(
        r.get("result").is_some(),
        "the prompt sent during the outage completes: {r}"
    );
    let more = c.take_updates(&s);
    assert_eq!(seq(&more[0]), last + 1, "streaming resumes where it stopped");
    seen.extend(more);
    let r = c.prompt(&s, "after").await;
    assert!(r.get("result").is_some(), "{r}");
    let r = c.request("session/list", json!({})).await;
    assert_eq!(r["result"]["sessions"][0]["sessionId"], s, "{r}");
    seen.extend(c.take_updates(&s));
    let replay = replay_all(&gw, "alice", &s).await;
    assert_eq!(
        replay.len(),
        seen.len(),
        "everything shown live is stored, and nothing else was"
    );
    assert_all_stored(&seen, &replay);
    assert!(
        replay
            .iter()
            .any(|u| u["params"]["update"].to_string().contains("after")),
        "the prompt after the outage is stored"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_refusing_writes_holds_updates_back_until_they_are_stored() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut c = gw.client("alice").await;
    let s = c.new_session().await;
    let r = c.prompt(&s, "one").await;
    assert!(r.get("result").is_some(), "{r}");
    let mut seen = c.take_updates(&s);
    let last = seq(seen.last().expect("the first prompt streamed"));
    readyz_until(&gw, 200).await;

    // Another connection to the same file makes every transcript insert fail (as a full disk
    // would; `SELECT 1` still works).
    assert!(Path::new(gw.dir().path()).join("gw.db").exists());
    let mut other = SqliteConnection::connect(&gw.db_url).await.expect("second connection");
    other
        .execute("CREATE TRIGGER refuse BEFORE INSERT ON session_events BEGIN SELECT RAISE(ABORT, 'disk full'); END")
        .await
        .expect("create trigger");
    let prompt = start_held_prompt(&gw, &mut c, &s).await;
    let (status, body) = readyz(&gw).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["checks"]["database"], "ok", "SELECT 1 still works: {body}");
    assert!(
        body["checks"]["transcriptWriter"]
            .as_str()
            .is_some_and(|w| w.starts_with("error") && w.contains("disk full")),
        "{body}"
    );

    other.execute("DROP TRIGGER refuse").await.expect("drop trigger");
    let _ = other.close().await;
    let r = c.answer(prompt).await;
    assert!(
        r.get("result").is_some(),
        "the prompt completes once writes work again: {r}"
    );
    let more = c.take_updates(&s);
    assert_eq!(seq(&more[0]), last + 1, "streaming resumes where it stopped");
    seen.extend(more);
    readyz_until(&gw, 200).await;
    assert_replays_what_was_seen(&gw, &s, &seen).await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_under_a_running_gateway() {
    let mut pg = OwnPostgres::start().await;
    let gw = TestGateway::start(Db::Url(pg.url("gw")), |_| {}).await;
    let mut c = gw.client("alice").await;
    let s = c.new_session().await;
    let r = c.prompt(&s, "before").await;
    assert!(r.get("result").is_some(), "{r}");
    let mut seen = c.take_updates(&s);
    readyz_until(&gw, 200).await;

    pg.stop();
    let body = readyz_until(&gw, 503).await;
    assert!(
        body["checks"]["database"]
            .as_str()
            .is_some_and(|d| d.starts_with("error")),
        "{body}"
    );
    let r = start_held_prompt(&gw, &mut c, &s).await;

    pg.start_again().await;
    readyz_until(&gw, 200).await;
    let answer = c.answer(r).await;
    assert!(
        answer.get("result").is_some(),
        "the prompt sent while it was down completes: {answer}"
    );
    let r = c.prompt(&s, "after").await;
    assert!(r.get("result").is_some(), "{r}");
    seen.extend(c.take_updates(&s));
    assert_replays_what_was_seen(&gw, &s, &seen).await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_writes_fail_for_good_answers_its_prompt_with_an_error() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut c = gw.client("alice").await;
    let s = c.new_session().await;
    let other_session = c.new_session().await;
    readyz_until(&gw, 200).await;
    // Every insert of this session's transcript now fails with an error no retry mends (a
    // unique constraint the trigger's own insert breaks), and only this session's.
    let mut other = SqliteConnection::connect(&gw.db_url).await.expect("second connection");
    other
        .execute("CREATE TABLE once (x UNIQUE); INSERT INTO once VALUES (1)")
        .await
        .expect("table");
    other
        .execute(
            format!(
                "CREATE TRIGGER broken BEFORE INSERT ON session_events WHEN NEW.session_id = '{s}' \
                 BEGIN INSERT INTO once VALUES (1); END"
            )
            .as_str(),
        )
        .await
        .expect("create trigger");
    let _ = other.close().await;
    let r = c.prompt(&s, "doomed").await;
    assert_eq!(r["error"]["code"], -32603, "the prompt is answered, with an error: {r}");
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("can no longer be stored"), "{r}");
    assert!(c.take_updates(&s).is_empty(), "nothing unstored was shown");
    // The session refuses further prompts the same way; the writer is healthy, and the user's
    // other session works.
    let r = c.prompt(&s, "again").await;
    assert_eq!(r["error"]["code"], -32603, "{r}");
    readyz_until(&gw, 200).await;
    let r = c.prompt(&other_session, "still here").await;
    assert!(r.get("result").is_some(), "{r}");
    let seen = c.take_updates(&other_session);
    assert_replays_what_was_seen(&gw, &other_session, &seen).await;
    gw.stop().await;
}

/// `url` with its host and port replaced by `addr`'s; and the address it named.
fn through(url: &str, addr: std::net::SocketAddr) -> (String, std::net::SocketAddr) {
    let (head, rest) = url.split_once('@').expect("a URL with user@host");
    let (host_port, tail) = rest.split_once('/').expect("a URL with a database");
    let upstream = host_port.replace("localhost", "127.0.0.1").parse().expect("host:port");
    (format!("{head}@{addr}/{tail}"), upstream)
}

/// After a Postgres restart the pool finds its connections dead, and the first new one may be
/// reset while the server comes up: sqlx gives that error back at once (it waits out a refused
/// connect, not a reset one). The store takes one more connection then, since nothing was
/// written yet, and only once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connections_reset_under_the_store_are_replaced_and_the_work_retried_once() {
    let url = common::pg::fresh_database().await;
    let (_, upstream) = through(&url, "127.0.0.1:1".parse().expect("addr"));
    let proxy = common::tcp_proxy::TcpProxy::start(upstream).await;
    let (proxied, _) = through(&url, proxy.addr());
    let database = acp_gateway::store::open(&proxied, None)
        .await
        .expect("store through the proxy");
    let (store, web_sessions) = (database.sessions, acp_gateway::identity::WebSessions::new(database.db));
    common::fixtures::create_session(&*store, "s1", "alice", 1).await;

    // Request work (a transaction as the user).
    proxy.reset_all(1);
    let found = store.get_session("alice", "s1").await.expect("read after a reset");
    assert!(found.is_some());
    // A statement of its own (system work).
    proxy.reset_all(1);
    let none = web_sessions.get("nobody").await.expect("read after a reset");
    assert!(none.is_none());
    // Once: two resets in a row are the caller's error, named.
    proxy.reset_all(2);
    let e = store.get_session("alice", "s1").await.expect_err("two resets in a row");
    assert!(e.is_transient(), "{e}");
    // And it goes on.
    assert!(store.get_session("alice", "s1").await.expect("read").is_some());
}

/// The same seen by a user: a list and a prompt sent right after every connection to the
/// database was reset are answered, and everything the prompt streamed is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_right_after_postgres_connections_reset_is_answered() {
    let url = common::pg::fresh_database().await;
    let (_, upstream) = through(&url, "127.0.0.1:1".parse().expect("addr"));
    let proxy = common::tcp_proxy::TcpProxy::start(upstream).await;
    let (proxied, _) = through(&url, proxy.addr());
    let gw = TestGateway::start(Db::Url(proxied), |_| {}).await;
    let mut c = gw.client("alice").await;
    let s = c.new_session().await;
    let r = c.prompt(&s, "before").await;
    assert!(r.get("result").is_some(), "{r}");
    let mut seen = c.take_updates(&s);
    proxy.reset_all(1);
    let r = c.request("session/list", json!({})).await;
    assert_eq!(r["result"]["sessions"].as_array().map(Vec::len), Some(1), "{r}");
    proxy.reset_all(1);
    let r = c.prompt(&s, "after").await;
    assert!(r.get("result").is_some(), "the prompt after the reset: {r}");
    seen.extend(c.take_updates(&s));
    assert_replays_what_was_seen(&gw, &s, &seen).await;
    gw.stop().await;
}
