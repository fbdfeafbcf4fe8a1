//! The stdout reader and the updates held for sessions being created, against a real child:
//! `cat` echoes every line the test sends it, so the test writes what the agent "says".

use axum::extract::ws::Utf8Bytes;
use tokio::sync::{Semaphore, watch};

use super::lines::MAX_OPEN_ASKS;
use super::*;
use crate::agents::pool::early::MAX_ENTRIES;
use crate::agents::pool::reaper::GroupRecord;
use crate::infra::outbox::Outbox;

/// How long any one wait of these tests may take.
const WAIT: Duration = Duration::from_secs(10);

/// A session that records the updates handed to it; each hand-on first waits for a permit of
/// `gate` (a slow store when it has none).
struct Recorder {
    id: &'static str,
    gate: Semaphore,
    /// Hand-ons begun (the gate may still hold them).
    begun: watch::Sender<usize>,
    /// The updates handed on, raw, in order.
    got: Mutex<Vec<String>>,
}

impl Recorder {
    fn new(id: &'static str, open: bool) -> Arc<Self> {
        Arc::new(Self {
            id,
            gate: Semaphore::new(if open { Semaphore::MAX_PERMITS } else { 0 }),
            begun: watch::Sender::new(0),
            got: Mutex::default(),
        })
    }

    fn got(&self) -> Vec<String> {
        lock(&self.got).clone()
    }
}

#[async_trait::async_trait]
impl SessionRoute for Recorder {
    fn session_id(&self) -> &str {
        self.id
    }
    async fn publish(&self, update: &RawValue, _: Option<&RawValue>) {
        self.begun.send_modify(|n| *n += 1);
        self.gate.acquire().await.expect("gate open").forget();
        lock(&self.got).push(update.get().to_owned());
    }
    fn agent_request(self: Arc<Self>, _: &Arc<AgentProcess>, _: Box<RawValue>, _: &str, _: String) {}
    fn respond(&self, _: &Outbox, _: &RawValue, _: Utf8Bytes) {}
    fn unbound(&self, _: u64) {}
}

/// `cat` as the agent: what the test sends comes back on its stdout.
fn echo_agent(dir: &tempfile::TempDir, tracker: &TaskTracker) -> Arc<AgentProcess> {
    agent(dir, tracker, Launch::direct("cat", &[]))
}

/// `command` as the agent, unsandboxed.
fn agent(dir: &tempfile::TempDir, tracker: &TaskTracker, launch: Launch) -> Arc<AgentProcess> {
    let groups = Arc::new(GroupRecord::open(&dir.path().join("agent-groups")));
    let pipes = PipeLimits {
        max_line_bytes: 1 << 20,
        input_queue_bytes: 1 << 20,
    };
    AgentProcess::spawn(1, Arc::from("test-agent"), None, launch, pipes, &groups, tracker).expect("spawn the agent")
}

/// The agent's `session/update` for `sid`, numbered `n`.
async fn say(process: &AgentProcess, sid: &str, n: usize) {
    let line = format!(
        r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{sid}","update":{{"n":{n}}}}}}}"#
    );
    process.send_line(line).await.expect("cat takes it");
}

fn numbered(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|n| format!(r#"{{"n":{n}}}"#)).collect()
}

fn held(process: &AgentProcess) -> usize {
    lock(&process.routes).held.len()
}

/// Polls `what` until it holds (state, not an event: nothing fires when the reader parks).
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let polled = async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    tokio::time::timeout(WAIT, polled)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting until {what}"));
}

