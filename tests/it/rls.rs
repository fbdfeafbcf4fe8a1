//! Postgres row-level security as a second wall (migration `…_request_role`, docs/operations.md "Postgres
//! roles and row-level security"): request work runs as `acp_gateway_request`, which cannot
//! bypass the policies, and they admit only the user whose identity is signed with the
//! database's key. These tests run statements as that role by hand, the way an injected or buggy
//! statement of request work would, and try every setting that used to (or might) open the wall.

use crate::common;

use std::sync::Arc;

use acp_gateway::store::{self, EventChunk, SessionWrite};
use common::fixtures::create_session;
use common::pg::{REQUEST_ROLE, signed_identity};
use sqlx::{Connection, Executor, PgConnection, Postgres, Row, Transaction};

const BASE: i64 = 1_700_000_000_000_000;

fn events(id: &str, seq: i64) -> SessionWrite {
    SessionWrite {
        session_id: Arc::from(id),
        chunk: Some(EventChunk {
            seq_from: seq,
            seq_to: seq,
            payload: format!("{{\"n\":{seq}}}"),
            stored_at: 0,
        }),
        updated_at: BASE + seq,
        ..Default::default()
    }
}

/// The first column of `sql`'s rows, as text, run in a savepoint that is then rolled back (so an
/// error leaves the transaction usable and nothing it changed stays).
async fn rows(tx: &mut Transaction<'_, Postgres>, sql: &str) -> Result<Vec<String>, sqlx::Error> {
    let mut sp = tx.begin().await.expect("savepoint");
    let got = sqlx::query(sql).fetch_all(&mut *sp).await;
    sp.rollback().await.expect("rollback to savepoint");
    Ok(got?.iter().map(|r| r.get::<String, _>(0)).collect())
}

/// How many rows `sql` changed, in a savepoint that is then rolled back.
async fn changed(tx: &mut Transaction<'_, Postgres>, sql: &str) -> Result<u64, sqlx::Error> {
    let mut sp = tx.begin().await.expect("savepoint");
    let done = sqlx::query(sql).execute(&mut *sp).await;
    sp.rollback().await.expect("rollback to savepoint");
    Ok(done?.rows_affected())
}

/// A new login role `{prefix}_<uuid>` (password `pw`, no superuser, no BYPASSRLS, plus
/// `attributes`), then `grants` run with `{role}` naming it, as a superuser of the test server on
/// `database`; the role and that superuser's connection.
async fn new_role(database: &str, prefix: &str, attributes: &str, grants: &str) -> (String, PgConnection) {
    let role = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
    let mut admin = PgConnection::connect(&common::pg::admin_url(database).await)
        .await
        .expect("admin");
    let grants = grants.replace("{role}", &role);
    admin
        .execute(
            format!("CREATE ROLE {role} LOGIN {attributes} NOSUPERUSER NOBYPASSRLS PASSWORD 'pw'; {grants}").as_str(),
        )
        .await
        .unwrap_or_else(|e| panic!("create role {role}: {e}"));
    (role, admin)
}

