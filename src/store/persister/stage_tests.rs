//! The stage on a real SQLite file: a held prompt is committed by whoever completes it, at once;
//! one nobody completes, or that a flush joins, is the writer's.

use super::*;
use crate::store::NewSession;
use crate::store::sqlite::SqliteStore;
use tokio::sync::watch;

/// Remembers the highest seq it was told is committed.
struct Seen(watch::Sender<u64>);
impl Default for Seen {
    fn default() -> Self {
        Self(watch::channel(0).0)
    }
}
impl super::Committed for Seen {
    fn committed(&self, seq: u64) {
        self.0.send_modify(|through| *through = (*through).max(seq));
    }
    fn lost(&self) {}
}
impl Seen {
    /// The highest seq committed so far.
    fn through(&self) -> u64 {
        *self.0.borrow()
    }
}

/// Waits (10 s at most) until `seen` is told updates through `seq` are committed.
async fn committed_through(seen: &Seen, seq: u64) {
    let mut rx = seen.0.subscribe();
    tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|through| *through >= seq))
        .await
        .expect("never committed")
        .expect("the sender lives in `seen`");
}

async fn sqlite_with_session(dir: &std::path::Path) -> Arc<dyn Store> {
    let url = format!("sqlite://{}/stage.db", dir.display());
    let store = Arc::new(SqliteStore::connect(&url).await.expect("sqlite"));
    store
        .create_session(&NewSession {
            id: "s",
            owner: "alice",
            agent: "demo",
            agent_session_id: None,
            cwd: "/",
            additional_dirs: "[]",
            meta: "{}",
            now: now_micros(),
        })
        .await
        .expect("session");
    store
}

fn update(seen: &Arc<Seen>, seq: u64, more: bool) -> Item {
    Item::Update {
        session: Arc::from("s"),
        notify: seen.clone(),
        seq,
        update: format!(r#"{{"n":{seq}}}"#).into(),
        at: now_micros(),
        more,
    }
}

fn prompt(through: u64) -> Item {
    Item::Prompt {
        session: Arc::from("s"),
        title: Some("hello".into()),
        through,
    }
}

/// A persister on `store` whose holds last a minute unless answered: a test acts on a hold it
/// saw begin however loaded the machine is (the linger is 1 ms).
fn spawn_lingering(store: &Arc<dyn Store>, cancel: CancellationToken) -> (Persister, tokio::task::JoinHandle<()>) {
    let (p, task) = Persister::spawn(store.clone(), 64, 1 << 20, cancel);
    p.stage
        .as_ref()
        .expect("SQLite's writer has a stage")
        .set_linger(Duration::from_secs(60));
    (p, task)
}

/// A persister with lingering holds ([`spawn_lingering`]) on a fresh session's file, once its
/// writer waits with nothing in hand, and its stage.
async fn idle_lingering(
    dir: &std::path::Path,
    cancel: CancellationToken,
) -> (Arc<dyn Store>, Persister, tokio::task::JoinHandle<()>, Arc<Stage>) {
    let store = sqlite_with_session(dir).await;
    let (p, task) = spawn_lingering(&store, cancel);
    let stage = idle_stage(&p).await;
    (store, p, task, stage)
}

/// Sends the prompt and its chunk, and waits until the writer holds them for the answer.
async fn held(p: &Persister, seen: &Arc<Seen>) {
    p.send(prompt(1)).await;
    p.send(update(seen, 1, false)).await;
    holding(p).await;
}

/// Waits until what was sent is held on the stage.
async fn holding(p: &Persister) {
    let stage = p.stage.as_ref().expect("SQLite's writer has a stage");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !stage.is_holding() {
        assert!(std::time::Instant::now() < deadline, "nothing was held");
        tokio::task::yield_now().await;
    }
}

/// The persister's stage, once its writer waits with nothing in hand (senders may hold).
async fn idle_stage(p: &Persister) -> Arc<Stage> {
    let stage = p.stage.clone().expect("SQLite's writer has a stage");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !stage.is_writer_idle() {
        assert!(std::time::Instant::now() < deadline, "the writer never waited");
        tokio::task::yield_now().await;
    }
    stage
}

async fn stored_seqs(store: &Arc<dyn Store>) -> Vec<(i64, i64)> {
    let chunks = store.read_events("alice", "s", 0, 100).await.expect("read");
    chunks.iter().map(|c| (c.seq_from, c.seq_to)).collect()
}

/// The agent's answer completes the held prompt: its send commits both before it returns, on
/// the sender's thread, in one chunk; the prompt's title is written later by the writer.
#[tokio::test]
async fn the_send_that_completes_a_held_prompt_commits_it_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = sqlite_with_session(dir.path()).await;
    let (p, _task) = spawn_lingering(&store, CancellationToken::new());
    let seen = Arc::new(Seen::default());
    held(&p, &seen).await;
    p.send(update(&seen, 2, true)).await;
    assert_eq!(seen.through(), 0, "the rest of the burst is awaited");
    p.send(update(&seen, 3, false)).await;
    assert_eq!(seen.through(), 3, "committed by the send that completed it");
    assert_eq!(stored_seqs(&store).await, vec![(1, 3)], "one chunk, 1 to 3");
    p.flush().await.expect("flushed");
    let row = store.get_session("alice", "s").await.expect("read").expect("row");
    assert_eq!(row.title.as_deref(), Some("hello"), "the title is written after");
    assert_eq!(row.last_seq, 3);
}

