//! Issue 3: users, sessions and isolation, on SQLite and on a real Postgres.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use common::{Client, Db, TestGateway, both_backends};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

/// Strips the id so two error answers can be compared whole.
fn without_id(mut v: Value) -> Value {
    v.as_object_mut().map(|o| o.remove("id"));
    v
}

both_backends!(
    foreign_ids_are_refused_like_unknown_ones_sqlite,
    foreign_ids_are_refused_like_unknown_ones_postgres,
    foreign_ids
);
async fn foreign_ids(db: Db) {
    let gw = TestGateway::start(db, |_| {}).await;
    let mut alice = gw.client("alice").await;
    let mut bob = gw.client("bob").await;
    let sa = alice.new_session().await;
    assert_eq!(
        alice.prompt(&sa, "alice's secret plan").await["result"]["stopReason"],
        "end_turn"
    );
    let made_up = "00000000000040008000000000000000";
    let methods: [(&str, Value); 9] = [
        ("session/prompt", json!({"prompt": [{"type": "text", "text": "x"}]})),
        ("session/load", json!({"mcpServers": []})),
        ("session/resume", json!({"mcpServers": []})),
        ("session/close", json!({})),
        ("session/delete", json!({})),
        ("session/set_mode", json!({"modeId": "x"})),
        ("session/set_config_option", json!({"configId": "x", "value": "y"})),
        ("session/set_model", json!({"modelId": "x"})),
        ("_vendor/inspect", json!({})),
    ];
    for (method, extra) in methods {
        let with = |sid: &str| {
            let mut p = extra.clone();
            p["sessionId"] = json!(sid);
            p
        };
        let foreign = bob.request(method, with(&sa)).await;
        let unknown = bob.request(method, with(made_up)).await;
        assert_eq!(foreign["error"]["code"], -32002, "{method}: {foreign}");
        assert_eq!(
            without_id(foreign),
            without_id(unknown),
            "{method}: foreign and unknown ids must be indistinguishable"
        );
    }
    assert!(
        bob.inbox.is_empty(),
        "bob received something of alice's: {:?}",
        bob.inbox
    );
    // session/cancel is a notification: it must not reach alice's agent. Her next prompt is unaffected.
    bob.send(json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sa}}))
        .await;
    assert_eq!(
        alice.prompt(&sa, "still mine").await["result"]["stopReason"],
        "end_turn"
    );

    // REST: the same answer for foreign and made-up ids, and alice's session survives.
    let http = reqwest::Client::new();
    for id in [sa.as_str(), made_up] {
        let r = http
            .delete(gw.http_url(&format!("/api/sessions/{id}")))
            .bearer_auth(gw.token("bob"))
            .send()
            .await
            .expect("http");
        assert_eq!(r.status(), 404);
    }
    let r = alice
        .request("session/load", json!({"sessionId": sa, "mcpServers": []}))
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let r = http
        .delete(gw.http_url(&format!("/api/sessions/{sa}")))
        .bearer_auth(gw.token("alice"))
        .send()
        .await
        .expect("http");
    assert_eq!(r.status(), 204);
    let r = alice
        .request("session/load", json!({"sessionId": sa, "mcpServers": []}))
        .await;
    assert_eq!(r["error"]["code"], -32002, "deleted: {r}");
}

both_backends!(
    list_never_shows_another_users_sessions_sqlite,
    list_never_shows_another_users_sessions_postgres,
    list_isolation
);
async fn list_isolation(db: Db) {
    // One root both users may work in, so that a `cwd` filter matches sessions of both.
    let gw = TestGateway::start(db, |c| c.workspace_roots = vec!["/tmp".into()]).await;
    let mut alice = gw.client("alice").await;
    let mut bob = gw.client("bob").await;
    let mut alice_ids = HashSet::new();
    for i in 0..12 {
        let s = alice.new_session().await;
        alice.prompt(&s, &format!("shared words %_ {i}")).await;
        alice_ids.insert(s);
    }
    let bs = bob.new_session().await;
    bob.prompt(&bs, "shared words %_ bob").await;
    let filters = [
        json!({}),
        json!({"search": "shared"}),
        json!({"search": "%"}),
        json!({"search": "_"}),
        json!({"cwd": "/tmp"}),
        json!({"createdAfter": "2000-01-01T00:00:00Z"}),
        json!({"updatedAfter": "2000-01-01T00:00:00Z", "createdBefore": "2999-01-01T00:00:00Z"}),
        json!({"limit": 1}),
        json!({"limit": 1000}),
    ];
    for f in &filters {
        let r = bob.request("session/list", f.clone()).await;
        let ids: Vec<&str> = r["result"]["sessions"]
            .as_array()
            .expect("sessions")
            .iter()
            .filter_map(|s| s["sessionId"].as_str())
            .collect();
        assert_eq!(ids, vec![bs.as_str()], "filter {f}: {r}");
    }
    // Alice's cursor in bob's hands: refused, never a page of hers.
    let r = alice.request("session/list", json!({"limit": 5})).await;
    let cursor = r["result"]["nextCursor"].as_str().expect("more pages").to_string();
    let stolen = bob.request("session/list", json!({"limit": 5, "cursor": cursor})).await;
    assert_eq!(stolen["error"]["code"], -32602, "{stolen}");
    let forged = bob.request("session/list", json!({"cursor": "eyJ0IjowfQ.AAAA"})).await;
    assert_eq!(forged["error"]["code"], -32602);
    // And REST answers bob with his one session.
    let r: Value = reqwest::Client::new()
        .get(gw.http_url("/api/sessions?search=shared"))
        .bearer_auth(gw.token("bob"))
        .send()
        .await
        .expect("http")
        .json()
        .await
        .expect("json");
    assert_eq!(r["sessions"].as_array().map(Vec::len), Some(1), "{r}");
    assert_eq!(r["sessions"][0]["sessionId"], bs.as_str());
    assert_eq!(r["sessions"][0]["_meta"]["messageCount"], 1);
    assert_eq!(r["sessions"][0]["title"], "shared words %_ bob");
}