/// The reviewer's case: session `a` is bound and its client has its id, but its hand-on is
/// queued behind session `b`'s, whose store is slow. What the agent streams for `a` meanwhile
/// (three times what is held) waits in the agent's pipe instead of being dropped, and `a` gets
/// all of it in order once `b`'s store moves; an update for another session, read after, waits
/// its turn too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_sessions_updates_wait_for_room_instead_of_being_dropped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tracker = TaskTracker::new();
    let process = echo_agent(&dir, &tracker);
    let (a, b, c) = (
        Recorder::new("a", true),
        Recorder::new("b", false),
        Recorder::new("c", true),
    );
    let early_b = process.hold_updates(Arc::from("b"));
    let early_a = process.hold_updates(Arc::from("a"));
    say(&process, "b", 0).await;
    eventually("b's update is held", || held(&process) == 1).await;
    for (sid, route) in [("a", &a), ("b", &b), ("c", &c)] {
        let route: Arc<dyn SessionRoute> = route.clone();
        assert!(process.bind_session(Arc::from(sid), route));
    }
    // b hands on under the per-process lock, and its store does not move.
    let handing_b = tokio::spawn(early_b.hand_on());
    let mut begun = b.begun.subscribe();
    tokio::time::timeout(WAIT, begun.wait_for(|n| *n == 1))
        .await
        .expect("b's hand-on has begun")
        .expect("b's recorder");
    let handing_a = tokio::spawn(early_a.hand_on());

    let n = 3 * MAX_ENTRIES;
    for i in 0..n {
        say(&process, "a", i).await;
    }
    say(&process, "c", 0).await;
    eventually("the held buffer is full of a's updates", || {
        held(&process) == MAX_ENTRIES
    })
    .await;
    assert!(a.got().is_empty(), "nothing of a's before its hand-on");
    assert!(
        c.got().is_empty(),
        "the reader waits for room: c's update is behind a's"
    );

    b.gate.add_permits(Semaphore::MAX_PERMITS >> 1);
    assert_eq!(handing_b.await.expect("b's hand-on"), 1);
    assert_eq!(
        handing_a.await.expect("a's hand-on"),
        MAX_ENTRIES,
        "the rest of a's came through the reader, after"
    );
    eventually("c's update is handed on", || c.got().len() == 1).await;
    assert_eq!(a.got(), numbered(0..n), "all of a's, in the agent's order");
    assert_eq!(b.got(), numbered(0..1));
    assert_eq!(held(&process), 0);
    process.stop();
    tracker.close();
    tokio::time::timeout(WAIT, tracker.wait())
        .await
        .expect("the process's tasks end");
}

/// A session whose creation fails while the reader waits for room to hold its updates lets the
/// reader go on: what was held is forgotten, and what it sends next, for an id nobody claims
/// now, is held as any unknown id's is (bounded, to expire).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_given_up_lets_a_waiting_reader_go_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tracker = TaskTracker::new();
    let process = echo_agent(&dir, &tracker);
    let c = Recorder::new("c", true);
    let early = process.hold_updates(Arc::from("a"));
    assert!(process.bind_session(Arc::from("c"), c.clone()));
    let extra = 10;
    for i in 0..MAX_ENTRIES + extra {
        say(&process, "a", i).await;
    }
    say(&process, "c", 0).await;
    eventually("the held buffer is full of a's updates", || {
        held(&process) == MAX_ENTRIES
    })
    .await;
    assert!(c.got().is_empty(), "the reader waits for room");

    drop(early);
    eventually("c's update is handed on", || c.got().len() == 1).await;
    assert_eq!(
        held(&process),
        extra,
        "what came after the claim ended is held unclaimed"
    );
    process.stop();
    tracker.close();
    tokio::time::timeout(WAIT, tracker.wait())
        .await
        .expect("the process's tasks end");
}

/// A session that records each update handed to it with whether the agent's next update was
/// already read behind it ([`more_lines_follow`]), and how many came in each hand-on.
#[derive(Default)]
struct BurstRecorder {
    id: &'static str,
    got: Mutex<Vec<(String, bool)>>,
    runs: Mutex<Vec<usize>>,
}

#[async_trait::async_trait]
impl SessionRoute for BurstRecorder {
    fn session_id(&self) -> &str {
        self.id
    }
    async fn publish(&self, update: &RawValue, _: Option<&RawValue>) {
        lock(&self.runs).push(1);
        lock(&self.got).push((update.get().to_owned(), more_lines_follow()));
    }
    async fn publish_burst(&self, updates: &[(&RawValue, Option<&RawValue>)], more: bool) {
        lock(&self.runs).push(updates.len());
        for (i, (update, _)) in updates.iter().enumerate() {
            let follows = more || i + 1 < updates.len();
            lock(&self.got).push((update.get().to_owned(), follows));
        }
    }
    fn agent_request(self: Arc<Self>, _: &Arc<AgentProcess>, _: Box<RawValue>, _: &str, _: String) {}
    fn respond(&self, _: &Outbox, _: &RawValue, _: Utf8Bytes) {}
    fn unbound(&self, _: u64) {}
}

