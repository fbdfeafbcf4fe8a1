//! Administration and the audit log: every admin route refuses a non-admin (403) and a stranger
//! (401); an admin sees users and live sessions (never a transcript), stops another user's running
//! prompt (the prompt ends `cancelled` and the owner's client is told who stopped it and why); the
//! audit log holds each action with the right user, and nothing secret. Real gateway, real agent
//! processes, both databases.

use crate::common;

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
    // Every entry says where it came from: the session created over /acp and the admin's stop
    // included (they once carried no address).
    assert_eq!(created[0]["clientAddr"], "127.0.0.1", "{created:?}");
    assert_eq!(stops[0]["clientAddr"], "127.0.0.1", "{stops:?}");
    let everything = audit(String::from("limit=1000")).await;
    for entry in everything.as_slice() {
        assert_eq!(entry["clientAddr"], "127.0.0.1", "{entry}");
    }
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

/// `acp_gateway_audit_dropped_total`, as this process counts it.
fn audit_dropped() -> f64 {
    acp_gateway::infra::telemetry::render_metrics()
        .lines()
        .filter(|l| l.starts_with("acp_gateway_audit_dropped_total"))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum()
}

/// What nobody signed in does costs them nothing, so it is counted, not stored one row each:
/// 10,000 refused sign-ins from one address (bad login codes and bad tokens) leave a handful of
/// rows that add up to 10,000, nothing is dropped, and a sign-in in the middle of them is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_refusals_are_counted_and_never_push_out_a_real_entry() {
    const REFUSALS: usize = 10_000;
    const LANES: usize = 8;
    let gw = TestGateway::start(Db::Sqlite, |c| c.limits.auth_requests_per_minute_per_ip = 0).await;
    let dropped = audit_dropped();
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let started = std::time::Instant::now();
    refuse_all(&gw, &http, 0..REFUSALS / 2, LANES).await;
    // Alice signs in with the form, in the middle of the noise.
    let res = http
        .post(gw.http_url("/auth/login"))
        .form(&[("token", gw.token("alice"))])
        .send()
        .await
        .expect("sign in");
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    refuse_all(&gw, &http, REFUSALS / 2..REFUSALS, LANES).await;
    eprintln!("{REFUSALS} anonymous refusals in {:?}", started.elapsed());
    assert_eq!(audit_dropped(), dropped, "no audit entry dropped");
    let (db_url, _dir) = (gw.db_url.clone(), gw.dir().clone());
    // Stopping writes what is queued and sums up the windows still open.
    gw.stop().await;
    let db = acp_gateway::store::open(&db_url, None).await.expect("store").db;
    let rows = acp_gateway::audit::AuditLog::new(db)
        .page(&acp_gateway::audit::AuditFilter {
            limit: 1000,
            ..Default::default()
        })
        .await
        .expect("audit");
    assert!(
        rows.iter()
            .any(|r| r.actor == "alice" && r.action == "sign_in" && r.outcome == "ok"),
        "alice's sign-in is stored: {rows:#?}"
    );
    let anonymous: Vec<_> = rows.iter().filter(|r| r.actor.is_empty()).collect();
    eprintln!("{} anonymous audit rows: {anonymous:#?}", anonymous.len());
    assert!(anonymous.len() <= 8, "{} rows", anonymous.len());
    let counted: u64 = anonymous
        .iter()
        .map(|r| {
            let detail: serde_json::Value = serde_json::from_str(r.detail.as_deref().unwrap_or("{}")).expect("json");
            assert_eq!(r.client_addr.as_deref(), Some("127.0.0.1"), "{r:?}");
            detail["repeated"].as_u64().unwrap_or(1)
        })
        .sum();
    assert_eq!(counted, REFUSALS as u64, "every refusal is counted");
}

/// Refused sign-ins, `lanes` at a time: even ones a forged login code, odd ones a forged token.
async fn refuse_all(gw: &TestGateway, http: &reqwest::Client, range: std::ops::Range<usize>, lanes: usize) {
    futures_util::future::join_all((0..lanes).map(|lane| {
        let range = range.clone();
        async move {
            for i in range.filter(|i| i % lanes == lane) {
                let res = if i % 2 == 0 {
                    http.get(gw.http_url("/auth/login?code=forged")).send().await
                } else {
                    http.post(gw.http_url("/auth/login"))
                        .form(&[("token", "forged")])
                        .send()
                        .await
                };
                assert_eq!(res.expect("request").status(), StatusCode::UNAUTHORIZED);
            }
        }
    }))
    .await;
}