both_backends!(
    pagination_returns_each_session_once_while_sessions_are_added_sqlite,
    pagination_returns_each_session_once_while_sessions_are_added_postgres,
    pagination
);
async fn pagination(db: Db) {
    let gw = TestGateway::start(db, |_| {}).await;
    let mut c = gw.client("alice").await;
    let mut before = HashSet::new();
    for _ in 0..23 {
        before.insert(c.new_session().await);
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut last_updated = String::from("9999");
    loop {
        let mut params = json!({"limit": 5});
        if let Some(cur) = &cursor {
            params["cursor"] = json!(cur);
        }
        let r = c.request("session/list", params).await;
        for s in r["result"]["sessions"].as_array().expect("sessions") {
            let updated = s["updatedAt"].as_str().expect("updatedAt").to_string();
            assert!(updated <= last_updated, "newest first");
            last_updated = updated;
            seen.push(s["sessionId"].as_str().expect("id").to_string());
        }
        // New sessions arrive between pages; they sort before the cursor and are not repeated.
        c.new_session().await;
        match r["result"]["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    let unique: HashSet<String> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "no session twice");
    assert!(before.is_subset(&unique), "every session that existed is listed");
}

fn forge(claims: Value, alg: Algorithm, key: &EncodingKey) -> String {
    jsonwebtoken::encode(&Header::new(alg), &claims, key).expect("encode")
}

async fn status_of(gw: &TestGateway, token: &str) -> u16 {
    let acp = match Client::connect(&gw.ws_url(), token).await {
        Ok(_) => 101,
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => resp.status().as_u16(),
        Err(e) => panic!("unexpected error {e}"),
    };
    let rest = reqwest::Client::new()
        .get(gw.http_url("/api/sessions"))
        .bearer_auth(token)
        .send()
        .await
        .expect("http")
        .status()
        .as_u16();
    assert_eq!(acp == 101, rest == 200, "ACP and REST must agree on token {token}");
    rest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_jwt_failure_gets_401() {
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.jwt.issuer = Some("https://issuer.example".into());
        c.jwt.audience = Some("acp-gateway".into());
    })
    .await;
    let now = acp_gateway::infra::clock::now_secs();
    let key = EncodingKey::from_secret(common::SECRET.as_bytes());
    let good = json!({"sub": "alice", "exp": now + 600, "iss": "https://issuer.example", "aud": "acp-gateway"});
    assert_eq!(status_of(&gw, &forge(good.clone(), Algorithm::HS256, &key)).await, 200);
    let mut cases: Vec<(&str, String)> = Vec::new();
    let with = |k: &str, v: Value| {
        let mut c = good.clone();
        c[k] = v;
        c
    };
    let without = |k: &str| {
        let mut c = good.clone();
        c.as_object_mut().map(|o| o.remove(k));
        c
    };
    cases.push(("expired", forge(with("exp", json!(now - 120)), Algorithm::HS256, &key)));
    cases.push(("no exp", forge(without("exp"), Algorithm::HS256, &key)));
    cases.push(("no sub", forge(without("sub"), Algorithm::HS256, &key)));
    cases.push((
        "not yet valid",
        forge(with("nbf", json!(now + 600)), Algorithm::HS256, &key),
    ));
    cases.push((
        "wrong issuer",
        forge(with("iss", json!("https://evil.example")), Algorithm::HS256, &key),
    ));
    cases.push(("no issuer", forge(without("iss"), Algorithm::HS256, &key)));
    cases.push((
        "wrong audience",
        forge(with("aud", json!("other")), Algorithm::HS256, &key),
    ));
    cases.push((
        "wrong secret",
        forge(good.clone(), Algorithm::HS256, &EncodingKey::from_secret(b"guess")),
    ));
    cases.push(("other algorithm", forge(good.clone(), Algorithm::HS512, &key)));
    let b64 = |s: &str| base64_url(s.as_bytes());
    cases.push((
        "alg none",
        format!("{}.{}.", b64(r#"{"alg":"none","typ":"JWT"}"#), b64(&good.to_string())),
    ));
    cases.push(("garbage", "a.b.c".into()));
    for (what, token) in cases {
        assert_eq!(status_of(&gw, &token).await, 401, "{what}");
    }
}

fn base64_url(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn openssl(args: &[&str]) {
    let ok = std::process::Command::new("openssl")
        .args(args)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl runs")
        .success();
    assert!(ok, "openssl {args:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_keys_pin_their_algorithm() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = |n: &str| dir.path().join(n).to_string_lossy().into_owned();
    for (name, alg, genargs) in [
        (
            "rsa",
            Algorithm::RS256,
            vec!["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
        ),
        (
            "ec",
            Algorithm::ES256,
            vec!["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
        ),
        ("ed", Algorithm::EdDSA, vec!["genpkey", "-algorithm", "ED25519"]),
    ] {
        let (private, public) = (p(&format!("{name}.key")), p(&format!("{name}.pub")));
        let mut args = genargs.clone();
        args.extend(["-out", private.as_str()]);
        openssl(&args);
        openssl(&["pkey", "-in", &private, "-pubout", "-out", &public]);
        let public_path = public.clone();
        let gw = TestGateway::start(Db::Sqlite, move |c| {
            c.jwt.secret = None;
            c.jwt.public_key = Some(public_path.into());
            c.jwt.audience = Some("acp-gateway".into());
        })
        .await;
        let pem = std::fs::read(&private).expect("key");
        let key = match alg {
            Algorithm::RS256 => EncodingKey::from_rsa_pem(&pem),
            Algorithm::ES256 => EncodingKey::from_ec_pem(&pem),
            _ => EncodingKey::from_ed_pem(&pem),
        }
        .expect("private key");
        let claims = json!({"sub": "alice", "exp": acp_gateway::infra::clock::now_secs() + 600, "aud": "acp-gateway"});
        assert_eq!(status_of(&gw, &forge(claims.clone(), alg, &key)).await, 200, "{name}");
        // The identity provider's tokens for other applications are not ours.
        let mut other_app = claims.clone();
        other_app["aud"] = json!("other-app");
        assert_eq!(
            status_of(&gw, &forge(other_app, alg, &key)).await,
            401,
            "{name}: another audience"
        );
        let mut no_aud = claims.clone();
        no_aud.as_object_mut().map(|o| o.remove("aud"));
        assert_eq!(
            status_of(&gw, &forge(no_aud, alg, &key)).await,
            401,
            "{name}: no audience"
        );
        // The classic confusion attack: HS256 with the public key as the shared secret.
        let public_pem = std::fs::read(&public).expect("pub");
        let confused = forge(claims.clone(), Algorithm::HS256, &EncodingKey::from_secret(&public_pem));
        assert_eq!(
            status_of(&gw, &confused).await,
            401,
            "{name}: HS256 with the public key as secret"
        );
        assert_eq!(
            status_of(
                &gw,
                &forge(
                    claims,
                    Algorithm::HS256,
                    &EncodingKey::from_secret(common::SECRET.as_bytes())
                )
            )
            .await,
            401
        );
        gw.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_that_expires_ends_its_connection() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let short = gw.gw.identity.auth.mint("alice", 2).expect("mint");
    let mut c = Client::connect(&gw.ws_url(), &short).await.expect("connect");
    c.request("initialize", json!({"protocolVersion": 1})).await;
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if c.recv_raw().await.is_none() {
                return;
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "connection closed when the token expired");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_asks_for_a_token_before_it_reads_the_query_string() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    // `agent` twice: a query string the route cannot read.
    let url = gw.http_url("/acp?agent=default&agent=other");
    let upgrade = |req: reqwest::RequestBuilder| {
        req.header("connection", "upgrade")
            .header("upgrade", "websocket")
            .header("sec-websocket-version", "13")
            .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
    };
    let http = reqwest::Client::new();
    let res = upgrade(http.get(&url)).send().await.expect("request");
    assert_eq!(res.status(), 401, "no token");
    let res = upgrade(http.get(&url).bearer_auth(gw.token("alice")))
        .send()
        .await
        .expect("request");
    assert_eq!(res.status(), 400, "a token, and a query string it cannot read");
    let body: Value = res.json().await.expect("JSON");
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains("query string")),
        "{body}"
    );
}
