//! The store's share rows, on both backends: the cap on shares in force holds when many are made
//! at once (on Postgres each create counted in its own snapshot, and all could pass), ended
//! shares do not pile up (a session keeps at most twice the cap however many short shares its
//! owner makes), and asking about many users at once (the share watcher's recheck) answers as
//! asking about each. Ended shares of every session are purged in batches (security review:
//! they were never purged), and a share lending the owner's keys gives more than one that does
//! not.

use crate::common;

use std::sync::Arc;

use acp_gateway::sharing::{NewShare, ShareAccess, ShareStore};
use acp_gateway::store::{self, Store};
use common::fixtures::create_session;

const NOW: i64 = 1_700_000_000_000_000;

async fn open(postgres: bool) -> (Arc<dyn Store>, Arc<ShareStore>, Option<tempfile::TempDir>) {
    let (url, dir) = if postgres {
        (common::pg::fresh_database().await, None)
    } else {
        let dir = tempfile::tempdir().expect("tempdir");
        (format!("sqlite://{}/store.db", dir.path().display()), Some(dir))
    };
    let database = store::open(&url, None)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    create_session(&*database.sessions, "s1", "alice", NOW).await;
    (database.sessions, Arc::new(ShareStore::new(database.db)), dir)
}

fn share<'a>(id: &'a str, grantee: &'a str, expires_at: Option<i64>, now: i64) -> NewShare<'a> {
    NewShare {
        id,
        session_id: "s1",
        owner: "alice",
        grantee: Some(grantee),
        token_hash: None,
        role: "observer",
        created_at: now,
        expires_at,
        owner_keys: false,
    }
}

async fn cap_holds_when_shares_are_made_at_once(postgres: bool) {
    let (_sessions, store, _dir) = open(postgres).await;
    const CAP: i64 = 3;
    let tries: Vec<_> = (0..24)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let (id, grantee) = (format!("shr_{i}"), format!("user{i}"));
                store.create(&share(&id, &grantee, None, NOW), CAP).await
            })
        })
        .collect();
    let mut made = 0;
    for t in tries {
        if t.await.expect("task").expect("create_share") {
            made += 1;
        }
    }
    let rows = store.of_session("alice", "s1", NOW).await.expect("shares");
    assert_eq!((made, rows.len()), (CAP, CAP as usize), "{rows:?}");
}

async fn ended_shares_do_not_pile_up(postgres: bool) {
    let (_sessions, store, _dir) = open(postgres).await;
    const CAP: i64 = 4;
    // A share that lasts, and many that end a second after they are made, one a second.
    assert!(
        store
            .create(&share("lasting", "bob", None, NOW), CAP)
            .await
            .expect("create_share")
    );
    for i in 0..20i64 {
        let now = NOW + i * 1_000_000;
        let id = format!("short{i}");
        assert!(
            store
                .create(&share(&id, "carol", Some(now + 1_000_000), now), CAP)
                .await
                .expect("create_share"),
            "the ended ones do not count towards the cap"
        );
        let ids: Vec<String> = store
            .of_session("alice", "s1", now)
            .await
            .expect("shares")
            .into_iter()
            .map(|s| s.id)
            .collect();
        // Made at `now`: the one made a second before ended just now, and is forgotten.
        assert_eq!(ids, ["lasting".to_string(), id], "share {i}");
    }
    // The last short one has ended (its row is kept until the next share): not listed.
    let ended_at = NOW + 20 * 1_000_000;
    let listed: Vec<String> = store
        .of_session("alice", "s1", ended_at)
        .await
        .expect("shares")
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(listed, ["lasting"], "an ended share is not listed");
    // Another owner's session id names nothing of theirs: their create forgets nothing.
    let foreign = NewShare {
        owner: "mallory",
        ..share("m1", "mallory2", None, NOW + 30_000_000)
    };
    assert!(store.create(&foreign, CAP).await.is_ok_and(|made| !made));
    assert_eq!(
        store
            .of_session("alice", "s1", ended_at - 1)
            .await
            .expect("shares")
            .len(),
        2
    );
}

async fn many_users_at_once_answer_as_each(postgres: bool) {
    let (sessions, store, _dir) = open(postgres).await;
    create_session(&*sessions, "s2", "alice", NOW).await;
    let now = NOW + 10_000_000;
    let make = |id: &'static str, session: &'static str, grantee: Option<&'static str>, role, expires_at| NewShare {
        id,
        session_id: session,
        owner: "alice",
        grantee,
        token_hash: grantee.is_none().then_some(id.as_bytes()),
        role,
        created_at: NOW,
        expires_at,
        owner_keys: false,
    };
    for s in [
        // bob: an observer's share and a controller's on s1 (the controller's counts), none on s2.
        make("bob_obs", "s1", Some("bob"), "observer", None),
        make("bob_ctl", "s1", Some("bob"), "controller", Some(now + 60_000_000)),
        // carol: a link she opened, on s2; an ended share on s1.
        make("link", "s2", None, "controller", None),
        make("carol_old", "s1", Some("carol"), "controller", Some(now - 1)),
    ] {
        assert!(store.create(&s, 32).await.expect("create_share"), "{}", s.id);
    }
    store.join("link", "carol", NOW).await.expect("join");
    let pairs = [
        ("bob", "s1"),
        ("bob", "s2"),
        ("carol", "s1"),
        ("carol", "s2"),
        ("dave", "s1"),
        ("alice", "s1"),
        ("bob", "no-such-session"),
    ];
    let mut each: Vec<(String, ShareAccess)> = Vec::new();
    for (user, session) in pairs {
        if let Some(a) = store.access(user, session, now).await.expect("share_access") {
            each.push((user.to_string(), a));
        }
    }
    let mut at_once: Vec<(String, ShareAccess)> = store
        .accesses(&pairs, now)
        .await
        .expect("share_accesses")
        .into_iter()
        .map(|m| (m.member, m.access))
        .collect();
    at_once.sort_by(|a, b| (&a.0, &a.1.session_id).cmp(&(&b.0, &b.1.session_id)));
    let found: Vec<(&str, &str, &str)> = at_once
        .iter()
        .map(|(u, a)| (u.as_str(), a.session_id.as_str(), a.share_id.as_str()))
        .collect();
    assert_eq!(found, [("bob", "s1", "bob_ctl"), ("carol", "s2", "link")]);
    assert_eq!(at_once, each, "the same answers as one at a time");
}

