//! Several `acp-gateway serve` processes on one Postgres (docs/replicas.md): a session
//! is served by one replica at a time (its lease), clients of the others get every update from
//! the database, their prompts go to the serving replica through Postgres, and when that replica
//! is SIGKILLed another one takes the session over with the transcript whole.

use crate::common;
mod leases;
mod revoke;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::serve_process::ServeProcess;
use common::{Client, SECRET, WAIT, seq};
use serde_json::{Value, json};

/// Lease time in these tests (production default: 10 s).
const LEASE_SECS: u64 = 5;

/// One shared workspace root and database for every replica; each its own data directory.
struct Cluster {
    _tmp: tempfile::TempDir,
    dir: std::path::PathBuf,
    db_url: String,
}

impl Cluster {
    async fn new() -> Self {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().canonicalize().expect("canon");
        std::fs::create_dir_all(dir.join("work")).expect("workspace");
        Self {
            _tmp: tmp,
            dir,
            db_url: common::pg::fresh_database().await,
        }
    }

    /// Starts replica `name`.
    async fn replica(&self, name: &str) -> ServeProcess {
        ServeProcess::start(&self.config(name, name), &self.db_url, SECRET).await
    }

    /// Writes the configuration of a process `name` with replica id `id`; returns its path.
    fn config(&self, name: &str, id: &str) -> std::path::PathBuf {
        let data = self.dir.join(name);
        let config = self.dir.join(format!("{name}.toml"));
        std::fs::write(
            &config,
            format!(
                "data_dir = {:?}\nreplica_id = {:?}\nworkspace_roots = [{:?}]\n\
                 [limits]\nclient_queue = 1000000\nclient_queue_bytes = 1000000000\nlease_ttl_secs = {LEASE_SECS}\nsweep_interval_secs = 1\n\
                 [agents.default]\ncommand = {:?}\nargs = [\"demo-agent\", \"--delay-us\", \"0\"]\nsandbox = \"none\"\n",
                data.display().to_string(),
                id,
                self.dir.join("work").display().to_string(),
                common::gateway_bin(),
            ),
        )
        .expect("config");
        config
    }
}

/// Loads `session` on `c` (replaying everything) and returns the replayed seqs.
async fn load(c: &mut Client, session: &str) -> Vec<Value> {
    c.load(session).await
}

/// Fails unless `seqs` is exactly `from..=to`: nothing lost, duplicated or out of order.
fn assert_exact(who: &str, seqs: &[u64], from: u64, to: u64) {
    let want: Vec<u64> = (from..=to).collect();
    if seqs != want {
        let dups = seqs.len() - seqs.iter().collect::<HashSet<_>>().len();
        let missing = want.iter().filter(|s| !seqs.contains(s)).count();
        let disorder = seqs.windows(2).filter(|w| w[0] >= w[1]).count();
        panic!(
            "{who}: expected seqs {from}..={to}, got {} ({missing} missing, {dups} duplicated, {disorder} out of order); first {:?}",
            seqs.len(),
            &seqs[..seqs.len().min(10)]
        );
    }
}

