//! The transcript writer against a store that fails on command.

use super::*;
use crate::store::EventChunk;

/// Succeeds, except: every write holding session `bad` fails permanently, and while `down`
/// is set every write fails transiently.
#[derive(Debug)]
struct Flaky {
    down: std::sync::atomic::AtomicBool,
    /// A write holding session `first` waits for a permit here, after telling `entered`.
    gate: tokio::sync::Semaphore,
    entered: tokio::sync::Notify,
    stored: Mutex<Vec<(String, i64)>>,
}

impl Default for Flaky {
    fn default() -> Self {
        Self {
            down: Default::default(),
            gate: tokio::sync::Semaphore::new(0),
            entered: Default::default(),
            stored: Default::default(),
        }
    }
}

#[async_trait::async_trait]
impl Store for Flaky {
    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
    async fn create_session(&self, _: &crate::store::NewSession<'_>) -> Result<(), StoreError> {
        unimplemented!()
    }
    async fn get_session(&self, _: &str, _: &str) -> Result<Option<crate::store::SessionRecord>, StoreError> {
        unimplemented!()
    }
    async fn list_sessions(
        &self,
        _: &str,
        _: &crate::store::ListFilter,
        _: Option<crate::store::Position<'_>>,
        _: u32,
    ) -> Result<Vec<crate::store::SessionRecord>, StoreError> {
        unimplemented!()
    }
    async fn delete_session(&self, _: &str, _: &str) -> Result<bool, StoreError> {
        unimplemented!()
    }
    async fn write_batch(&self, writes: &[SessionWrite]) -> Result<(), StoreError> {
        if writes.iter().any(|w| &*w.session_id == "first") {
            self.entered.notify_one();
            let _ = self.gate.acquire().await.expect("gate").forget();
        }
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::Db(sqlx::Error::PoolTimedOut));
        }
        if writes.iter().any(|w| &*w.session_id == "bad") {
            return Err(StoreError::Db(sqlx::Error::Encode("cannot encode".into())));
        }
        let mut stored = self.stored.lock();
        for w in writes {
            if let Some(c) = &w.chunk {
                stored.push((w.session_id.to_string(), c.seq_to));
            }
        }
        Ok(())
    }
    async fn read_events(&self, _: &str, _: &str, _: i64, _: u32) -> Result<Vec<EventChunk>, StoreError> {
        unimplemented!()
    }
    async fn cursor_key(&self) -> Result<Vec<u8>, StoreError> {
        unimplemented!()
    }
    async fn set_archived(&self, _: &str, _: &str, _: Option<i64>) -> Result<bool, StoreError> {
        unimplemented!()
    }
    async fn stale_sessions(
        &self,
        _: i64,
        _: Option<(i64, &str)>,
        _: i64,
    ) -> Result<Vec<crate::store::StaleSession>, StoreError> {
        unimplemented!()
    }
    async fn delete_stale(
        &self,
        _: &[crate::store::StaleSession],
        _: i64,
    ) -> Result<Vec<crate::store::StaleSession>, StoreError> {
        unimplemented!()
    }
    async fn stored_bytes(&self, _: &str) -> Result<u64, StoreError> {
        unimplemented!()
    }
    async fn session_controls(&self, _: &str, _: &str) -> Result<Option<String>, StoreError> {
        unimplemented!()
    }
    async fn users_overview(&self, _: i64) -> Result<Vec<crate::store::UserOverview>, StoreError> {
        unimplemented!()
    }
}

#[derive(Default)]
struct Told(Mutex<u64>, std::sync::atomic::AtomicBool);
impl Committed for Told {
    fn committed(&self, seq: u64) {
        *self.0.lock() = seq;
    }
    fn lost(&self) {
        self.1.store(true, Ordering::SeqCst);
    }
}

fn told_upd(s: &str, told: &Arc<Told>, seq: u64) -> Item {
    Item::Update {
        session: Arc::from(s),
        notify: told.clone(),
        seq,
        update: "{}".into(),
        at: 0,
        more: false,
    }
}

/// Update `seq` of session `big`: 400 bytes (401 of the writer's byte budget).
fn big_upd(told: &Arc<Told>, seq: u64) -> Item {
    Item::Update {
        session: Arc::from("big"),
        notify: told.clone(),
        seq,
        update: "x".repeat(400).into(),
        at: 0,
        more: false,
    }
}

