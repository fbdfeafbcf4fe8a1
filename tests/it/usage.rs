//! What each person spends: the showcase demo agent's `usage_update` costs are summed per user,
//! agent and day, shown to each user (their own) and to admins (everyone's); past the daily cap
//! the next prompt is refused with an error naming the cap and when it resets, and the next day
//! (the clock moved, not waited for) it runs again; the monthly cap likewise. Both databases.

use crate::common;

use std::sync::Arc;

use acp_gateway::infra::config::{Config, DEFAULT_AGENT};
use common::{Client, Db, TestGateway, WAIT};
use reqwest::StatusCode;
use serde_json::{Value, json};

fn showcase(daily: Option<f64>, monthly: Option<f64>) -> impl FnOnce(&mut Config) {
    move |c: &mut Config| {
        let demo = c.agents.get_mut(DEFAULT_AGENT).expect("default agent");
        demo.args = ["demo-agent", "--showcase", "--delay-us", "0"]
            .map(String::from)
            .to_vec();
        c.usage.daily_cost_cap = daily;
        c.usage.monthly_cost_cap = monthly;
        c.admin.users = vec!["root".into()];
    }
}

/// `user`'s cost so far this month, once the recorder has it (it records a moment after).
async fn spent(gw: &TestGateway, user: &str, at_least: f64) -> f64 {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(50));
    loop {
        tick.tick().await;
        let (_, usage) = gw.api(Some(user), reqwest::Method::GET, "/api/usage").await;
        let total: f64 = usage["days"]
            .as_array()
            .map(|d| d.iter().filter_map(|r| r["cost"].as_f64()).sum())
            .unwrap_or(0.0);
        if total > at_least {
            return total;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no usage recorded for {user}: {usage}"
        );
    }
}

async fn prompt(client: &mut Client, session: &str) -> Value {
    client.prompt(session, "/explain what this does").await
}

async fn the_daily_cap_refuses_and_resets_the_next_day(db: Db) {
    let gw = TestGateway::start(db, showcase(Some(0.000_001), None)).await;
    let mut alice = gw.client("alice").await;
    let session = alice.new_session().await;
    let first = prompt(&mut alice, &session).await;
    assert!(first.get("result").is_some(), "{first}");
    let cost = spent(&gw, "alice", 0.0).await;
    assert!(cost > 0.000_001, "{cost}");

    // Past the cap: refused, naming the cap and when it resets.
    let refused = prompt(&mut alice, &session).await;
    assert_eq!(refused["error"]["code"], -32030, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    let tomorrow = (chrono::Utc::now().date_naive() + chrono::Duration::days(1))
        .format("%Y-%m-%d")
        .to_string();
    assert!(
        message.contains("daily cost cap") && message.contains(&format!("resets at {tomorrow}T00:00:00Z")),
        "{message}"
    );
    assert_eq!(refused["error"]["data"]["cap"], "daily_cost");

    // Someone else is not affected; each sees only their own; admins see everyone.
    let mut bob = gw.client("bob").await;
    let bobs = bob.new_session().await;
    assert!(prompt(&mut bob, &bobs).await.get("result").is_some());
    spent(&gw, "bob", 0.0).await;
    let (_, mine) = gw.api(Some("alice"), reqwest::Method::GET, "/api/usage").await;
    assert!(
        mine["days"]
            .as_array()
            .expect("days")
            .iter()
            .all(|r| r["owner"] == "alice"),
        "{mine}"
    );
    assert_eq!(mine["caps"]["daily"], json!(0.000_001));
    assert_eq!(
        gw.api(Some("alice"), reqwest::Method::GET, "/api/admin/usage").await.0,
        StatusCode::FORBIDDEN
    );
    let (status, all) = gw.api(Some("root"), reqwest::Method::GET, "/api/admin/usage").await;
    assert_eq!(status, StatusCode::OK);
    let owners: Vec<&str> = all["days"]
        .as_array()
        .expect("days")
        .iter()
        .filter_map(|r| r["owner"].as_str())
        .collect();
    assert!(owners.contains(&"alice") && owners.contains(&"bob"), "{all}");

    // The next day, the cap has reset.
    let tomorrow_noon = chrono::Utc::now() + chrono::Duration::days(1);
    gw.gw.usage.set_clock(Arc::new(move || tomorrow_noon));
    let again = prompt(&mut alice, &session).await;
    assert!(again.get("result").is_some(), "{again}");
    gw.stop().await;
}

common::both_backends!(
    the_daily_cap_refuses_and_resets_the_next_day_sqlite,
    the_daily_cap_refuses_and_resets_the_next_day_postgres,
    the_daily_cap_refuses_and_resets_the_next_day
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monthly_cap_resets_on_the_first_of_the_next_month() {
    let gw = TestGateway::start(Db::Sqlite, showcase(None, Some(0.000_001))).await;
    let mut alice = gw.client("alice").await;
    let session = alice.new_session().await;
    assert!(prompt(&mut alice, &session).await.get("result").is_some());
    spent(&gw, "alice", 0.0).await;
    let refused = prompt(&mut alice, &session).await;
    assert_eq!(refused["error"]["data"]["cap"], "monthly_cost", "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("-01T00:00:00Z")
    );
    let next_month = chrono::Utc::now() + chrono::Duration::days(32);
    gw.gw.usage.set_clock(Arc::new(move || next_month));
    assert!(prompt(&mut alice, &session).await.get("result").is_some());
    gw.stop().await;
}
