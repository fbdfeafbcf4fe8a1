//! The leases and announcements underneath, on the store and [`Replica`] directly: who may
//! write a session's updates and controls, and which commits are announced to whom.

use std::sync::Arc;
use std::time::Duration;

use acp_gateway::replica::Replica;
use acp_gateway::replica::follow::{Followed, Served};
use acp_gateway::replica::lease::Holder;
use acp_gateway::store::{EventChunk, SessionWrite, Store};
use sqlx::postgres::PgListener;

use super::LEASE_SECS;
use crate::common;

/// A replica cut off from the database longer than a lease time no longer trusts that it holds
/// its leases: another replica may have served the session meanwhile and given it back, and the
/// first must read what that one wrote before numbering more updates (`serving_elsewhere` takes
/// over, catching up, when the lease was not surely held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_the_database_has_not_confirmed_for_a_lease_time_is_not_trusted() {
    let url = common::pg::fresh_database().await;
    store_with_session(&url, "s").await;
    let ttl = Duration::from_secs(1);
    let a = Replica::connect(&url, "a", ttl).await.expect("replica a");
    let b = Replica::connect(&url, "b", ttl).await.expect("replica b");
    assert_eq!(a.acquire("s").await.expect("acquire"), Holder::Me);
    assert!(a.holds("s"));
    // No renewals run here, as if a could not reach the database.
    common::eventually("a's lease to go unconfirmed", || !a.holds("s")).await;
    assert_eq!(
        b.acquire("s").await.expect("acquire"),
        Holder::Me,
        "a's lease has expired"
    );
    b.release("s").await.expect("release");
    assert_eq!(a.acquire("s").await.expect("acquire"), Holder::Me);
    assert!(a.holds("s"), "confirmed again");
}

/// A replica that has lost a session's lease cannot overwrite what the new holder's agent said:
/// neither its updates nor its controls (a late `set_mode` answer, a `config_option_update`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_without_the_lease_cannot_overwrite_the_controls() {
    let (store, _b, _) = held_by_b().await;
    let controls = |value: &str| SessionWrite {
        session_id: Arc::from("s"),
        chunk: None,
        prompt_title: None,
        agent_title: None,
        prompts: 0,
        controls: Some(format!(r#"{{"modes":{{"currentModeId":"{value}"}}}}"#)),
        updated_at: 1_700_000_000_001,
    };
    let refused = store
        .write_batch_leased(&[controls("b-mode")], "b")
        .await
        .expect("b writes");
    assert!(refused.is_empty());
    let refused = store
        .write_batch_leased(&[controls("stale-a-mode")], "a")
        .await
        .expect("a's write is answered");
    assert_eq!(refused, [Arc::from("s")], "a holds no lease");
    let stored = store.session_controls("alice", "s").await.expect("read").expect("some");
    assert!(
        stored.contains("b-mode") && !stored.contains("stale-a-mode"),
        "{stored}"
    );
}

/// Updates are stored only by the replica holding the session's lease, in one statement that
/// also announces them to a replica following the session (NOTIFY, delivered once it commits):
/// the holder's chunk is stored and announced once, a chunk stored already is skipped, and
/// another replica's is refused, neither stored nor announced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_lease_holder_stores_and_announces_updates() {
    let (store, _b, url) = held_by_b().await;
    let mut listener = listen(&url).await;
    let c = replica(&url, "c").await;
    c.follow("s", false).await.expect("c follows s");
    let chunk = |from, to, text: &str| chunk("s", from, to, text);
    let refused = store
        .write_batch_leased(&[chunk(1, 2, "{\"b\":1}\n{\"b\":2}")], "b")
        .await
        .expect("b writes");
    assert!(refused.is_empty(), "{refused:?}");
    let note = tokio::time::timeout(Duration::from_secs(10), listener.recv())
        .await
        .expect("announced")
        .expect("notification");
    assert_eq!(note.payload(), "s:2");
    // The same chunk again (a retry after a lost answer): skipped, the session not advanced twice.
    store
        .write_batch_leased(&[chunk(1, 2, "{\"b\":1}\n{\"b\":2}")], "b")
        .await
        .expect("b writes again");
    let refused = store
        .write_batch_leased(&[chunk(3, 3, "{\"a\":3}")], "a")
        .await
        .expect("a's write is answered");
    assert_eq!(refused, [Arc::from("s")], "a holds no lease");
    let chunks = store.read_events("alice", "s", 0, 10).await.expect("read");
    let stored: Vec<(i64, i64, &str)> = chunks
        .iter()
        .map(|c| (c.seq_from, c.seq_to, c.payload.as_str()))
        .collect();
    assert_eq!(stored, [(1, 2, "{\"b\":1}\n{\"b\":2}")]);
    let row = store.get_session("alice", "s").await.expect("read").expect("row");
    assert_eq!(row.last_seq, 2);
    assert_eq!(store.stored_bytes("alice").await.expect("bytes"), 15, "counted once");
    // The retry's announcement, and none for a's refused write.
    let next = tokio::time::timeout(Duration::from_secs(10), listener.recv())
        .await
        .expect("the retry is announced")
        .expect("notification");
    assert_eq!(next.payload(), "s:2");
    let none = tokio::time::timeout(Duration::from_millis(500), listener.recv()).await;
    assert!(none.is_err(), "a's refused write was announced: {none:?}");
}

