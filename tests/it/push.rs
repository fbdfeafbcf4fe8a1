//! Issue 20, item 1: Web Push. A push service stands in for the browser vendor's: an HTTP server in
//! this test that records what it is sent. Each push decrypts with the device's own keys (RFC 8291)
//! and holds the session's id and title and what is asked, never transcript text; it is signed
//! with the gateway's VAPID key (RFC 8292, verified here). A session a tab shows is not pushed;
//! another user's events never reach Alice's device; a subscription the service says is gone
//! (410) is dropped. Over real WebSockets to the demo agent.

use crate::common;

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use base64::Engine as _;
use common::{Client, Db, TestGateway};
use reqwest::Method;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use web_push_native::p256;
use web_push_native::p256::elliptic_curve::sec1::ToEncodedPoint;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// What the push service was sent.
#[derive(Debug)]
struct Received {
    device: String,
    headers: HeaderMap,
    body: Vec<u8>,
}

/// A push service on a free port: `POST /push/{device}` is recorded; device `gone` answers 410.
async fn push_service() -> (String, mpsc::UnboundedReceiver<Received>) {
    let (tx, rx) = mpsc::unbounded_channel();
    async fn take(
        State(tx): State<mpsc::UnboundedSender<Received>>,
        Path(device): Path<String>,
        headers: HeaderMap,
        body: axum::body::Bytes,
    ) -> StatusCode {
        let gone = device == "gone";
        let _ = tx.send(Received {
            device,
            headers,
            body: body.to_vec(),
        });
        if gone { StatusCode::GONE } else { StatusCode::CREATED }
    }
    let app = axum::Router::new()
        .route("/push/{device}", axum::routing::post(take))
        .with_state(tx);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, rx)
}

/// A device: its secret key and auth secret, and the subscription a browser would make.
struct Device {
    secret: p256::SecretKey,
    auth: [u8; 16],
    endpoint: String,
}

impl Device {
    fn new(base: &str, name: &str, seed: u8) -> Self {
        Self {
            secret: p256::SecretKey::from_slice(&[seed; 32]).expect("scalar"),
            auth: [seed; 16],
            endpoint: format!("{base}/push/{name}"),
        }
    }

    fn subscription(&self, label: &str) -> Value {
        json!({
            "endpoint": self.endpoint,
            "keys": {
                "p256dh": B64.encode(self.secret.public_key().to_encoded_point(false).as_bytes()),
                "auth": B64.encode(self.auth),
            },
            "label": label,
            "expirationTime": null,
        })
    }

    /// The payload of `push`, decrypted with this device's keys.
    fn open(&self, push: &Received) -> Value {
        let plain = web_push_native::decrypt(push.body.clone(), &self.secret, &web_push_native::Auth::from(self.auth))
            .expect("the push decrypts with the device's keys");
        serde_json::from_slice(&plain).expect("JSON payload")
    }
}

async fn subscribe(gw: &TestGateway, user: &str, body: &Value) -> (StatusCode, Value) {
    let res = reqwest::Client::new()
        .post(gw.http_url("/api/push/subscriptions"))
        .bearer_auth(gw.token(user))
        .json(body)
        .send()
        .await
        .expect("request");
    let status = StatusCode::from_u16(res.status().as_u16()).expect("status");
    (status, res.json().await.unwrap_or(Value::Null))
}

async fn next_push(rx: &mut mpsc::UnboundedReceiver<Received>) -> Received {
    tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("a push in time")
        .expect("the push service runs")
}

/// The VAPID `Authorization` header checks out against the gateway's public key for `endpoint`'s
/// origin.
fn check_vapid(push: &Received, public_key: &str, origin: &str) {
    let auth = push.headers["authorization"].to_str().expect("ascii");
    let (jwt, k) = auth
        .strip_prefix("vapid t=")
        .and_then(|rest| rest.split_once(", k="))
        .unwrap_or_else(|| panic!("not a VAPID header: {auth}"));
    assert_eq!(k, public_key, "k= is the key the browser subscribed with");
    let point = B64.decode(public_key).expect("base64url");
    let key = jsonwebtoken::DecodingKey::from_ec_components(&B64.encode(&point[1..33]), &B64.encode(&point[33..65]))
        .expect("EC key");
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::ES256);
    // The push service's origin, its port included (RFC 8292: a self-hosted push service on a
    // port of its own checks it).
    validation.set_audience(&[origin]);
    validation.set_required_spec_claims(&["exp", "aud", "sub"]);
    jsonwebtoken::decode::<Value>(jwt, &key, &validation).expect("the VAPID JWT is signed with that key");
}

