//! Device sign-in (contract, "Device sign-in"): RFC 8628 codes approved by a signed-in person,
//! a token scoped to the user, listed and revoked at once; and `acp-gateway login` and
//! `connect` using it, as a person at a terminal would.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::common::{Client, Db, TestGateway, gateway_bin};

const GRANT: &str = "urn:ietf:params:oauth:grant-type:device_code";

async fn start(gw: &TestGateway, name: &str) -> Value {
    let r = reqwest::Client::new()
        .post(gw.http_url("/auth/device"))
        .form(&[("client_id", "acp-gateway"), ("client_name", name)])
        .send()
        .await
        .expect("start");
    assert_eq!(r.status(), 200);
    r.json().await.expect("json")
}

async fn poll(gw: &TestGateway, device_code: &str) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(gw.http_url("/auth/device/token"))
        .form(&[("grant_type", GRANT), ("device_code", device_code)])
        .send()
        .await
        .expect("poll");
    (r.status().as_u16(), r.json().await.expect("json"))
}

async fn decide(gw: &TestGateway, user: &str, code: &str, approve: bool) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(gw.http_url("/api/device/approve"))
        .bearer_auth(gw.token(user))
        .json(&json!({"userCode": code, "approve": approve}))
        .send()
        .await
        .expect("approve");
    (r.status().as_u16(), r.json().await.expect("json"))
}

#[tokio::test]
async fn a_code_approved_by_a_signed_in_person_gives_their_device_a_token_that_is_revoked_at_once() {
    approved_then_revoked(Db::Sqlite).await;
}

#[tokio::test]
async fn a_code_approved_by_a_signed_in_person_gives_their_device_a_token_that_is_revoked_at_once_postgres() {
    approved_then_revoked(Db::Postgres).await;
}

async fn approved_then_revoked(db: Db) {
    let gw = TestGateway::start(db, |_| {}).await;
    let started = start(&gw, "laptop of alice").await;
    let code = started["user_code"].as_str().expect("user code").to_string();
    let device_code = started["device_code"].as_str().expect("device code").to_string();
    assert!(
        started["verification_uri_complete"]
            .as_str()
            .expect("present")
            .ends_with(&format!("/device?code={code}")),
        "{started}"
    );
    assert_eq!(started["interval"], 5);

    // Before approval: pending; polling again at once: slow down.
    assert_eq!(
        poll(&gw, &device_code).await,
        (
            400,
            json!({"error": "authorization_pending", "error_description": "not approved yet"})
        )
    );
    assert_eq!(poll(&gw, &device_code).await.1["error"], "slow_down");

    // The approver sees which device asks, then approves.
    let (status, shown) = gw
        .api(
            Some("alice"),
            reqwest::Method::GET,
            &format!("/api/device?userCode={}", code.to_lowercase()),
        )
        .await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["clientName"], "laptop of alice");
    assert_eq!(shown["state"], "pending");
    assert_eq!(
        decide(&gw, "alice", &code, true).await,
        (200, json!({"state": "approved"}))
    );
    // A second person's decision on the same code is refused: it is alice's now.
    let (status, body) = decide(&gw, "bob", &code, false).await;
    assert_eq!(status, 409, "{body}");

    // The device's next poll after the interval (RFC 8628's 5 s) gets the token, once.
    let mut issued = Value::Null;
    for _ in 0..8 {
        let (status, body) = poll(&gw, &device_code).await;
        if status == 200 {
            issued = body;
            break;
        }
        assert_eq!(body["error"], "slow_down", "{body}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let token = issued["access_token"]
        .as_str()
        .unwrap_or_else(|| panic!("no token: {issued}"))
        .to_string();
    assert_eq!(
        poll(&gw, &device_code).await.1["error"],
        "expired_token",
        "a code is used once"
    );

    // The token is alice's, on ACP and her REST routes.
    let mut device = Client::connect(&gw.ws_url(), &token)
        .await
        .expect("the device connects");
    device.initialize().await;
    let s = device.new_session().await;
    let r = reqwest::Client::new()
        .get(gw.http_url("/api/sessions"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("list");
    let listed: Value = r.json().await.expect("json");
    assert!(
        listed["sessions"]
            .as_array()
            .expect("present")
            .iter()
            .any(|x| x["sessionId"] == s),
        "{listed}"
    );

    // Listed under alice's devices with its last use; not under bob's.
    let (_, mine) = gw.api(Some("alice"), reqwest::Method::GET, "/api/devices").await;
    let devices = mine["devices"].as_array().expect("devices");
    assert_eq!(devices.len(), 1, "{mine}");
    assert_eq!(devices[0]["name"], "laptop of alice");
    assert!(devices[0]["lastUsedAt"].is_i64(), "{mine}");
    let id = devices[0]["id"].as_str().expect("present").to_string();
    let (_, bobs) = gw.api(Some("bob"), reqwest::Method::GET, "/api/devices").await;
    assert_eq!(bobs["devices"], json!([]));
    let (status, _) = gw
        .api(Some("bob"), reqwest::Method::DELETE, &format!("/api/devices/{id}"))
        .await;
    assert_eq!(status, 404, "bob cannot revoke alice's device");

    // Revoked: refused at once.
    let (status, _) = gw
        .api(Some("alice"), reqwest::Method::DELETE, &format!("/api/devices/{id}"))
        .await;
    assert_eq!(status, 204);
    // Its connection open now is closed at once too (1008), with no identity provider configured.
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match device.recv_frame().await {
                Some(tokio_tungstenite::tungstenite::Message::Close(frame)) => return frame.map(|f| u16::from(f.code)),
                None => return None,
                Some(_) => {}
            }
        }
    })
    .await
    .expect("the revoked device's open connection is closed within 5 s");
    assert_eq!(closed, Some(1008));
    let refused = Client::connect(&gw.ws_url(), &token).await;
    assert!(refused.is_err(), "a revoked device's token still connects");
    let (_, mine) = gw.api(Some("alice"), reqwest::Method::GET, "/api/devices").await;
    assert_eq!(mine["devices"], json!([]));
}