/// A statement of request work that acts for Alice, with her properly signed identity, sees and
/// changes her rows and never Bob's, whatever else it sets: `acp_gateway.system`, Bob's name
/// unsigned, Bob's name with a forged signature, `row_security = off`. The settings, key and
/// replica tables are closed to it, and the role it runs as owns nothing and bypasses nothing.
#[tokio::test]
async fn a_request_statement_cannot_reach_another_users_rows() {
    let url = common::pg::fresh_database().await;
    let database = common::pg::database_of(&url).to_string();
    let s = store::connect(&url).await.expect("connect");
    for (id, owner) in [("a1", "alice"), ("a2", "alice"), ("b1", "bob")] {
        create_session(&*s, id, owner, BASE).await;
    }
    s.write_batch(&[events("a1", 1), events("b1", 1), events("b1", 2)])
        .await
        .expect("write");
    s.cursor_key().await.expect("cursor key");

    // The login role (the tables' owner) as the gateway connects. It must not itself bypass
    // row-level security for the roles to be what this test says they are.
    let mut c = PgConnection::connect(&url).await.expect("connect as the login role");
    let (login, login_bypasses): (String, bool) =
        sqlx::query_as("SELECT rolname::text, rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user")
            .fetch_one(&mut c)
            .await
            .expect("login role");
    assert!(!login_bypasses, "{login} must be an ordinary role");

    // The request role: no login, no superuser, no BYPASSRLS, inherits nothing, owns nothing in
    // this database, and has no privileges of the tables' owner.
    let role = sqlx::query(
        "SELECT r.rolcanlogin, r.rolsuper, r.rolbypassrls, r.rolinherit,
                (SELECT count(*) FROM pg_class WHERE relowner = r.oid) AS owns,
                (SELECT count(*) FROM pg_proc WHERE proowner = r.oid) AS owns_functions,
                pg_has_role(r.oid, (SELECT relowner FROM pg_class WHERE oid = 'sessions'::regclass), 'USAGE') AS is_owner
         FROM pg_roles r WHERE r.rolname = $1",
    )
    .bind(REQUEST_ROLE)
    .fetch_one(&mut c)
    .await
    .expect("request role");
    for attribute in ["rolcanlogin", "rolsuper", "rolbypassrls", "rolinherit", "is_owner"] {
        assert!(!role.get::<bool, _>(attribute), "{REQUEST_ROLE}: {attribute}");
    }
    assert_eq!(role.get::<i64, _>("owns"), 0, "{REQUEST_ROLE} owns no table");
    assert_eq!(
        role.get::<i64, _>("owns_functions"),
        0,
        "{REQUEST_ROLE} owns no function"
    );
    let forced: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_class WHERE relname IN ('sessions', 'session_events') AND relrowsecurity AND NOT relforcerowsecurity",
    )
    .fetch_one(&mut c)
    .await
    .expect("relrowsecurity");
    assert_eq!(forced, 2, "row-level security on, and not forced on the owner");

    // Signed with the database's key, read as its owner, computed here apart from the store.
    let key = common::pg::identity_key(&mut c).await;
    let alice = signed_identity(&key, "alice");
    let forgeries = [
        ("Bob named unsigned", "bob".to_string()),
        ("Bob's name after Alice's signature", alice.replace(":alice", ":bob")),
        ("Bob's name signed with another key", signed_identity(&[7; 32], "bob")),
        ("Bob's name signed with a hash without the key", {
            use sha2::Digest;
            let hash: String = sha2::Sha256::digest(b"bob")
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            format!("{hash}:bob")
        }),
    ];

    // Each attempt: Alice's signed identity, then what the statement sets on top of it.
    let mut attempts: Vec<(&str, Vec<String>)> = vec![
        ("Alice's signed identity alone", vec![]),
        (
            "acp_gateway.system = 'on'",
            vec!["SELECT set_config('acp_gateway.system', 'on', true)".into()],
        ),
        ("row_security = off", vec!["SET LOCAL row_security = off".into()]),
    ];
    for (what, value) in &forgeries {
        attempts.push((
            what,
            vec![format!("SELECT set_config('acp_gateway.user', '{value}', true)")],
        ));
    }

    for (what, settings) in &attempts {
        let mut tx = c.begin().await.expect("begin");
        sqlx::query(common::pg::ACT_AS)
            .bind(&alice)
            .execute(&mut *tx)
            .await
            .expect("switch to the request role");
        for setting in settings {
            tx.execute(setting.as_str()).await.expect(setting);
        }
        let me: String = sqlx::query_scalar("SELECT current_user::text")
            .fetch_one(&mut *tx)
            .await
            .expect("current_user");
        assert_eq!(me, REQUEST_ROLE, "{what}");

        // Reading: never a row of Bob's, even when asked for by name.
        for sql in [
            "SELECT id FROM sessions",
            "SELECT id FROM sessions WHERE owner = 'bob'",
            "SELECT id FROM sessions WHERE id = 'b1'",
            "SELECT session_id FROM session_events",
            "SELECT session_id FROM session_events WHERE session_id = 'b1'",
            "SELECT e.session_id FROM session_events e JOIN sessions s ON s.id = e.session_id WHERE s.owner = 'bob'",
        ] {
            if let Ok(found) = rows(&mut tx, sql).await {
                assert!(
                    found.iter().all(|id| id.starts_with('a')),
                    "{what}: {sql} found {found:?}"
                );
            }
        }
        // Writing: nothing of Bob's changes, and nothing can be made his.
        for sql in [
            "UPDATE sessions SET title = 'pwned' WHERE owner = 'bob'",
            "UPDATE sessions SET owner = 'alice' WHERE id = 'b1'",
            "UPDATE sessions SET archived_at = 1 WHERE owner = 'bob'",
            "UPDATE session_events SET payload = 'pwned' WHERE session_id = 'b1'",
            "DELETE FROM sessions WHERE owner = 'bob'",
            "DELETE FROM sessions WHERE id = 'b1'",
            "DELETE FROM session_events WHERE session_id = 'b1'",
        ] {
            if let Ok(n) = changed(&mut tx, sql).await {
                assert_eq!(n, 0, "{what}: {sql} changed {n} rows");
            }
        }
        for sql in [
            "INSERT INTO sessions (id, owner, agent, cwd, created_at, updated_at) VALUES ('b2', 'bob', 'demo', '/w', 0, 0)",
            "INSERT INTO session_events (session_id, seq_from, seq_to, payload, created_at) VALUES ('b1', 9, 9, 'x', 0)",
            "INSERT INTO session_events (session_id, seq_from, seq_to, payload, created_at) VALUES ('a1', 9, 9, 'x', 0)",
        ] {
            assert!(changed(&mut tx, sql).await.is_err(), "{what}: {sql} was allowed");
        }
        // The gateway's settings, the identity key, the search copy and the replica tables are
        // closed, to Alice too.
        for table in [
            "gateway_settings",
            "request_identity_key",
            "session_search",
            "session_leases",
            "replica_messages",
            "session_watchers",
        ] {
            let err = rows(&mut tx, &format!("SELECT count(*)::text FROM {table}"))
                .await
                .expect_err(table);
            // (With `row_security = off` Postgres refuses for that reason first.)
            let err = err.to_string();
            assert!(
                err.contains("permission denied") || err.contains("row-level security"),
                "{what}: {table}: {err}"
            );
        }

        // What Alice's identity still reaches: all of her own rows when it stands, none once it
        // was replaced; `row_security = off` is refused rather than obeyed.
        let own = rows(&mut tx, "SELECT id FROM sessions ORDER BY id").await;
        let own_events = rows(&mut tx, "SELECT session_id FROM session_events").await;
        match *what {
            "row_security = off" => {
                let err = own.expect_err("row_security = off must not show rows");
                assert!(err.to_string().contains("row-level security"), "{err}");
            }
            "Alice's signed identity alone" | "acp_gateway.system = 'on'" => {
                assert_eq!(own.expect("select"), ["a1", "a2"], "{what}");
                assert_eq!(own_events.expect("select"), ["a1"], "{what}");
                let made = "INSERT INTO sessions (id, owner, agent, cwd, created_at, updated_at) VALUES ('a3', 'alice', 'demo', '/w', 0, 0)";
                assert_eq!(changed(&mut tx, made).await.expect(made), 1, "{what}");
                let gone = "DELETE FROM sessions WHERE id = 'a2'";
                assert_eq!(changed(&mut tx, gone).await.expect(gone), 1, "{what}");
                // No counters, titles or stored bytes of its own making: only the transcript
                // writer updates a session.
                let forged = "INSERT INTO sessions (id, owner, agent, cwd, created_at, updated_at, stored_bytes) VALUES ('a4', 'alice', 'demo', '/w', 0, 0, -1)";
                assert!(changed(&mut tx, forged).await.is_err(), "{what}: {forged}");
                let retitled = "UPDATE sessions SET title = 'x' WHERE id = 'a1'";
                assert!(changed(&mut tx, retitled).await.is_err(), "{what}: {retitled}");
            }
            _ => {
                assert_eq!(
                    own.expect("select"),
                    Vec::<String>::new(),
                    "{what}: Alice's identity is gone"
                );
                assert_eq!(own_events.expect("select"), Vec::<String>::new(), "{what}");
            }
        }
        tx.rollback().await.expect("rollback");
    }

    // After all that, as the owner: Bob's rows are as the store left them.
    let bob = sqlx::query("SELECT id, owner, title FROM sessions WHERE owner = 'bob' OR id LIKE 'b%'")
        .fetch_all(&mut c)
        .await
        .expect("bob's rows");
    assert_eq!(bob.len(), 1);
    assert_eq!(bob[0].get::<Option<String>, _>("title"), None);
    let bob_events: i64 = sqlx::query_scalar("SELECT count(*) FROM session_events WHERE session_id = 'b1'")
        .fetch_one(&mut c)
        .await
        .expect("bob's events");
    assert_eq!(bob_events, 2);

    // A role granted the tables outright, but not the request role, sees nothing (no policy is
    // for it) and cannot check signatures.
    let (other, mut admin) = new_role(
        &database,
        "rls_other",
        "",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON sessions, session_events TO {role}",
    )
    .await;
    let mut o = PgConnection::connect(&common::pg::url_as(&other, "pw", &database).await)
        .await
        .expect("connect as the other role");
    let mut tx = o.begin().await.expect("begin");
    sqlx::query("SELECT set_config('acp_gateway.user', $1, true)")
        .bind(&alice)
        .execute(&mut *tx)
        .await
        .expect("name alice");
    assert_eq!(
        rows(&mut tx, "SELECT id FROM sessions").await.expect("select"),
        Vec::<String>::new()
    );
    assert_eq!(changed(&mut tx, "DELETE FROM sessions").await.expect("delete"), 0);
    let err = rows(&mut tx, "SELECT request_owner()")
        .await
        .expect_err("request_owner()");
    assert!(err.to_string().contains("permission denied"), "{err}");
    tx.rollback().await.expect("rollback");
    let _ = o.close().await;

    // And the store still works for everyone through the wall.
    assert_eq!(
        s.read_events("bob", "b1", 0, 10).await.expect("read").len(),
        2,
        "bob's transcript"
    );
    assert!(s.get_session("alice", "a2").await.expect("get").is_some());
    assert!(s.get_session("alice", "b1").await.expect("get").is_none());
    assert!(s.delete_session("bob", "b1").await.expect("delete"));

    let _ = c.close().await;
    drop(s);
    let _ = admin
        .execute(format!("DROP OWNED BY {other}; DROP ROLE {other}").as_str())
        .await;
    let _ = admin.close().await;
}