/// A batch of several sessions' chunks (one statement over arrays; a lone chunk has a statement
/// of its own) stores the chunks of the sessions whose lease the writer holds and no others,
/// says which were refused, and announces each stored session another replica follows with its
/// newest seq in the batch, and only those.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_several_sessions_stores_and_announces_only_the_held_ones() {
    let (store, b, url) = held_by_b().await;
    let c = replica(&url, "c").await;
    for (session, holder) in [("t", &c), ("u", &b)] {
        store_session(&*store, session).await;
        assert_eq!(holder.acquire_new(session).await.expect("acquire"), Holder::Me);
    }
    c.follow("s", false).await.expect("c follows s");
    let mut listener = listen(&url).await;
    let batch = [
        chunk("s", 1, 2, "{\"s\":1}\n{\"s\":2}"),
        chunk("t", 1, 1, "{\"t\":1}"),
        chunk("u", 1, 1, "{\"u\":1}"),
    ];
    let refused = store.write_batch_leased(&batch, "b").await.expect("b writes");
    assert_eq!(refused, [Arc::from("t")], "c holds t");
    for (session, want) in [("s", vec![(1, 2)]), ("t", vec![]), ("u", vec![(1, 1)])] {
        let chunks = store.read_events("alice", session, 0, 10).await.expect("read");
        let stored: Vec<(i64, i64)> = chunks.iter().map(|c| (c.seq_from, c.seq_to)).collect();
        assert_eq!(stored, want, "session {session}");
    }
    assert_eq!(next_notice(&mut listener).await, "s:2");
    let none = tokio::time::timeout(Duration::from_millis(500), listener.recv()).await;
    assert!(
        none.is_err(),
        "u (followed by nobody else) or t (refused) was announced: {none:?}"
    );
}

/// A commit is announced only for a session another replica follows: not before one does, from
/// the commit after it started following (the first notice the listener gets), when the lease
/// is taken again from the followers' rows, and never for a session nobody else follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_are_announced_only_for_sessions_another_replica_follows() {
    let (store, b, url) = held_by_b().await;
    let mut listener = listen(&url).await;
    let (c, d) = (replica(&url, "c").await, replica(&url, "d").await);
    // A chunk alone, or (`counted`) with a prompt counted: the two statements that announce.
    let write_as = |session: &'static str, seq: i64, counted: bool| {
        let store = store.clone();
        async move {
            let mut w = chunk(session, seq, seq, &format!("{{\"n\":{seq}}}"));
            w.prompts = i64::from(counted);
            let refused = store.write_batch_leased(&[w], "b").await.expect("written");
            assert!(refused.is_empty(), "{refused:?}");
        }
    };
    let write = |session: &'static str, seq: i64| write_as(session, seq, false);
    write("s", 1).await;
    // b follows its own session: nothing to announce to itself.
    assert_eq!(
        b.follow("s", true).await.expect("b follows"),
        Some(Followed {
            served_by: None,
            new_watcher: true
        })
    );
    write("s", 2).await;
    assert_eq!(
        c.follow("s", false).await.expect("c follows"),
        Some(Followed {
            served_by: Some(Served {
                replica: "b".into(),
                current: true
            }),
            new_watcher: false
        })
    );
    assert_eq!(c.follow("s", false).await.expect("again"), None, "noted once");
    write("s", 3).await;
    assert_eq!(next_notice(&mut listener).await, "s:3", "1 and 2 were not announced");

    // Given up and taken again (a restore on d): c's row makes the new lease announce.
    b.release("s").await.expect("release");
    assert_eq!(d.acquire("s").await.expect("d takes s"), Holder::Me);
    let refused = store
        .write_batch_leased(&[chunk("s", 4, 4, "{\"n\":4}")], "d")
        .await
        .expect("d writes");
    assert!(refused.is_empty());
    assert_eq!(next_notice(&mut listener).await, "s:4");

    // A session created on b that nobody else follows: its commits are not announced, until c
    // follows it.
    store_session(&*store, "t").await;
    assert_eq!(b.acquire_new("t").await.expect("b takes t"), Holder::Me);
    write("t", 1).await;
    write_as("t", 2, true).await;
    assert!(
        c.follow("t", true)
            .await
            .expect("c follows t")
            .is_some_and(|f| f.new_watcher)
    );
    write_as("t", 3, true).await;
    assert_eq!(
        next_notice(&mut listener).await,
        "t:3",
        "t:1 and t:2 were not announced"
    );
    let all: Vec<i64> = store
        .read_events("alice", "t", 0, 10)
        .await
        .expect("read")
        .iter()
        .map(|c| c.seq_from)
        .collect();
    assert_eq!(all, [1, 2, 3], "all stored");

    // Stopping to follow: the lease announces while another replica still follows, and stops
    // once none does; a replica with a client again follows again.
    assert!(d.follow("t", false).await.expect("d follows t").is_some());
    assert!(
        !c.unfollow("t", || false).await.expect("c has a client"),
        "a replica whose client is there keeps following"
    );
    assert!(c.unfollow("t", || true).await.expect("c stops"));
    assert!(!c.unfollow("t", || true).await.expect("again"), "stopped once");
    write("t", 4).await;
    assert_eq!(next_notice(&mut listener).await, "t:4", "d still follows t");
    assert!(d.unfollow("t", || true).await.expect("d stops"));
    write("t", 5).await;
    assert!(
        c.follow("t", false).await.expect("c follows t again").is_some(),
        "noted anew"
    );
    write("t", 6).await;
    assert_eq!(next_notice(&mut listener).await, "t:6", "t:5 was not announced");
}