fn seqs(updates: &[Value]) -> Vec<u64> {
    updates.iter().map(seq).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_created_on_one_replica_is_listed_and_loaded_on_another() {
    let cluster = Cluster::new().await;
    let (a, b) = (cluster.replica("a").await, cluster.replica("b").await);
    let mut ca = a.client("alice").await;
    let s = ca.new_session().await;
    let r = ca.prompt(&s, "hello [chunks=20]").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let on_a = ca.take_updates(&s);

    let mut cb = b.client("alice").await;
    let list = cb.request("session/list", json!({})).await;
    let listed: Vec<&str> = list["result"]["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .filter_map(|x| x["sessionId"].as_str())
        .collect();
    assert_eq!(listed, vec![s.as_str()], "B lists A's session: {list}");
    let replayed = load(&mut cb, &s).await;
    assert_eq!(seqs(&replayed), seqs(&on_a), "B replays what A's client saw");
    let updates = |v: &[Value]| v.iter().map(|u| u["params"]["update"].clone()).collect::<Vec<_>>();
    assert_eq!(updates(&replayed), updates(&on_a), "with the same content");
    // Another user on B sees none of it.
    let mut eve = b.client("eve").await;
    let r = eve
        .request("session/load", json!({"sessionId": s, "cwd": "/", "mcpServers": []}))
        .await;
    assert_eq!(r["error"]["code"], -32002, "{r}");
}

/// Clients on `a`, `b` and `c` are attached to one session served by `a`; the client on `b`
/// prompts (its prompt goes to `a` through Postgres), then the one on `a`. Every client gets
/// every update exactly once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_on_three_replicas_get_every_update_once_in_order_while_b_prompts() {
    const CHUNKS: u64 = 400;
    let cluster = Cluster::new().await;
    let (a, b, c) = (
        cluster.replica("a").await,
        cluster.replica("b").await,
        cluster.replica("c").await,
    );
    let mut ca = a.client("alice").await;
    let s = ca.new_session().await;
    let mut cb = b.client("alice").await;
    let mut cc = c.client("alice").await;
    assert!(load(&mut cb, &s).await.is_empty());
    assert!(load(&mut cc, &s).await.is_empty());

    let started = Instant::now();
    let r = tokio::time::timeout(WAIT, cb.prompt(&s, &format!("from b [chunks={CHUNKS}]")))
        .await
        .expect("B's prompt is answered");
    assert_eq!(r["result"]["stopReason"], "end_turn", "B's prompt through A: {r}");
    let round_trip = started.elapsed();
    let on_b = cb.take_updates(&s);
    let last = seqs(&on_b).last().copied().expect("B got updates before its answer");
    // The answer comes after every update it followed.
    assert_exact("client on B (the prompter), before its answer", &seqs(&on_b), 1, last);
    let on_a = tokio::time::timeout(WAIT, ca.updates_until(&s, |u| seq(u) >= last))
        .await
        .expect("A's client gets them");
    assert_exact("client on A (serving replica)", &seqs(&on_a), 1, last);
    let on_c = tokio::time::timeout(WAIT, cc.updates_until(&s, |u| seq(u) >= last))
        .await
        .expect("C's client gets them");
    assert_exact("client on C", &seqs(&on_c), 1, last);

    // And the other way: A's client prompts, B and C watch.
    let r = ca.prompt(&s, &format!("from a [chunks={CHUNKS}]")).await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let on_a2 = ca.take_updates(&s);
    let last2 = seqs(&on_a2).last().copied().expect("updates");
    assert_exact("client on A, second prompt", &seqs(&on_a2), last + 1, last2);
    for (who, cl) in [("client on B", &mut cb), ("client on C", &mut cc)] {
        let got = tokio::time::timeout(WAIT, cl.updates_until(&s, |u| seq(u) >= last2))
            .await
            .expect("watchers get the second prompt");
        assert_exact(who, &seqs(&got), last + 1, last2);
    }
    // Nothing more arrives later (no duplicates after the fact).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = cb.request("session/list", json!({})).await;
    assert!(r.get("result").is_some());
    assert!(cb.take_updates(&s).is_empty(), "B got a duplicate late");
    println!(
        "3 replicas: {last} + {} updates, each client exactly once in order; B's remote prompt round trip {round_trip:?}",
        last2 - last
    );
}

/// A client on `a` streams a long prompt; a client on `b` watches. `a` is SIGKILLed mid-stream:
/// `b`'s client prompts again until `b` has taken the session over, and the transcript is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_serving_replica_mid_stream_is_taken_over_with_the_transcript_whole() {
    let (pair, mut ca, mut cb, s, _db) = b_follows_a_session().await;
    let (a, b) = (pair.a, pair.b);
    ca.start(
        "session/prompt",
        json!({"sessionId": s, "prompt": [{"type": "text", "text": "long [chunks=20000] [delay_us=200]"}]}),
    )
    .await;
    // B's client is well into the stream.
    let mut on_b = tokio::time::timeout(WAIT, cb.updates_until(&s, |u| seq(u) >= 300))
        .await
        .expect("B's client follows A's stream");
    a.kill().await;
    let killed = Instant::now();

    // Prompt on B until it serves the session (at once if Postgres has seen A's connections
    // close; within the lease time otherwise).
    let mut attempts = 0;
    let answer = loop {
        attempts += 1;
        let r = tokio::time::timeout(WAIT, cb.prompt(&s, "after the kill [chunks=5]"))
            .await
            .expect("answered");
        if r.get("result").is_some() {
            break r;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(LEASE_SECS * 3),
            "B did not take the session over: {r}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let takeover = killed.elapsed();
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    on_b.extend(cb.take_updates(&s));
    let got = seqs(&on_b);
    let last = *got.last().expect("updates");
    assert_exact("client on B across the SIGKILL and the takeover", &got, 1, last);

    // The transcript is whole: a fresh client replays exactly what B's client saw.
    let mut fresh = b.client("alice").await;
    let replayed = load(&mut fresh, &s).await;
    assert_eq!(seqs(&replayed), got, "the stored transcript is what the client saw");
    let content = |v: &[Value]| v.iter().map(|u| u["params"]["update"].clone()).collect::<Vec<_>>();
    assert_eq!(content(&replayed), content(&on_b));
    println!(
        "SIGKILL of the serving replica: B took over {takeover:?} after the kill ({attempts} prompt attempts; lease {LEASE_SECS} s); \
         transcript whole, {last} updates, B's client saw each once in order"
    );
    assert!(
        takeover < Duration::from_secs(LEASE_SECS + 2),
        "takeover took {takeover:?}"
    );
}

/// The `agent_message_chunk` texts among `updates`.
fn chunk_texts(updates: &[Value]) -> Vec<String> {
    updates
        .iter()
        .filter(|u| u["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|u| u["params"]["update"]["content"]["text"].as_str().map(str::to_string))
        .collect()
}

fn allow(request: &Value) -> Value {
    json!({"jsonrpc": "2.0", "id": request["id"], "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}})
}

/// A session created on `a` whose creator has gone: its only client is on `b`. `b`'s prompt
/// runs on `a` (through Postgres); `a`'s agent asks permission, which reaches the client on `b`
/// through Postgres too, and its answer reaches the agent on `a`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permission_request_reaches_a_client_on_another_replica_and_its_answer_the_agent() {
    let cluster = Cluster::new().await;
    let (a, b) = (cluster.replica("a").await, cluster.replica("b").await);
    let mut ca = a.client("alice").await;
    let s = ca.new_session().await;
    ca.close().await;
    let mut cb = b.client("alice").await;
    assert!(load(&mut cb, &s).await.is_empty());

    let id = cb
        .start(
            "session/prompt",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": "from b [permission] [chunks=3]"}]}),
        )
        .await;
    let req = tokio::time::timeout(WAIT, cb.wait_for(|m| m["method"] == "session/request_permission"))
        .await
        .expect("B's client is asked");
    assert_eq!(
        req["params"]["sessionId"],
        s.as_str(),
        "under the gateway's session id: {req}"
    );
    cb.send(allow(&req)).await;
    let done = tokio::time::timeout(WAIT, cb.answer(id)).await.expect("the turn ends");
    assert_eq!(done["result"]["stopReason"], "end_turn", "{done}");
    let chunks = chunk_texts(&cb.take_updates(&s));
    assert!(
        !chunks.is_empty() && chunks.iter().all(|c| c.contains("allowed")),
        "the agent on A got B's 'allow': {chunks:?}"
    );
}

/// Clients on `a` (serving) and `b` are both asked one permission request; `b`'s answer comes
/// first and settles it, and `a`'s client is told `$/cancel_request` for its copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permission_request_is_asked_on_both_replicas_and_the_first_answer_cancels_the_other() {
    let (_pair, mut ca, mut cb, s, _db) = b_follows_a_session().await;

    let id = ca
        .start(
            "session/prompt",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": "from a [permission] [chunks=3]"}]}),
        )
        .await;
    let on_a = tokio::time::timeout(WAIT, ca.wait_for(|m| m["method"] == "session/request_permission"))
        .await
        .expect("A's client is asked");
    let on_b = tokio::time::timeout(WAIT, cb.wait_for(|m| m["method"] == "session/request_permission"))
        .await
        .expect("B's client is asked");
    assert_eq!(on_a["params"], on_b["params"], "the same request");
    cb.send(allow(&on_b)).await;
    let cancel = tokio::time::timeout(WAIT, ca.wait_for(|m| m["method"] == "$/cancel_request"))
        .await
        .expect("A's client is told");
    assert_eq!(cancel["params"]["requestId"], on_a["id"], "{cancel}");
    let done = tokio::time::timeout(WAIT, ca.answer(id)).await.expect("the turn ends");
    assert_eq!(done["result"]["stopReason"], "end_turn", "{done}");
    let chunks = chunk_texts(&ca.take_updates(&s));
    assert!(
        !chunks.is_empty() && chunks.iter().all(|c| c.contains("allowed")),
        "the agent got B's 'allow': {chunks:?}"
    );
    // A's late answer is ignored, and B's client is not told to cancel what it answered.
    ca.send(json!({"jsonrpc": "2.0", "id": on_a["id"], "result": {"outcome": {"outcome": "selected", "optionId": "reject"}}}))
        .await;
    let on_b_updates = tokio::time::timeout(
        WAIT,
        cb.updates_until(&s, |u| {
            chunk_texts(std::slice::from_ref(u))
                .iter()
                .any(|c| c.contains("allowed"))
        }),
    )
    .await
    .expect("B's client follows the turn");
    assert!(!on_b_updates.is_empty());
    assert!(
        !cb.inbox.iter().any(|m| m["method"] == "$/cancel_request"),
        "the client that answered is not told to cancel: {:?}",
        cb.inbox
    );
}

/// A second process configured with a replica id that a running replica already uses refuses
/// to start, saying why (they would take each other's messages and leases).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_id_already_in_use_refuses_to_start_with_a_clear_error() {
    let cluster = Cluster::new().await;
    let a = cluster.replica("a").await;
    // A serves something: its bus (and the id's lock) is up.
    let mut ca = a.client("alice").await;
    let s = ca.new_session().await;
    assert_eq!(ca.prompt(&s, "hi").await["result"]["stopReason"], "end_turn");
    let out = tokio::time::timeout(
        WAIT,
        tokio::process::Command::new(common::gateway_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(cluster.config("a2", "a"))
            .env("ACP_GATEWAY_JWT_SECRET", SECRET)
            .env("DATABASE_URL", &cluster.db_url)
            .env_remove("ACP_GATEWAY_REPLICA_ID")
            .stdin(std::process::Stdio::null())
            .output(),
    )
    .await
    .expect("it exits at once")
    .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a second replica \"a\" started: {stderr}");
    assert!(stderr.contains("already uses replica id \"a\""), "{stderr}");
    // A is unharmed, and a replica under its own id starts.
    assert_eq!(ca.prompt(&s, "still here").await["result"]["stopReason"], "end_turn");
    let _b = cluster.replica("b").await;
}

/// Messages and watcher rows addressed to a replica gone from the database are swept, and so
/// are messages nobody read for too long; a live replica's are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_left_for_dead_replicas_are_swept() {
    use sqlx::{Connection, Row};
    let cluster = Cluster::new().await;
    let a = cluster.replica("a").await;
    let mut ca = a.client("alice").await;
    let s = ca.new_session().await;
    let mut db = sqlx::PgConnection::connect(&cluster.db_url).await.expect("db");
    for (target, age) in [("ghost", 60), ("a", 60), ("ghost", 0), ("a", 3600)] {
        sqlx::query(
            "INSERT INTO replica_messages (target, body, created_at) VALUES ($1, '{}', now() - make_interval(secs => $2))",
        )
        .bind(target)
        .bind(f64::from(age))
        .execute(&mut db)
        .await
        .expect("insert");
    }
    for table in ["session_watchers", "session_followers"] {
        sqlx::query(&format!(
            "INSERT INTO {table} (session_id, replica) VALUES ($1, 'ghost')"
        ))
        .bind(&s)
        .execute(&mut db)
        .await
        .expect("ghost's row");
    }
    let replica = acp_gateway::replica::Replica::connect(&cluster.db_url, "sweeper", Duration::from_secs(LEASE_SECS))
        .await
        .expect("replica");
    let swept = replica.sweep_dead(Duration::from_secs(600)).await.expect("sweep");
    assert_eq!(
        swept, 4,
        "ghost's old message, watcher and follower rows, and a's hour-old message"
    );
    let left: Vec<(String, i64)> =
        sqlx::query("SELECT target, extract(epoch FROM now() - created_at)::bigint FROM replica_messages ORDER BY id")
            .fetch_all(&mut db)
            .await
            .expect("rows")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
    let targets: Vec<&str> = left.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        targets,
        ["a", "ghost"],
        "a's recent message, and ghost's within a lease time: {left:?}"
    );
    let watchers: Vec<String> = sqlx::query_scalar("SELECT replica FROM session_watchers WHERE session_id = $1")
        .bind(&s)
        .fetch_all(&mut db)
        .await
        .expect("watchers");
    assert_eq!(watchers, ["a"], "A's own row stays");
    let followers: Vec<String> = sqlx::query_scalar("SELECT replica FROM session_followers WHERE session_id = $1")
        .bind(&s)
        .fetch_all(&mut db)
        .await
        .expect("followers");
    assert_eq!(followers, ["a"], "A's own row stays");
}

/// A replica whose listening connection was lost may find its rows swept by another meanwhile
/// (it looked gone from the database), and a lease taken since may not announce to it. Once it
/// listens again it writes its rows again and asks the serving replica to announce: its client
/// gets the next prompt's updates live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_back_on_the_bus_follows_its_sessions_again() {
    let (_pair, mut ca, mut cb, s, mut db) = b_follows_a_session().await;
    // As after a sweep while b was away, and a lease taken that did not see b.
    sqlx::query("DELETE FROM session_followers WHERE replica = 'b'")
        .execute(&mut db)
        .await
        .expect("sweep b's row");
    sqlx::query("UPDATE session_leases SET announce = false")
        .execute(&mut db)
        .await
        .expect("a lease that does not announce");
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'acp-gateway b' AND datname = current_database()")
        .execute(&mut db)
        .await
        .expect("cut b off the bus");
    let deadline = Instant::now() + WAIT;
    while b_follows(&mut db, &s).await == 0 {
        assert!(Instant::now() < deadline, "b did not write its row again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = ca.prompt(&s, "after b came back [chunks=50]").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let last = seqs(&ca.take_updates(&s)).last().copied().expect("updates on a");
    let on_b = tokio::time::timeout(WAIT, cb.updates_until(&s, |u| seq(u) >= last))
        .await
        .expect("b's client gets the prompt's updates live");
    assert_exact("client on B", &seqs(&on_b), 1, last);
}

/// Replicas a and b on one database (and their directories).
struct Pair {
    _cluster: Cluster,
    a: ServeProcess,
    b: ServeProcess,
}

/// Replicas a and b, a session of alice's made on a with her client there, her client on b that
/// loaded it (so b follows it), and a connection to the database.
async fn b_follows_a_session() -> (Pair, Client, Client, String, sqlx::PgConnection) {
    use sqlx::Connection;
    let cluster = Cluster::new().await;
    let (a, b) = (cluster.replica("a").await, cluster.replica("b").await);
    let mut ca = a.client("alice").await;
    let s = ca.new_session().await;
    let mut cb = b.client("alice").await;
    assert!(load(&mut cb, &s).await.is_empty());
    let mut db = sqlx::PgConnection::connect(&cluster.db_url).await.expect("db");
    assert_eq!(
        b_follows(&mut db, &s).await,
        1,
        "b follows the session its client loaded"
    );
    let pair = Pair {
        _cluster: cluster,
        a,
        b,
    };
    (pair, ca, cb, s, db)
}

/// Whether `session`'s lease announces its commits.
async fn announces(db: &mut sqlx::PgConnection, session: &str) -> bool {
    sqlx::query_scalar("SELECT announce FROM session_leases WHERE session_id = $1")
        .bind(session)
        .fetch_one(db)
        .await
        .expect("lease")
}

/// How many rows say that replica `b` follows `session`.
async fn b_follows(db: &mut sqlx::PgConnection, session: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM session_followers WHERE session_id = $1 AND replica = 'b'")
        .bind(session)
        .fetch_one(db)
        .await
        .expect("count")
}

/// A replica whose clients of a session are gone stops following it once the session has left
/// its memory (the registry's sweep, every second here): the next commit announced to it makes it delete
/// its row and the lease stop announcing, since nobody else follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_clients_left_stops_following() {
    let (pair, mut ca, cb, s, mut db) = b_follows_a_session().await;
    let r = ca.prompt(&s, "while b's client is there").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    assert!(announces(&mut db, &s).await, "the lease announces to b");
    cb.close().await;
    // Each prompt's commit is announced to b while it follows; b stops once its sweep has
    // dropped the session (within a second or two).
    let deadline = Instant::now() + Duration::from_secs(15);
    while b_follows(&mut db, &s).await == 1 {
        assert!(
            Instant::now() < deadline,
            "b still follows a session none of its clients has"
        );
        let r = ca.prompt(&s, "nobody on b").await;
        assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    while announces(&mut db, &s).await {
        assert!(Instant::now() < deadline, "the lease still announces");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A client on b again: b follows again and gets the next prompt live.
    let mut cb = pair.b.client("alice").await;
    let before = load(&mut cb, &s).await;
    assert!(!before.is_empty(), "the transcript so far");
    assert_eq!(b_follows(&mut db, &s).await, 1, "b follows again");
    let r = ca.prompt(&s, "b is back [chunks=20]").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let last = seqs(&ca.take_updates(&s)).last().copied().expect("updates on a");
    let on_b = tokio::time::timeout(WAIT, cb.updates_until(&s, |u| seq(u) >= last))
        .await
        .expect("b's client gets the prompt's updates live");
    let first = seqs(&before).last().copied().expect("seq") + 1;
    assert_exact("client on B", &seqs(&on_b), first, last);
}