/// Every function that runs as the tables' owner (SECURITY DEFINER) searches pg_catalog, then
/// pg_temp named last: none takes the path current when it was made, which searched pg_temp first,
/// so a request-role session could put a temporary table in front of ours (the review's F11 L1).
#[tokio::test]
async fn functions_run_as_the_owner_search_no_callers_temporary_tables_first() {
    let url = common::pg::fresh_database().await;
    store::connect(&url).await.expect("connect");
    let mut c = PgConnection::connect(&url).await.expect("connect as the login role");
    let definers: Vec<(String, Option<Vec<String>>)> =
        sqlx::query_as("SELECT proname::text, proconfig FROM pg_proc WHERE prosecdef AND pronamespace = current_schema()::regnamespace ORDER BY 1")
            .fetch_all(&mut c)
            .await
            .expect("SECURITY DEFINER functions");
    assert!(
        definers.iter().any(|(name, _)| name == "session_search_copy"),
        "{definers:?}"
    );
    for (name, config) in &definers {
        assert_eq!(
            config.as_deref(),
            Some(&[String::from("search_path=pg_catalog, pg_temp")][..]),
            "{name}"
        );
    }
}

/// The migration makes the request role itself when the login role may (CREATEROLE), tolerating
/// several databases of one cluster migrating at once; when it may not, the gateway does not
/// start, and the error says what an operator must run. On a server of its own, where no test
/// has made the role yet.
#[tokio::test]
async fn the_migration_creates_the_request_role_or_says_what_to_run() {
    let server = common::pg::OwnServer::start().await;
    let mut admin = PgConnection::connect(&server.admin_url("postgres"))
        .await
        .expect("admin");
    let databases = ["gw1", "gw2", "gw3", "gw4"];
    admin
        .execute("CREATE ROLE gw LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEROLE PASSWORD 'pw'")
        .await
        .expect("login role");
    for d in databases {
        admin
            .execute(format!("CREATE DATABASE {d} OWNER gw").as_str())
            .await
            .expect("database");
    }

    let err = store::connect(&server.url_as("gw", "pw", "gw1"))
        .await
        .expect_err("no request role, and no right to make it");
    let msg = err.to_string();
    assert!(
        msg.contains("CREATE ROLE acp_gateway_request NOLOGIN NOSUPERUSER NOBYPASSRLS NOINHERIT")
            && msg.contains("GRANT acp_gateway_request TO gw"),
        "{msg}"
    );

    admin.execute("ALTER ROLE gw CREATEROLE").await.expect("createrole");
    let urls = databases.map(|d| server.url_as("gw", "pw", d));
    let stores = futures_util::future::join_all(urls.iter().map(|u| store::connect(u))).await;
    for (d, s) in databases.iter().zip(stores) {
        let s = s.unwrap_or_else(|e| panic!("{d}: {e}"));
        create_session(&*s, "a1", "alice", BASE).await;
        assert!(s.get_session("alice", "a1").await.expect("get").is_some(), "{d}");
        assert!(s.get_session("bob", "a1").await.expect("get").is_none(), "{d}");
    }
    let made = sqlx::query(
        "SELECT rolcanlogin, rolsuper, rolbypassrls, rolinherit, pg_has_role('gw', oid, 'MEMBER') AS granted
         FROM pg_roles WHERE rolname = 'acp_gateway_request'",
    )
    .fetch_one(&mut admin)
    .await
    .expect("the role was made");
    for attribute in ["rolcanlogin", "rolsuper", "rolbypassrls", "rolinherit"] {
        assert!(!made.get::<bool, _>(attribute), "{attribute}");
    }
    assert!(made.get::<bool, _>("granted"), "gw may switch to it");
    // Each database signs with a key of its own.
    let mut keys = Vec::new();
    for d in databases {
        let mut c = PgConnection::connect(&server.url_as("gw", "pw", d))
            .await
            .expect("connect");
        keys.push(common::pg::identity_key(&mut c).await);
        let _ = c.close().await;
    }
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), databases.len(), "one key per database");
    let _ = admin.close().await;
}