/// Nobody answers: the writer commits the prompt after the linger.
#[tokio::test]
async fn a_held_prompt_nobody_answers_is_committed_by_the_writer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = sqlite_with_session(dir.path()).await;
    let (p, _task) = Persister::spawn(store.clone(), 64, 1 << 20, CancellationToken::new());
    let seen = Arc::new(Seen::default());
    let started = std::time::Instant::now();
    // Held for its answer (a hold of 1 ms: not waited for, a loaded machine may end it first).
    p.send(prompt(1)).await;
    p.send(update(&seen, 1, false)).await;
    committed_through(&seen, 1).await;
    assert!(started.elapsed() >= LINGER, "after the linger");
    assert_eq!(stored_seqs(&store).await, vec![(1, 1)]);
}

/// A flush joins the held prompt: the writer takes it back, commits it and answers the flush;
/// what is sent afterwards goes through the queue and follows in order.
#[tokio::test]
async fn a_flush_hands_a_held_prompt_back_to_the_writer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = sqlite_with_session(dir.path()).await;
    let (p, _task) = spawn_lingering(&store, CancellationToken::new());
    let seen = Arc::new(Seen::default());
    held(&p, &seen).await;
    p.flush_within(Duration::from_secs(10)).await.expect("flushed");
    assert_eq!(seen.through(), 1);
    assert!(!p.stage.as_ref().expect("stage").is_holding());
    p.send(update(&seen, 2, false)).await;
    p.flush_within(Duration::from_secs(10)).await.expect("flushed");
    assert_eq!(seen.through(), 2);
    assert_eq!(stored_seqs(&store).await, vec![(1, 1), (2, 2)]);
}

/// The writer is idle: the prompt's own send holds it (the writer's thread is not woken), the
/// answer's send commits it, and the metadata reaches the session's row at the next flush.
#[tokio::test]
async fn a_prompt_sent_to_an_idle_writer_is_held_by_its_sender() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, p, _task, stage) = idle_lingering(dir.path(), CancellationToken::new()).await;
    let seen = Arc::new(Seen::default());
    p.send(prompt(1)).await;
    assert!(stage.is_held_by_sender(), "held by the prompt's send, not the writer");
    p.send(update(&seen, 1, false)).await;
    p.send(update(&seen, 2, false)).await;
    assert_eq!(seen.through(), 2, "committed by the answer's send");
    assert!(!stage.is_holding());
    assert_eq!(stored_seqs(&store).await, vec![(1, 2)], "one chunk");
    p.flush().await.expect("flushed");
    let row = store.get_session("alice", "s").await.expect("read").expect("row");
    assert_eq!(
        row.title.as_deref(),
        Some("hello"),
        "the prompt's title, written by the writer"
    );
    assert_eq!(row.last_seq, 2);
    // A later update goes to the writer through the queue, after them.
    p.send(update(&seen, 3, false)).await;
    p.flush().await.expect("flushed");
    assert_eq!(stored_seqs(&store).await, vec![(1, 2), (3, 3)]);
}

/// Shutdown while a sender holds a prompt: the writer takes it and commits it before stopping.
#[tokio::test]
async fn shutdown_commits_what_a_sender_holds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cancel = CancellationToken::new();
    let (store, p, task, stage) = idle_lingering(dir.path(), cancel.clone()).await;
    let seen = Arc::new(Seen::default());
    p.send(prompt(1)).await;
    p.send(update(&seen, 1, false)).await;
    assert!(stage.is_held_by_sender());
    cancel.cancel();
    task.await.expect("writer ended");
    assert_eq!(seen.through(), 1);
    assert_eq!(stored_seqs(&store).await, vec![(1, 1)]);
}