#[tokio::test]
async fn a_session_failing_for_good_is_dropped_and_the_others_go_on() {
    let store = Arc::new(Flaky::default());
    let (p, _task) = Persister::spawn(store.clone(), 64, 1 << 20, CancellationToken::new());
    let (first, good, bad) = (
        Arc::new(Told::default()),
        Arc::new(Told::default()),
        Arc::new(Told::default()),
    );
    // The writer is held on a first write until both are queued, so they share a batch.
    p.send(told_upd("first", &first, 1)).await;
    store.entered.notified().await;
    p.send(told_upd("good", &good, 1)).await;
    p.send(told_upd("bad", &bad, 1)).await;
    store.gate.add_permits(1);
    p.flush_within(Duration::from_secs(20)).await.expect("flushed");
    assert_eq!(*good.0.lock(), 1, "the healthy session is stored and released");
    assert_eq!(*bad.0.lock(), 0, "the failing one is never released");
    assert!(bad.1.load(Ordering::SeqCst), "it is told it is lost");
    assert!(!good.1.load(Ordering::SeqCst));
    assert_eq!(p.dropped_writes(), 1);
    assert_eq!(p.health(), Ok(()), "the writer is not stuck on it");
    // Later updates of the dropped session are never released either; others still are.
    p.send(told_upd("bad", &bad, 2)).await;
    p.send(told_upd("good", &good, 2)).await;
    p.flush_within(Duration::from_secs(20)).await.expect("flushed");
    assert_eq!(*bad.0.lock(), 0);
    assert_eq!(*good.0.lock(), 2);
    assert_eq!(
        *store.stored.lock(),
        vec![
            ("first".to_string(), 1),
            ("good".to_string(), 1),
            ("good".to_string(), 2)
        ]
    );
}

#[tokio::test]
async fn an_unreachable_database_makes_the_writer_unhealthy_until_it_is_back() {
    let store = Arc::new(Flaky::default());
    let (p, _task) = Persister::spawn(store.clone(), 64, 1 << 20, CancellationToken::new());
    let s = Arc::new(Told::default());
    store.down.store(true, Ordering::SeqCst);
    p.send(told_upd("s", &s, 1)).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while p.health().is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the writer reports its failures"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let err = p.flush().await.expect_err("a flush does not wait forever");
    assert!(matches!(err, StoreError::Timeout(_)), "{err}");
    assert_eq!(*s.0.lock(), 0, "nothing released unstored");
    store.down.store(false, Ordering::SeqCst);
    p.flush_within(Duration::from_secs(20))
        .await
        .expect("flushed once it is back");
    assert_eq!(*s.0.lock(), 1);
    assert_eq!(p.health(), Ok(()));
}

/// A writer with room for 64 items but only 1,000 bytes, held in the write of session `first`'s
/// update (until a permit of the store's gate), which holds that update's bytes.
async fn writing_first_in_1000_bytes() -> (Arc<Flaky>, Persister, Arc<Told>) {
    let store = Arc::new(Flaky::default());
    let (p, _task) = Persister::spawn(store.clone(), 64, 1000, CancellationToken::new());
    let first = Arc::new(Told::default());
    p.send(told_upd("first", &first, 1)).await;
    store.entered.notified().await;
    (store, p, first)
}

#[tokio::test]
async fn the_queue_is_bounded_in_bytes_while_the_database_holds_a_write() {
    let (store, p, first) = writing_first_in_1000_bytes().await;
    let big = |seq| big_upd(&first, seq);
    // The write of `first` holds its bytes; two 401-byte updates fit beside it, a third
    // waits for the write to end.
    p.send(big(1)).await;
    p.send(big(2)).await;
    let third = tokio::spawn({
        let p = p.clone();
        let item = big(3);
        async move { p.send(item).await }
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(200), p.send(big(4)))
            .await
            .is_err(),
        "a full byte budget makes senders wait"
    );
    assert!(!third.is_finished());
    store.gate.add_permits(1);
    tokio::time::timeout(Duration::from_secs(20), third)
        .await
        .expect("room once the write is done")
        .expect("join");
    p.flush_within(Duration::from_secs(20)).await.expect("flushed");
}