#[tokio::test]
async fn denied_expired_and_unknown_codes_say_so() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let denied = start(&gw, "somebody").await;
    assert_eq!(
        decide(&gw, "alice", denied["user_code"].as_str().expect("present"), false).await,
        (200, json!({"state": "denied"}))
    );
    assert_eq!(
        poll(&gw, denied["device_code"].as_str().expect("present")).await.1["error"],
        "access_denied"
    );
    let (status, _) = decide(&gw, "alice", "BCDF-GHJK", true).await;
    assert_eq!(status, 404);
    assert_eq!(poll(&gw, "not-a-code").await.1["error"], "invalid_grant");

    let gw = TestGateway::start(Db::Sqlite, |c| c.device.code_ttl_secs = 0).await;
    let expired = start(&gw, "late").await;
    let (status, body) = decide(&gw, "alice", expired["user_code"].as_str().expect("present"), true).await;
    assert_eq!(status, 410, "{body}");
    assert_eq!(
        poll(&gw, expired["device_code"].as_str().expect("present")).await.1["error"],
        "expired_token"
    );
}

#[tokio::test]
async fn acp_gateway_login_keeps_a_private_token_that_connect_uses_and_a_signed_out_connect_offers_terminal_login() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let config = tempfile::tempdir().expect("config dir");
    let base = gw.http_url("");
    let base = base.trim_end_matches('/');

    // Signed out: `connect` answers `initialize` itself, offering the terminal login.
    let mut connect = tokio::process::Command::new(gateway_bin())
        .args(["connect", base])
        .env("XDG_CONFIG_HOME", config.path())
        .env_remove("ACP_GATEWAY_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("connect");
    let mut to_connect = connect.stdin.take().expect("stdin");
    let mut from_connect = BufReader::new(connect.stdout.take().expect("stdout")).lines();
    let mut say = async |msg: Value| {
        to_connect
            .write_all(format!("{msg}\n").as_bytes())
            .await
            .expect("write");
    };
    say(json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1, "clientCapabilities": {}}})).await;
    let line = tokio::time::timeout(Duration::from_secs(10), from_connect.next_line())
        .await
        .expect("answer")
        .expect("read")
        .expect("line");
    let init: Value = serde_json::from_str(&line).expect("json");
    let method = &init["result"]["authMethods"][0];
    assert_eq!(method["type"], "terminal", "{init}");
    assert_eq!(method["args"], json!(["--login"]));
    say(json!({"jsonrpc": "2.0", "id": 1, "method": "session/list", "params": {}})).await;
    let line = tokio::time::timeout(Duration::from_secs(10), from_connect.next_line())
        .await
        .expect("answer")
        .expect("read")
        .expect("line");
    let refused: Value = serde_json::from_str(&line).expect("json");
    assert_eq!(refused["error"]["code"], -32000, "{refused}");

    // What the editor's Log in runs: `connect URL --login`, a code to approve in the browser.
    let mut login = tokio::process::Command::new(gateway_bin())
        .args(["connect", base, "--login"])
        .env("XDG_CONFIG_HOME", config.path())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("login");
    let mut told = BufReader::new(login.stderr.take().expect("stderr")).lines();
    let code = loop {
        let line = tokio::time::timeout(Duration::from_secs(10), told.next_line())
            .await
            .expect("login talks")
            .expect("read")
            .expect("a line");
        if let Some(code) = line.split("shows the code ").nth(1) {
            break code
                .split_whitespace()
                .next()
                .expect("code")
                .trim_end_matches('.')
                .to_string();
        }
    };
    assert_eq!(decide(&gw, "alice", &code, true).await.0, 200);
    let status = tokio::time::timeout(Duration::from_secs(30), login.wait())
        .await
        .expect("login ends")
        .expect("status");
    assert!(status.success());
    let file = config.path().join("acp-gateway/tokens.json");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&file).expect("tokens").permissions().mode() & 0o777,
        0o600
    );
    let tokens: Value = serde_json::from_str(&std::fs::read_to_string(&file).expect("present")).expect("present");
    assert!(tokens[base].is_string(), "{tokens}");

    // The running `connect` picks the token up: the editor's next request goes through.
    say(json!({"jsonrpc": "2.0", "id": 2, "method": "session/list", "params": {}})).await;
    let listed = loop {
        let line = tokio::time::timeout(Duration::from_secs(10), from_connect.next_line())
            .await
            .expect("answer")
            .expect("read")
            .expect("line");
        let msg: Value = serde_json::from_str(&line).expect("json");
        if msg["id"] == 2 {
            break msg;
        }
    };
    assert!(listed["result"]["sessions"].is_array(), "{listed}");
}