/// The writer is idle and nobody answers the prompt its own send holds: the stage's ticker hands
/// it back after the linger (within a tick or two), and the writer commits it.
#[tokio::test]
async fn a_prompt_its_own_send_holds_that_nobody_answers_is_committed_after_the_linger() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = sqlite_with_session(dir.path()).await;
    let (p, _task) = Persister::spawn(store.clone(), 64, 1 << 20, CancellationToken::new());
    let stage = idle_stage(&p).await;
    let seen = Arc::new(Seen::default());
    let started = std::time::Instant::now();
    p.send(prompt(1)).await;
    p.send(update(&seen, 1, false)).await;
    assert!(stage.is_held_by_sender(), "held by the prompt's send");
    committed_through(&seen, 1).await;
    assert!(started.elapsed() >= LINGER, "after the linger");
    assert_eq!(stored_seqs(&store).await, vec![(1, 1)]);
}

/// What a sender's hold committed leaves put-off writes (the prompt's title, the row's advance):
/// the ticker wakes the writer for them once the holds stop, with no flush asking.
#[tokio::test]
async fn a_senders_commit_reaches_the_session_row_without_a_flush() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, p, _task, stage) = idle_lingering(dir.path(), CancellationToken::new()).await;
    let seen = Arc::new(Seen::default());
    p.send(prompt(1)).await;
    assert!(stage.is_held_by_sender());
    p.send(update(&seen, 1, false)).await;
    p.send(update(&seen, 2, false)).await;
    assert_eq!(seen.through(), 2, "committed by the answer's send");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let row = store.get_session("alice", "s").await.expect("read").expect("row");
        let bytes = store.stored_bytes("alice").await.expect("bytes");
        if row.title.as_deref() == Some("hello") && row.message_count == 1 && bytes > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never written: title {:?}, {} messages, {bytes} bytes",
            row.title,
            row.message_count
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A burst the agent wrote at once (each update sent with the agent's next one already read) is
/// one commit: the writer holds it on the stage, updates join it without waking the writer, and
/// the send of the burst's last update commits it (a stream committed a few updates at a time).
#[tokio::test]
async fn a_burst_is_held_until_its_last_update_and_committed_as_one_chunk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, p, _task, _) = idle_lingering(dir.path(), CancellationToken::new()).await;
    let seen = Arc::new(Seen::default());
    p.send(update(&seen, 1, true)).await;
    holding(&p).await;
    p.send(update(&seen, 2, true)).await;
    assert_eq!(seen.through(), 0, "held while the burst goes on");
    p.send(update(&seen, 3, false)).await;
    assert_eq!(seen.through(), 3, "committed by the send of the burst's last update");
    assert_eq!(stored_seqs(&store).await, vec![(1, 3)], "one chunk, 1 to 3");
}

fn controls(value: &str) -> Item {
    Item::Controls {
        session: Arc::from("s"),
        controls: format!(r#"{{"mode":"{value}"}}"#),
    }
}

/// A sender commits a prompt whose answer changed the controls; the next prompt, which changes
/// them again, is handed back to the writer (here by a flush; a linger running out does the
/// same). The newer controls are the ones stored: the writer's batch follows what senders
/// committed before it, metadata too.
#[tokio::test]
async fn controls_a_sender_committed_do_not_overwrite_newer_ones_the_writer_took_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, p, _task, stage) = idle_lingering(dir.path(), CancellationToken::new()).await;
    let seen = Arc::new(Seen::default());
    p.send(prompt(1)).await;
    p.send(update(&seen, 1, false)).await;
    p.send(controls("code")).await;
    p.send(update(&seen, 2, false)).await;
    assert_eq!(seen.through(), 2, "committed by the answer's send");
    assert!(stage.is_writer_idle(), "the writer was not woken");
    p.send(prompt(3)).await;
    assert!(stage.is_held_by_sender(), "the second prompt is held by its send");
    p.send(update(&seen, 3, false)).await;
    p.send(controls("plan")).await;
    p.flush_within(Duration::from_secs(10)).await.expect("flushed");
    let stored = store.session_controls("alice", "s").await.expect("read");
    assert_eq!(stored.as_deref(), Some(r#"{"mode":"plan"}"#), "the newest controls");
}