/// Lines the agent wrote at once are handed on as a burst, each session's updates in a row
/// together: each session gets its updates in the agent's order, interleaved with another's and
/// with a line that is not an update, and an update is marked as followed exactly when the
/// agent's next line, already read, is an update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_reaches_each_session_in_order_marked_where_an_update_follows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tracker = TaskTracker::new();
    let update = |sid: &str, n: usize| {
        format!(
            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{sid}","update":{{"n":{n}}}}}}}"#
        )
    };
    let burst = [
        update("a", 0),
        update("a", 1),
        update("b", 0),
        update("a", 2),
        // An answer nobody waits for: not an update, so a's 2 is not followed by one.
        String::from(r#"{"jsonrpc":"2.0","id":999,"result":{}}"#),
        update("a", 3),
        update("b", 1),
    ]
    .join("\n")
        + "\n";
    // Under a pipe's atomic size: `cat` writes the file in one piece, read at once.
    assert!(burst.len() < 4096);
    let file = dir.path().join("burst");
    std::fs::write(&file, burst).expect("write the burst");
    // The agent writes it once told to (after the sessions are bound).
    let file = file.to_str().expect("a UTF-8 path");
    let process = agent(
        &dir,
        &tracker,
        Launch::direct("sh", &["-c", "read _; exec cat \"$0\"", file]),
    );
    let (a, b) = (
        Arc::new(BurstRecorder {
            id: "a",
            ..BurstRecorder::default()
        }),
        Arc::new(BurstRecorder {
            id: "b",
            ..BurstRecorder::default()
        }),
    );
    for (sid, route) in [("a", &a), ("b", &b)] {
        let route: Arc<dyn SessionRoute> = route.clone();
        assert!(process.bind_session(Arc::from(sid), route));
    }
    process.send_line(String::from("go")).await.expect("sh takes it");
    eventually("every update is handed on", || {
        lock(&a.got).len() == 4 && lock(&b.got).len() == 2
    })
    .await;
    let marked = |range: &[(usize, bool)]| -> Vec<(String, bool)> {
        range
            .iter()
            .map(|&(n, more)| (format!(r#"{{"n":{n}}}"#), more))
            .collect()
    };
    assert_eq!(*lock(&a.got), marked(&[(0, true), (1, true), (2, false), (3, true)]));
    assert_eq!(*lock(&b.got), marked(&[(0, true), (1, false)]));
    // Handed on in runs: a session's updates in a row together, not one by one.
    assert_eq!(*lock(&a.runs), [2, 1, 1]);
    assert_eq!(*lock(&b.runs), [1, 1]);
    process.stop();
    tracker.close();
    tokio::time::timeout(WAIT, tracker.wait())
        .await
        .expect("the process's tasks end");
}

/// An agent that asks its client without end (permission requests no tab answers) is answered
/// `-32603` at once past [`MAX_OPEN_ASKS`]: what waits for a client stays bounded, and the
/// process goes on routing its updates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_asks_without_end_is_refused_past_the_cap() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tracker = TaskTracker::new();
    let process = echo_agent(&dir, &tracker);
    let s = Recorder::new("s", true);
    let route: Arc<dyn SessionRoute> = s.clone();
    assert!(process.bind_session(Arc::from("s"), route));
    for id in 0..MAX_OPEN_ASKS + 20 {
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"session/request_permission","params":{{"sessionId":"s","toolCall":{{"toolCallId":"t{id}"}},"options":[]}}}}"#
        );
        process.send_line(line).await.expect("cat takes it");
    }
    // An update after them: once it is handed on, every request before it was read.
    say(&process, "s", 0).await;
    eventually("the update after the requests", || s.got().len() == 1).await;
    assert_eq!(lock(&process.asks).len(), MAX_OPEN_ASKS, "the rest were refused");
    process.stop();
    tracker.close();
    tokio::time::timeout(WAIT, tracker.wait())
        .await
        .expect("the process's tasks end");
}
