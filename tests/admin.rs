//! Administration and the audit log: every admin route refuses a non-admin (403) and a stranger
//! (401); an admin sees users and live sessions (never a transcript), stops another user's running
//! prompt (the prompt ends `cancelled` and the owner's client is told who stopped it and why); the
//! audit log holds each action with the right user, and nothing secret. Real gateway, real agent
//! processes, both databases.

mod common;

use common::{Db, TestGateway};
use reqwest::StatusCode;
use serde_json::json;

const ADMIN: &str = "root";

async fn an_admin_stops_a_prompt_and_everything_is_audited(db: Db) {
    let gw = TestGateway::start(db, |c| c.admin.users = vec![ADMIN.into()]).await;

    // Every admin route: 401 for nobody, 403 for a user, and the admin gets in.
    let routes = [
        (reqwest::Method::GET, "/api/admin/users"),
        (reqwest::Method::GET, "/api/admin/sessions"),
        (reqwest::Method::POST, "/api/admin/sessions/unknown/stop"),
        (reqwest::Method::GET, "/api/admin/audit"),
    ];
    for (method, path) in &routes {
        assert_eq!(
            gw.api(None, method.clone(), path).await.0,
            StatusCode::UNAUTHORIZED,
            "{path}"
        );
        let (status, body) = gw.api(Some("alice"), method.clone(), path).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
        assert!(
            body["error"].as_str().unwrap_or_default().contains("administrators"),
            "{body}"
        );
    }
    let (status, me) = gw.api(Some(ADMIN), reqwest::Method::GET, "/api/me").await;
    assert_eq!((status, me["admin"].clone()), (StatusCode::OK, json!(true)));
    assert_eq!(
        gw.api(Some("bob"), reqwest::Method::GET, "/api/me").await.1["admin"],
        false
    );

    // Bob's prompt runs (and runs: `[hang]` answers only when cancelled).
    let mut bob = gw.client("bob").await;
    let session = bob.new_session().await;
    let prompt = bob
        .start(
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": "secret plans [hang]"}]}),
        )
        .await;
    bob.wait_for(|m| m["params"]["update"]["sessionUpdate"] == "plan").await;

    let (status, live) = gw.api(Some(ADMIN), reqwest::Method::GET, "/api/admin/sessions").await;
    assert_eq!(status, StatusCode::OK);
    let listed = live["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .find(|s| s["sessionId"] == json!(session))
        .cloned()
        .expect("bob's session is listed");
    assert_eq!(listed["owner"], "bob");
    assert_eq!(listed["state"], "prompting", "{listed}");
    assert!(
        !live.to_string().contains("secret plans"),
        "no transcript in admin routes"
    );

    let (status, stopped) = gw
        .api(
            Some(ADMIN),
            reqwest::Method::POST,
            &format!("/api/admin/sessions/{session}/stop"),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{stopped}");
    assert_eq!(stopped["clientsTold"], 1);
    let told = bob.wait_for(|m| m["method"] == "_gateway/session_stopped").await;
    assert_eq!(told["params"]["sessionId"], json!(session));
    assert_eq!(told["params"]["by"], ADMIN);
    assert!(
        told["params"]["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("administrator"),
        "{told}"
    );
    let answer = bob.answer(prompt).await;
    assert_eq!(answer["result"]["stopReason"], "cancelled", "{answer}");

    let (_, users) = gw.api(Some(ADMIN), reqwest::Method::GET, "/api/admin/users").await;
    let row = users["users"]
        .as_array()
        .expect("users")
        .iter()
        .find(|u| u["user"] == "bob")
        .cloned()
        .expect("bob is listed");
    assert_eq!(row["sessions"], 1, "{row}");
    assert!(row["storedBytes"].as_i64().unwrap_or(0) > 0, "{row}");

    // The audit log: each action with the right user; nothing secret in any entry.
    let audit = |query: String| {
        let gw = &gw;
        async move {
            let mut found = Vec::new();
            // Entries are written a moment after they happen: look until they are there.
            for _ in 0..100 {
                let (status, page) = gw
                    .api(Some(ADMIN), reqwest::Method::GET, &format!("/api/admin/audit?{query}"))
                    .await;
                assert_eq!(status, StatusCode::OK);
                found = page["entries"].as_array().cloned().unwrap_or_default();
                if !found.is_empty() {
                    break;
                }
                gw.gw.sessions.flush().await;
                tokio::task::yield_now().await;
            }
            found
        }
    };
    let stops = audit(format!("actor={ADMIN}&action=admin_stop")).await;
    assert_eq!(stops.len(), 1, "{stops:?}");
    assert_eq!(stops[0]["target"], json!(session));
    assert_eq!(stops[0]["detail"]["owner"], "bob");
    let created = audit(String::from("actor=bob&action=session_create")).await;
    assert_eq!(created.len(), 1, "{created:?}");
    assert_eq!(created[0]["target"], json!(session));
    assert!(created[0]["connection"].as_str().is_some());
    let everything = audit(String::from("limit=1000")).await;
    let text = serde_json::to_string(&everything).expect("json");
    for secret in [common::SECRET.to_string(), gw.token("bob"), gw.token(ADMIN)] {
        assert!(!text.contains(&secret), "a secret in the audit log");
    }
    assert!(!text.contains("secret plans"), "no transcript in the audit log");
    // Paging: one entry a page, newest first, each page older than the last.
    let (_, first) = gw
        .api(Some(ADMIN), reqwest::Method::GET, "/api/admin/audit?limit=1")
        .await;
    let before = first["nextBefore"].as_i64().expect("a next page");
    let (_, second) = gw
        .api(
            Some(ADMIN),
            reqwest::Method::GET,
            &format!("/api/admin/audit?limit=1&before={before}"),
        )
        .await;
    assert!(second["entries"][0]["id"].as_i64().expect("id") < before);
    gw.stop().await;
}

common::both_backends!(
    an_admin_stops_a_prompt_and_everything_is_audited_sqlite,
    an_admin_stops_a_prompt_and_everything_is_audited_postgres,
    an_admin_stops_a_prompt_and_everything_is_audited
);