#[tokio::test]
async fn sqlite_many_users_at_once_answer_as_each() {
    many_users_at_once_answer_as_each(false).await;
}

#[tokio::test]
async fn postgres_many_users_at_once_answer_as_each() {
    many_users_at_once_answer_as_each(true).await;
}

#[tokio::test]
async fn sqlite_share_cap_holds_when_shares_are_made_at_once() {
    cap_holds_when_shares_are_made_at_once(false).await;
}

#[tokio::test]
async fn postgres_share_cap_holds_when_shares_are_made_at_once() {
    cap_holds_when_shares_are_made_at_once(true).await;
}

#[tokio::test]
async fn sqlite_ended_shares_do_not_pile_up() {
    ended_shares_do_not_pile_up(false).await;
}

#[tokio::test]
async fn postgres_ended_shares_do_not_pile_up() {
    ended_shares_do_not_pile_up(true).await;
}

async fn ended_shares_are_purged(postgres: bool) {
    let (sessions, store, _dir) = open(postgres).await;
    create_session(&*sessions, "s2", "alice", NOW).await;
    let ended = NOW + 1_000_000;
    let in_s2 = |id: &'static str, expires_at| NewShare {
        session_id: "s2",
        ..share(id, "bob", expires_at, NOW)
    };
    for s in [
        share("lasting", "bob", None, NOW),
        share("later", "bob", Some(NOW + 3_600_000_000), NOW),
        share("ended1", "carol", Some(ended), NOW),
        share("ended2", "dave", Some(ended), NOW),
        in_s2("ended3", Some(ended)),
        in_s2("ended4", Some(ended)),
        in_s2("ended5", Some(ended)),
        NewShare {
            grantee: None,
            token_hash: Some(b"a link".as_slice()),
            ..in_s2("ended_link", Some(ended))
        },
    ] {
        assert!(store.create(&s, 32).await.expect("create_share"), "{}", s.id);
    }
    store.join("ended_link", "erin", NOW).await.expect("join");
    // Before they end, nothing goes.
    assert_eq!(store.purge_expired(ended - 1, 100).await.expect("purge"), 0);
    // After: every session's, in batches.
    let mut batches = Vec::new();
    loop {
        let n = store.purge_expired(ended, 4).await.expect("purge");
        batches.push(n);
        if n < 4 {
            break;
        }
    }
    assert_eq!(batches, [4, 2], "six ended shares, four to a batch");
    let left = |session: &'static str| {
        let store = store.clone();
        async move {
            store
                .of_session("alice", session, ended - 1)
                .await
                .expect("shares")
                .into_iter()
                .map(|s| s.id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        left("s1").await,
        ["lasting", "later"],
        "the rows are gone, not only hidden"
    );
    assert!(left("s2").await.is_empty());
    assert!(
        store.link(b"a link", ended - 1).await.expect("link").is_none(),
        "the link (and its members) went with it"
    );
}

#[tokio::test]
async fn sqlite_ended_shares_are_purged() {
    ended_shares_are_purged(false).await;
}

#[tokio::test]
async fn postgres_ended_shares_are_purged() {
    ended_shares_are_purged(true).await;
}

async fn a_share_lending_the_owners_keys_gives_more(postgres: bool) {
    let (_sessions, store, _dir) = open(postgres).await;
    let controller = |id: &'static str, owner_keys, expires_at| NewShare {
        role: "controller",
        owner_keys,
        ..share(id, "carol", expires_at, NOW)
    };
    for s in [
        controller("plain", false, None),
        controller("lends", true, Some(NOW + 60_000_000)),
        share("watching", "carol", None, NOW),
    ] {
        assert!(store.create(&s, 32).await.expect("create_share"));
    }
    let one = store.access("carol", "s1", NOW).await.expect("access").expect("let in");
    assert_eq!((one.share_id.as_str(), one.owner_keys), ("lends", true));
    let many = store.accesses(&[("carol", "s1")], NOW).await.expect("accesses");
    assert_eq!(many.len(), 1);
    assert_eq!(many[0].access, one, "the same answer at once");
    // Once it ends, the plain one is what lets carol in.
    let later = store
        .access("carol", "s1", NOW + 60_000_000)
        .await
        .expect("access")
        .expect("let in");
    assert_eq!((later.share_id.as_str(), later.owner_keys), ("plain", false));
}

#[tokio::test]
async fn sqlite_a_share_lending_the_owners_keys_gives_more() {
    a_share_lending_the_owners_keys_gives_more(false).await;
}

#[tokio::test]
async fn postgres_a_share_lending_the_owners_keys_gives_more() {
    a_share_lending_the_owners_keys_gives_more(true).await;
}