async fn permission_turn(c: &mut Client, s: &str, text: &str) -> (u64, Value) {
    let id = c
        .start(
            "session/prompt",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": text}]}),
        )
        .await;
    let ask = c.wait_for(|m| m["method"] == "session/request_permission").await;
    (id, ask)
}

async fn allow(c: &mut Client, turn: u64, ask: &Value) {
    c.send(
        json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}}),
    )
    .await;
    assert_eq!(c.answer(turn).await["result"]["stopReason"], "end_turn");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_reach_only_the_owners_devices_encrypted_signed_and_without_transcript_text() {
    pushes_to_devices(Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_reach_only_the_owners_devices_encrypted_signed_and_without_transcript_text_postgres() {
    pushes_to_devices(Db::Postgres).await;
}

async fn pushes_to_devices(db: Db) {
    let (base, mut pushes) = push_service().await;
    let gw = TestGateway::start(db, |c| {
        c.push.allow_http_endpoints = true;
        c.push.endpoint_hosts = vec!["127.0.0.1".into()];
        c.push.min_interval_secs = 0;
    })
    .await;
    let phone = Device::new(&base, "alice-phone", 3);
    let mut phones = phone.subscription("Pixel");
    phones["titles"] = json!(true);
    let (status, r) = subscribe(&gw, "alice", &phones).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    // Alice chose to see session titles on her phone (see the subscription above); Bob did not.
    let bobs = Device::new(&base, "bob-phone", 4);
    assert_eq!(
        subscribe(&gw, "bob", &bobs.subscription("Bob's")).await.0,
        StatusCode::CREATED
    );

    let (_, state) = gw.api(Some("alice"), Method::GET, "/api/push").await;
    let public_key = state["publicKey"].as_str().expect("a VAPID key").to_string();
    assert_eq!(B64.decode(&public_key).expect("base64url").len(), 65);
    assert_eq!(state["devices"][0]["label"], "Pixel");
    assert_eq!(state["devices"][0]["service"], "127.0.0.1");
    assert!(
        !state.to_string().contains("alice-phone"),
        "the endpoint is not listed: {state}"
    );

    // A permission request in a session no tab shows: pushed, with what is asked, not what was said.
    let mut a = gw.client("alice").await;
    let s = a.new_session().await;
    let (turn, ask) = permission_turn(&mut a, &s, "Refactor the parser [permission] zebra-marker").await;
    let push = next_push(&mut pushes).await;
    assert_eq!(push.device, "alice-phone");
    assert_eq!(push.headers["content-encoding"], "aes128gcm");
    assert_eq!(push.headers["urgency"], "high");
    assert_eq!(
        push.headers["topic"],
        s.as_str(),
        "one topic per session: the newest replaces the rest"
    );
    assert!(push.headers.contains_key("ttl"));
    check_vapid(&push, &public_key, &base);
    let payload = phone.open(&push);
    assert_eq!(payload["kind"], "permission");
    assert_eq!(payload["sessionId"], s.as_str());
    assert_eq!(payload["asked"], ask["params"]["toolCall"]["title"]);
    assert!(!push.body.windows(5).any(|w| w == b"zebra"), "encrypted on the wire");

    // The tab shows the session: its turn's end is not pushed.
    a.send(json!({"jsonrpc": "2.0", "method": "_gateway/visibility", "params": {"sessionId": s}}))
        .await;
    allow(&mut a, turn, &ask).await;
    // Hidden again: the next turn's end is.
    a.send(json!({"jsonrpc": "2.0", "method": "_gateway/visibility", "params": {"sessionId": null}}))
        .await;
    let r = a.prompt(&s, "and now the tests").await;
    assert_eq!(r["result"]["stopReason"], "end_turn");
    let push = next_push(&mut pushes).await;
    assert_eq!(push.device, "alice-phone");
    let payload = phone.open(&push);
    assert_eq!(payload["kind"], "turn_ended");
    assert_eq!(
        payload["title"], "Refactor the parser [permission] zebra-marker",
        "the session's title, which Alice chose: {payload}"
    );
    let said: String = a
        .take_updates(&s)
        .iter()
        .filter_map(|u| u["params"]["update"]["content"]["text"].as_str().map(str::to_string))
        .collect();
    assert!(said.contains("you said"), "the agent answered: {said}");
    assert!(
        !payload.to_string().contains("you said"),
        "no transcript text: {payload}"
    );

    // Bob's permission request goes to Bob's phone only (and is the next push there is: nothing
    // was pushed for Alice's watched turn).
    let mut b = gw.client("bob").await;
    let sb = b.new_session().await;
    let (bturn, bask) = permission_turn(&mut b, &sb, "deploy [permission]").await;
    let push = next_push(&mut pushes).await;
    assert_eq!(push.device, "bob-phone");
    assert_eq!(bobs.open(&push)["sessionId"], sb.as_str());
    allow(&mut b, bturn, &bask).await;
    let push = next_push(&mut pushes).await;
    let payload = bobs.open(&push);
    assert_eq!(
        (push.device.as_str(), payload["kind"].as_str()),
        ("bob-phone", Some("turn_ended"))
    );
    assert!(
        payload["title"].is_null(),
        "no title (the first prompt's words) unless the user chose it: {payload}"
    );
    assert!(pushes.try_recv().is_err(), "nothing else was pushed");

    // A device the push service says is gone is dropped.
    let gone = Device::new(&base, "gone", 5);
    assert_eq!(
        subscribe(&gw, "alice", &gone.subscription("Old tablet")).await.0,
        StatusCode::CREATED
    );
    let (turn, ask) = permission_turn(&mut a, &s, "once more [permission]").await;
    let mut devices = vec![next_push(&mut pushes).await.device, next_push(&mut pushes).await.device];
    devices.sort();
    assert_eq!(devices, ["alice-phone", "gone"]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let state = loop {
        // State with no event to wait on: the list as the store holds it.
        let (_, state) = gw.api(Some("alice"), Method::GET, "/api/push").await;
        if state["devices"].as_array().is_some_and(|d| d.len() == 1) {
            break state;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the gone device was not dropped: {state}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(state["devices"][0]["label"], "Pixel");
    assert!(common::metric_sum("acp_gateway_pushes_total{outcome=\"gone\"}") >= 1.0);
    for file in ["gw.db", "gw.db-wal"] {
        // (Postgres: no such files; its rows are the same ciphertext.)
        let bytes = std::fs::read(gw.dir().path().join(file)).unwrap_or_default();
        assert!(
            !bytes.windows(11).any(|w| w == b"alice-phone"),
            "{file}: an endpoint stored in the clear"
        );
    }
    allow(&mut a, turn, &ask).await;

    // Removal.
    let id = state["devices"][0]["id"].as_str().expect("id");
    let (status, _) = gw
        .api(Some("bob"), Method::DELETE, &format!("/api/push/subscriptions/{id}"))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "not Bob's to remove");
    let (status, _) = gw
        .api(Some("alice"), Method::DELETE, &format!("/api/push/subscriptions/{id}"))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_are_checked_and_a_session_is_pushed_at_most_once_in_the_interval() {
    let (base, mut pushes) = push_service().await;
    let strict = TestGateway::start(Db::Sqlite, |_| {}).await;
    let device = Device::new(&base, "d", 6);
    let (status, r) = subscribe(&strict, "alice", &device.subscription("x")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(r["error"].as_str().unwrap_or_default().contains("https://"), "{r}");
    // Only the browser vendors' push services, by default.
    let mut elsewhere = device.subscription("x");
    elsewhere["endpoint"] = json!("https://internal.example.com/hook");
    let (status, r) = subscribe(&strict, "alice", &elsewhere).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        r["error"]
            .as_str()
            .unwrap_or_default()
            .contains("[push] endpoint_hosts"),
        "{r}"
    );
    let mut bad = device.subscription("x");
    bad["endpoint"] = json!("https://fcm.googleapis.com/fcm/send/x");
    bad["keys"]["auth"] = json!(B64.encode([1u8; 8]));
    let (status, r) = subscribe(&strict, "alice", &bad).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(r["error"].as_str().unwrap_or_default().contains("16 bytes"), "{r}");
    strict.stop().await;

    let off = TestGateway::start(Db::Sqlite, |c| c.push.enabled = false).await;
    let (status, _) = subscribe(&off, "alice", &device.subscription("x")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    off.stop().await;

    // Default interval (10 s): two quick turns of one session, one push; a permission request
    // right after still goes.
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.push.allow_http_endpoints = true;
        c.push.endpoint_hosts = vec!["127.0.0.1".into()];
    })
    .await;
    assert_eq!(
        subscribe(&gw, "alice", &device.subscription("x")).await.0,
        StatusCode::CREATED
    );
    let mut a = gw.client("alice").await;
    let s = a.new_session().await;
    a.prompt(&s, "one").await;
    a.prompt(&s, "two").await;
    let (turn, ask) = permission_turn(&mut a, &s, "three [permission]").await;
    let mut kinds = vec![
        device.open(&next_push(&mut pushes).await)["kind"].clone(),
        device.open(&next_push(&mut pushes).await)["kind"].clone(),
    ];
    kinds.sort_by_key(ToString::to_string);
    assert_eq!(kinds, [json!("permission"), json!("turn_ended")]);
    allow(&mut a, turn, &ask).await;
    // The third turn's end is within the interval too. Another session's permission request
    // closes the run: nothing of the first session came before it.
    let s2 = a.new_session().await;
    let (turn, ask) = permission_turn(&mut a, &s2, "four [permission]").await;
    let last = device.open(&next_push(&mut pushes).await);
    assert_eq!(
        (last["sessionId"].as_str(), last["kind"].as_str()),
        (Some(s2.as_str()), Some("permission")),
        "{last}"
    );
    allow(&mut a, turn, &ask).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_is_pushed_and_the_device_that_opens_the_session_is_asked_it_too() {
    let (base, mut pushes) = push_service().await;
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.push.allow_http_endpoints = true;
        c.push.endpoint_hosts = vec!["127.0.0.1".into()];
        c.agents.insert(
            "default".into(),
            acp_gateway::infra::config::AgentConfig {
                command: "/usr/bin/python3".into(),
                args: vec![concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/elicit_agent.py").into()],
                ..Default::default()
            },
        );
    })
    .await;
    let phone = Device::new(&base, "phone", 7);
    assert_eq!(
        subscribe(&gw, "alice", &phone.subscription("Phone")).await.0,
        StatusCode::CREATED
    );
    // A desktop tab in the background asks; the question is pushed.
    let mut desk = gw.client("alice").await;
    let s = desk.new_session().await;
    let turn = desk
        .start(
            "session/prompt",
            json!({"sessionId": s, "prompt": [{"type": "text", "text": "form"}]}),
        )
        .await;
    desk.wait_for(|m| m["method"] == "elicitation/create").await;
    let payload = phone.open(&next_push(&mut pushes).await);
    assert_eq!(payload["kind"], "elicitation");
    assert_eq!(payload["asked"], "Where should this deploy?");
    // The phone opens the session: it is asked the question too, and its answer is the one.
    let mut mobile = gw.client("alice").await;
    let r = mobile
        .request(
            "session/load",
            json!({"sessionId": s, "cwd": mobile.root, "mcpServers": []}),
        )
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let asked = mobile.wait_for(|m| m["method"] == "elicitation/create").await;
    mobile
        .send(json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"action": "accept", "content": {"env": "staging", "replicas": 2}}}))
        .await;
    assert_eq!(desk.answer(turn).await["result"]["stopReason"], "end_turn");
    let said: String = desk
        .take_updates(&s)
        .iter()
        .filter_map(|u| u["params"]["update"]["content"]["text"].as_str().map(str::to_string))
        .collect();
    assert!(said.contains("staging"), "the phone's answer reached the agent: {said}");
    // The desktop is told the question is settled.
    desk.wait_for(|m| m["method"] == "$/cancel_request").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_opted_in_on_one_replica_is_pushed_by_another() {
    const KEY: &str = "c2hhcmVkIHNlY3JldHMga2V5IGZvciB0d28gcmVwbGk=";
    let (base, mut pushes) = push_service().await;
    let url = common::pg::fresh_database().await;
    let tweak = |c: &mut acp_gateway::infra::config::Config| {
        c.push.allow_http_endpoints = true;
        c.push.endpoint_hosts = vec!["127.0.0.1".into()];
        c.secrets_key = Some(KEY.to_string().into());
    };
    let a = TestGateway::start(Db::Url(url.clone()), tweak).await;
    let b = TestGateway::start(Db::Url(url), tweak).await;
    let phone = Device::new(&base, "phone", 8);
    assert_eq!(
        subscribe(&a, "alice", &phone.subscription("Phone")).await.0,
        StatusCode::CREATED
    );
    let (_, state) = a.api(Some("alice"), Method::GET, "/api/push").await;
    let public_key = state["publicKey"].as_str().expect("key").to_string();
    let (_, on_b) = b.api(Some("alice"), Method::GET, "/api/push").await;
    assert_eq!(
        on_b["publicKey"],
        public_key.as_str(),
        "one VAPID key for the replicas that share the secrets key"
    );
    assert_eq!(on_b["devices"][0]["label"], "Phone");

    // The session lives on B: B pushes, signed as A said it would be.
    let mut c = b.client("alice").await;
    let s = c.new_session().await;
    let (turn, ask) = permission_turn(&mut c, &s, "from replica b [permission]").await;
    let push = next_push(&mut pushes).await;
    check_vapid(&push, &public_key, &base);
    assert_eq!(phone.open(&push)["sessionId"], s.as_str());
    allow(&mut c, turn, &ask).await;
}