/// Request work logs in as a role of its own when `request_database_url` is set, one that can do
/// nothing but switch to the request role: a request statement that reset its role (the way an
/// injected `RESET ROLE` would) is then that login, which reads no table and no key and cannot
/// become the owner, where on the owner's login it would see every user's rows. A request login
/// that could act as the owner is refused at start-up, with the setting named.
#[tokio::test]
async fn request_work_on_a_login_of_its_own_cannot_reset_its_way_to_the_owner() {
    let url = common::pg::fresh_database().await;
    let database = common::pg::database_of(&url).to_string();
    let s = store::connect(&url).await.expect("migrate");
    for (id, owner) in [("a1", "alice"), ("b1", "bob")] {
        create_session(&*s, id, owner, BASE).await;
    }
    drop(s);

    // Why: on the owner's login, resetting the role inside a request transaction reaches all.
    let mut c = PgConnection::connect(&url).await.expect("connect as the login role");
    let mut tx = c.begin().await.expect("begin");
    common::pg::act_for(&mut tx, "alice").await;
    sqlx::query("RESET ROLE").execute(&mut *tx).await.expect("reset role");
    let all = rows(&mut tx, "SELECT id FROM sessions ORDER BY id")
        .await
        .expect("select");
    assert_eq!(
        all,
        ["a1", "b1"],
        "the owner's login sees every user's rows after RESET ROLE"
    );
    tx.rollback().await.expect("rollback");

    // The owner's own login given as the request login is refused, naming the setting.
    let Err(err) = store::open(&url, Some(&url)).await else {
        panic!("the owner's login was taken as the request login");
    };
    let msg = err.to_string();
    assert!(
        msg.contains("request_database_url")
            && msg.contains("tables' owner")
            && msg.contains("GRANT acp_gateway_request"),
        "{msg}"
    );

    let (web, mut admin) = new_role(&database, "rls_web", "NOINHERIT", "GRANT acp_gateway_request TO {role}").await;
    let web_url = common::pg::url_as(&web, "pw", &database).await;
    let s = store::open(&url, Some(&web_url))
        .await
        .expect("connect with a request login")
        .sessions;
    create_session(&*s, "a2", "alice", BASE + 1).await;
    assert!(s.get_session("alice", "a2").await.expect("get").is_some());
    assert!(s.get_session("alice", "b1").await.expect("get").is_none());
    s.write_batch(&[events("a1", 1)])
        .await
        .expect("system work as the owner");
    assert_eq!(s.read_events("alice", "a1", 0, 10).await.expect("read").len(), 1);

    // The same reset on the request login: no table, no key, no way to the owner.
    let mut w = PgConnection::connect(&web_url)
        .await
        .expect("connect as the request login");
    let key = common::pg::identity_key(&mut c).await;
    let mut tx = w.begin().await.expect("begin");
    sqlx::query(common::pg::ACT_AS)
        .bind(signed_identity(&key, "alice"))
        .execute(&mut *tx)
        .await
        .expect("act for alice");
    assert_eq!(
        rows(&mut tx, "SELECT id FROM sessions ORDER BY id")
            .await
            .expect("as the request role"),
        ["a1", "a2"],
        "before the reset: Alice's rows only"
    );
    sqlx::query("RESET ROLE").execute(&mut *tx).await.expect("reset role");
    for sql in [
        "SELECT id FROM sessions",
        "SELECT session_id FROM session_events",
        "SELECT encode(key, 'hex') FROM request_identity_key",
    ] {
        let err = rows(&mut tx, sql).await.expect_err(sql);
        assert!(err.to_string().contains("permission denied"), "{sql}: {err}");
    }
    let owner: String =
        sqlx::query_scalar("SELECT pg_get_userbyid(relowner)::text FROM pg_class WHERE oid = 'sessions'::regclass")
            .fetch_one(&mut c)
            .await
            .expect("owner");
    let err = rows(&mut tx, &format!("SELECT set_config('role', '{owner}', true)"))
        .await
        .expect_err("become the owner");
    assert!(err.to_string().contains("permission denied"), "{err}");
    tx.rollback().await.expect("rollback");

    // And the store's request work really logs in there: without the grant it stops, while
    // system work, on the owner's login, goes on.
    admin
        .execute(format!("REVOKE acp_gateway_request FROM {web}").as_str())
        .await
        .expect("revoke");
    let err = s
        .get_session("alice", "a2")
        .await
        .expect_err("request work without the grant");
    assert!(err.to_string().contains("permission denied"), "{err}");
    s.write_batch(&[events("a1", 2)]).await.expect("system work goes on");

    let _ = w.close().await;
    let _ = c.close().await;
    drop(s);
    let _ = admin
        .execute(format!("DROP OWNED BY {web}; DROP ROLE {web}").as_str())
        .await;
    let _ = admin.close().await;
}