/// A burst sent together waits once for room for all of it and is stored in order; one larger
/// than the whole byte budget still goes, item by item, and every byte comes back.
#[tokio::test]
async fn a_burst_sent_together_waits_for_its_room_and_one_over_the_budget_goes_item_by_item() {
    let (store, p, _first) = writing_first_in_1000_bytes().await;
    let told = Arc::new(Told::default());
    let big = |seq| big_upd(&told, seq);
    // `first`'s write holds its bytes; two 401-byte updates fit beside it.
    tokio::time::timeout(Duration::from_secs(20), p.send_all(vec![big(1), big(2)]))
        .await
        .expect("room for the first burst");
    let second = tokio::spawn({
        let p = p.clone();
        let items = vec![big(3), big(4)];
        async move { p.send_all(items).await }
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(200), p.send(big(9)))
            .await
            .is_err(),
        "a full byte budget makes senders wait"
    );
    assert!(!second.is_finished(), "the burst waits for room for all of it");
    store.gate.add_permits(1);
    tokio::time::timeout(Duration::from_secs(20), second)
        .await
        .expect("room once the write is done")
        .expect("join");
    // Together over the whole budget: sent item by item, each as room comes back.
    tokio::time::timeout(Duration::from_secs(20), p.send_all(vec![big(5), big(6), big(7)]))
        .await
        .expect("a burst over the budget goes too");
    p.flush_within(Duration::from_secs(20)).await.expect("flushed");
    assert_eq!(*told.0.lock(), 7, "every update stored and released, in order");
    assert_eq!(p.room.available(), 1000, "every byte given back");
}

fn prompt(s: &str, through: u64) -> Item {
    Item::Prompt {
        session: Arc::from(s),
        title: None,
        through,
    }
}

/// A prompt and the agent's answer right behind it are one commit: the user's chunk waits for
/// the answer instead of being committed on its own first.
#[tokio::test]
async fn a_prompt_waits_for_the_answer_and_is_committed_with_it() {
    let store = Arc::new(Flaky::default());
    let (p, _task) = Persister::spawn(store.clone(), 64, 1 << 20, CancellationToken::new());
    let s = Arc::new(Told::default());
    p.send(prompt("s", 1)).await;
    p.send(told_upd("s", &s, 1)).await;
    // This runtime has one thread: the writer takes both now, and is waiting when this goes on.
    tokio::task::yield_now().await;
    assert!(store.stored.lock().is_empty(), "not written on its own");
    p.send(told_upd("s", &s, 2)).await;
    p.flush_within(Duration::from_secs(20)).await.expect("flushed");
    assert_eq!(*store.stored.lock(), vec![("s".to_string(), 2)], "one chunk, 1 to 2");
    assert_eq!(*s.0.lock(), 2);
}

/// All of the answer the agent wrote at once goes into that one commit: an update with more of
/// the agent's lines read behind it keeps the prompt's batch open for them.
#[tokio::test]
async fn an_answer_written_at_once_is_one_commit_with_its_prompt() {
    let store = Arc::new(Flaky::default());
    let (p, _task) = Persister::spawn(store.clone(), 64, 1 << 20, CancellationToken::new());
    let s = Arc::new(Told::default());
    let answer = |seq, more| Item::Update {
        session: Arc::from("s"),
        notify: s.clone(),
        seq,
        update: "{}".into(),
        at: 0,
        more,
    };
    p.send(prompt("s", 1)).await;
    p.send(told_upd("s", &s, 1)).await;
    tokio::task::yield_now().await;
    p.send(answer(2, true)).await;
    tokio::task::yield_now().await;
    assert!(store.stored.lock().is_empty(), "the rest of the burst is awaited");
    p.send(answer(3, false)).await;
    p.flush_within(Duration::from_secs(20)).await.expect("flushed");
    assert_eq!(*store.stored.lock(), vec![("s".to_string(), 3)], "one chunk, 1 to 3");
}

/// Says when a session's updates are committed.
#[derive(Default)]
struct Signal(tokio::sync::Notify);
impl Committed for Signal {
    fn committed(&self, _: u64) {
        self.0.notify_one();
    }
    fn lost(&self) {}
}

/// A prompt the agent does not answer at once is committed after [`LINGER`].
#[tokio::test]
async fn an_unanswered_prompt_is_committed_after_the_linger() {
    let store = Arc::new(Flaky::default());
    let (p, _task) = Persister::spawn(store.clone(), 64, 1 << 20, CancellationToken::new());
    let s = Arc::new(Signal::default());
    let started = std::time::Instant::now();
    p.send(prompt("s", 1)).await;
    p.send(Item::Update {
        session: Arc::from("s"),
        notify: s.clone(),
        seq: 1,
        update: "{}".into(),
        at: 0,
        more: false,
    })
    .await;
    tokio::time::timeout(Duration::from_secs(10), s.0.notified())
        .await
        .expect("committed without an answer");
    assert!(started.elapsed() >= LINGER, "after waiting for an answer");
    assert_eq!(*store.stored.lock(), vec![("s".to_string(), 1)]);
}