/// A chunk-only write of `session`'s updates `from..=to`.
fn chunk(session: &str, from: i64, to: i64, text: &str) -> SessionWrite {
    SessionWrite {
        session_id: Arc::from(session),
        chunk: Some(EventChunk {
            seq_from: from,
            seq_to: to,
            payload: text.to_string(),
            stored_at: 0,
        }),
        prompt_title: None,
        agent_title: None,
        prompts: 0,
        controls: None,
        updated_at: 1_700_000_000_002,
    }
}

/// A connection listening to the commit announcements on `url`.
async fn listen(url: &str) -> PgListener {
    let mut listener = PgListener::connect(url).await.expect("listener");
    listener.listen("acp_session_committed").await.expect("listen");
    listener
}

/// The next announcement's payload (`session:seq`).
async fn next_notice(listener: &mut PgListener) -> String {
    let note = tokio::time::timeout(Duration::from_secs(10), listener.recv())
        .await
        .expect("announced")
        .expect("notification");
    note.payload().to_string()
}

/// A controller attaching while its replica stops watching the session (the last one left)
/// leaves the replica watching it with its row in `session_watchers`: the row is written after
/// the stop's delete, never deleted by it (the serving replica would not ask it the agent's
/// requests while it believed it was asked). Both at once, many times, on separate connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_attaching_while_its_replica_stops_watching_keeps_the_row() {
    let (_store, b, url) = held_by_b().await;
    let c = replica(&url, "c").await;
    for round in 0..40 {
        c.follow("s", true).await.expect("c watches");
        let (stopped, attached) = tokio::join!(c.unwatch("s"), c.follow("s", true));
        stopped.expect("unwatch");
        attached.expect("follow");
        // Whichever went first, c writes its row now unless it believes the row is there.
        c.follow("s", true).await.expect("c watches again");
        assert_eq!(
            b.watchers("s").await.expect("watchers"),
            ["c"],
            "round {round}: c believes it watches, without its row"
        );
    }
}

/// A replica taking a session's fresh lease while another starts following it ends announcing
/// to the follower: whichever way the two race (the lease's insert may read the followers before
/// the follower's row commits, and the follower's `UPDATE` find no lease yet), the lease is
/// read again once it committed. Both at once, on a new session each round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_lease_taken_while_a_replica_starts_following_announces_to_it() {
    use sqlx::Connection;
    let url = common::pg::fresh_database().await;
    let store = acp_gateway::store::connect(&url).await.expect("migrated");
    let (b, c) = (replica(&url, "b").await, replica(&url, "c").await);
    let mut db = sqlx::PgConnection::connect(&url).await.expect("db");
    for round in 0..200 {
        let session = format!("fresh-{round}");
        store_session(&*store, &session).await;
        let (taken, followed) = tokio::join!(b.acquire(&session), c.follow(&session, false));
        assert_eq!(taken.expect("acquire"), Holder::Me);
        followed.expect("follow");
        assert!(
            super::announces(&mut db, &session).await,
            "round {round}: c follows the session and b's lease does not announce"
        );
    }
}

/// A fresh database with alice's session `s`, whose lease replica `b` holds: the store, `b` and
/// the database's URL.
async fn held_by_b() -> (Arc<dyn Store>, Arc<Replica>, String) {
    let url = common::pg::fresh_database().await;
    let store = store_with_session(&url, "s").await;
    let b = replica(&url, "b").await;
    assert_eq!(b.acquire("s").await.expect("acquire"), Holder::Me);
    (store, b, url)
}

/// Replica `id` on `url`, with the tests' lease time.
async fn replica(url: &str, id: &str) -> Arc<Replica> {
    Replica::connect(url, id, Duration::from_secs(LEASE_SECS))
        .await
        .unwrap_or_else(|e| panic!("replica {id}: {e}"))
}

/// The store on `url` (migrated) with alice's session `id` in it.
async fn store_with_session(url: &str, id: &str) -> Arc<dyn Store> {
    let store = acp_gateway::store::connect(url).await.expect("migrated");
    store_session(&*store, id).await;
    store
}

/// Stores alice's session `id`.
async fn store_session(store: &dyn Store, id: &str) {
    common::fixtures::create_session_in(store, id, "alice", "/", "{}", 1_700_000_000_000).await;
}
