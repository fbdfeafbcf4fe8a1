//! Team sign-in through a real OpenID provider (`tests/oidc/provider.mjs`: `oidc-provider` from
//! npm, on loopback) against a real gateway: the authorization code flow through the provider's
//! own login pages, the group policy (a person outside it is refused, named; one removed from it
//! mid-session loses access and their WebSocket is closed with 1008), sign-out, the provider's
//! tokens on the API (key rotation, a removed key, algorithm confusion, wrong claims, a flood of
//! unknown keys), and the provider down.

use crate::common;

use std::net::SocketAddr;

use acp_gateway::infra::config::Config;
use common::oidc_provider::{ClientReg, Provider, browser, walk};
use common::{Client, Db, TestGateway, WAIT};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

const CLIENT_ID: &str = "acp-gateway";
const CLIENT_SECRET: &str = "a-client-secret-for-the-test-provider";

/// A port for the gateway, known before it starts (the provider must know the redirect URL).
/// A free address for the gateway, known before it starts (the provider is told its callback
/// first, and takes seconds to start). Below the kernel's ephemeral range, so that no other
/// test's connection or port-0 listener takes it meanwhile.
fn free_addr() -> SocketAddr {
    loop {
        let port = 20_000 + rand::random::<u16>() % 12_000;
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return l.local_addr().expect("addr");
        }
    }
}

struct Setup {
    provider: Provider,
    gw: TestGateway,
}

async fn setup(tweak: impl FnOnce(&mut Config)) -> Setup {
    setup_with(|_, c| tweak(c)).await
}

/// [`setup`], with the running provider at hand for the gateway's settings.
async fn setup_with(tweak: impl FnOnce(&Provider, &mut Config)) -> Setup {
    setup_full(&[], tweak).await
}

/// [`setup_with`], the provider started with `env` (`provider.mjs`'s settings).
async fn setup_full(env: &[(&str, &str)], tweak: impl FnOnce(&Provider, &mut Config)) -> Setup {
    setup_on(Db::Sqlite, env, tweak).await
}

/// [`setup_full`] on `db`.
async fn setup_on(db: Db, env: &[(&str, &str)], tweak: impl FnOnce(&Provider, &mut Config)) -> Setup {
    let addr = free_addr();
    let reg = ClientReg {
        id: CLIENT_ID,
        secret: CLIENT_SECRET,
        redirect: format!("http://{addr}/auth/oidc/callback"),
    };
    let provider = Provider::start_with(&reg, &format!("http://{addr}/"), env).await;
    let issuer = provider.issuer.clone();
    let gw = TestGateway::start(db, |c| {
        c.listen = addr;
        c.oidc.issuer = Some(issuer);
        c.oidc.client_id = Some(CLIENT_ID.into());
        c.oidc.client_secret = Some(CLIENT_SECRET.to_string().into());
        c.oidc.redirect_url = Some(reg.redirect.clone());
        c.oidc.label = Some("Test IdP".into());
        c.oidc.scopes = ["openid", "profile", "email", "groups"].map(String::from).to_vec();
        c.oidc.allowed_groups = vec!["devs".into()];
        c.oidc.recheck_secs = 1;
        c.oidc.jwks_refetch_secs = 30;
        tweak(&provider, c);
    })
    .await;
    Setup { provider, gw }
}

/// Signs `login` in through the provider's pages; the callback's response.
async fn sign_in(s: &Setup, http: &reqwest::Client, login: &str) -> (String, reqwest::Response) {
    let res = http.get(s.gw.http_url("/auth/oidc/login")).send().await.expect("login");
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    let to_provider = res.headers()[reqwest::header::LOCATION]
        .to_str()
        .expect("location")
        .to_string();
    assert!(to_provider.starts_with(&s.provider.issuer), "{to_provider}");
    assert!(
        to_provider.contains("code_challenge_method=S256") && to_provider.contains("nonce="),
        "{to_provider}"
    );
    let callback = walk(http, &to_provider, &s.gw.http_url("/auth/oidc/callback"), login).await;
    let res = http.get(&callback).send().await.expect("callback");
    (callback, res)
}

/// The gateway's cookie token a callback response sets.
fn cookie_token(res: &reqwest::Response) -> String {
    res.headers()
        .get_all(reqwest::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|c| c.strip_prefix("acp_gateway_token="))
        .and_then(|c| c.split(';').next())
        .expect("the gateway's cookie")
        .to_string()
}

async fn me(s: &Setup, token: &str) -> reqwest::Response {
    reqwest::Client::new()
        .get(s.gw.http_url("/api/me"))
        .bearer_auth(token)
        .send()
        .await
        .expect("me")
}

/// Reads until the close frame; its code.
async fn close_code(client: &mut Client) -> Option<u16> {
    loop {
        match client.recv_frame().await? {
            Message::Close(frame) => return frame.map(|f| u16::from(f.code)),
            _ => continue,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_member_signs_in_and_loses_access_when_removed_from_the_group() {
    let s = setup(|_| {}).await;
    let http = browser();
    let (callback, res) = sign_in(&s, &http, "alice").await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER, "{:?}", res.text().await);
    let token = cookie_token(&res);
    // The browser's cookie works on the API, and names the user by the configured claim.
    let who: Value = http
        .get(s.gw.http_url("/api/me"))
        .send()
        .await
        .expect("me")
        .json()
        .await
        .expect("json");
    assert_eq!(who["user"], "alice", "{who}");
    // The callback once only: a replay is refused.
    let replay = http.get(&callback).send().await.expect("replay");
    assert_eq!(replay.status(), StatusCode::BAD_REQUEST);
    // The provider's tokens stay on the server, sealed: nothing of them in the cookie.
    assert!(token.len() < 600, "the cookie is the gateway's own short token");

    let mut ws = Client::connect(&s.gw.ws_url(), &token).await.expect("connect");
    let r = ws.request("initialize", json!({"protocolVersion": 1})).await;
    assert!(r.get("result").is_some(), "{r}");

    // Removed from the allowed group: the next check ends the sign-in, on the socket too.
    s.provider
        .control("groups", json!({"user": "alice", "groups": ["sales"]}))
        .await;
    let code = tokio::time::timeout(WAIT, close_code(&mut ws))
        .await
        .expect("closed in time");
    assert_eq!(code, Some(1008));
    assert_eq!(me(&s, &token).await.status(), StatusCode::UNAUTHORIZED);
    s.gw.stop().await;
}

/// An issuer that ends in `/` (Auth0's form), written as the provider writes it: discovery, the
/// sign-in and the provider's own tokens on the API all work (the slash was cut off before, and
/// discovery refused the provider's `issuer` as not the one configured).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_issuer_that_ends_in_a_slash_signs_people_in() {
    let s = setup_full(&[("OIDC_ISSUER_TRAILING_SLASH", "1")], |_, _| {}).await;
    assert!(s.provider.issuer.ends_with('/'), "{}", s.provider.issuer);
    let http = browser();
    let (_, res) = sign_in(&s, &http, "alice").await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER, "{:?}", res.text().await);
    let token = cookie_token(&res);
    assert_eq!(me(&s, &token).await.status(), StatusCode::OK);
    let bearer = provider_token(&s.provider, &s.provider.kid, claims(&s, "alice", |_| {}));
    assert_eq!(
        me(&s, &bearer).await.status(),
        StatusCode::OK,
        "a provider token on the API"
    );
    s.gw.stop().await;
}

/// A provider that keeps the scope's claims out of the ID token (`oidc-provider`'s default when
/// it issues an access token): the e-mail address that names users and the groups the rules read
/// come from its userinfo endpoint, at sign-in and at each check of the sign-in after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_kept_out_of_the_id_token_are_read_at_userinfo() {
    let s = setup_full(&[("OIDC_CONFORM_ID_TOKEN_CLAIMS", "1")], |_, c| {
        c.oidc.user_claim = "email".into();
    })
    .await;
    // Only this test's provider sends anyone to userinfo.
    let userinfo_answers = || {
        acp_gateway::infra::telemetry::render_metrics()
            .lines()
            .filter(|l| {
                l.starts_with("acp_gateway_oidc_provider_requests_total")
                    && l.contains(r#"what="userinfo""#)
                    && l.contains(r#"outcome="ok""#)
            })
            .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let before = userinfo_answers();
    let http = browser();
    let (_, res) = sign_in(&s, &http, "alice").await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER, "{:?}", res.text().await);
    let token = cookie_token(&res);
    let who: Value = me(&s, &token).await.json().await.expect("json");
    assert_eq!(who["user"], "alice@example.com", "{who}");
    assert!(userinfo_answers() > before, "asked at sign-in");
    // Checked again (every second here, by a refresh whose ID token has no groups either):
    // still in, read at userinfo again.
    let after_sign_in = userinfo_answers();
    common::wait_until(WAIT, || userinfo_answers() > after_sign_in)
        .await
        .expect("the sign-in was checked again");
    assert_eq!(me(&s, &token).await.status(), StatusCode::OK, "still signed in");
    // Outside the allowed group, by what userinfo says: refused, by name.
    let (_, res) = sign_in(&s, &browser(), "carol").await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    let page = res.text().await.expect("page");
    assert!(page.contains("yours: sales"), "{page}");
    s.gw.stop().await;
}

/// A code from another browser's login (code injection) is refused: its state is not this
/// browser's, and with this browser's state its PKCE verifier (and nonce) do not match.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_code_from_another_login_is_refused() {
    let s = setup(|_| {}).await;
    let start = |http: reqwest::Client| {
        let url = s.gw.http_url("/auth/oidc/login");
        async move {
            let res = http.get(url).send().await.expect("login");
            res.headers()[reqwest::header::LOCATION]
                .to_str()
                .expect("location")
                .to_string()
        }
    };
    let (attacker, victim) = (browser(), browser());
    let attacker_url = start(attacker.clone()).await;
    let attacker_callback = walk(&attacker, &attacker_url, &s.gw.http_url("/auth/oidc/callback"), "carol").await;
    let victim_url = start(victim.clone()).await;
    let param = |url: &str, name: &str| {
        reqwest::Url::parse(url)
            .expect("url")
            .query_pairs()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.to_string())
            .expect("param")
    };
    // The attacker's whole callback in the victim's browser: not a login it started.
    let res = victim.get(&attacker_callback).send().await.expect("callback");
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    // The attacker's code under the victim's own state: the provider refuses the code for the
    // victim's PKCE verifier.
    let forged = format!(
        "{}?code={}&state={}",
        s.gw.http_url("/auth/oidc/callback"),
        param(&attacker_callback, "code"),
        param(&victim_url, "state")
    );
    let res = victim.get(&forged).send().await.expect("callback");
    assert!(
        res.status().is_client_error() || res.status().is_server_error(),
        "{}",
        res.status()
    );
    assert_eq!(
        victim.get(s.gw.http_url("/api/me")).send().await.expect("me").status(),
        StatusCode::UNAUTHORIZED
    );
    s.gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn someone_outside_the_allowed_groups_is_refused_by_name() {
    let s = setup(|_| {}).await;
    let http = browser();
    let (_, res) = sign_in(&s, &http, "carol").await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    let page = res.text().await.expect("page");
    assert!(
        page.contains("You signed in as carol") && page.contains("yours: sales"),
        "{page}"
    );
    assert_eq!(
        http.get(s.gw.http_url("/api/me")).send().await.expect("me").status(),
        StatusCode::UNAUTHORIZED
    );
    // A crafted link with the provider's error words shows them only for a login this browser
    // started.
    let crafted =
        s.gw.http_url("/auth/oidc/callback?error=access_denied&error_description=Call%20+1-555-PHISH");
    let res = browser().get(&crafted).send().await.expect("callback");
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert!(!res.text().await.expect("page").contains("PHISH"));
    s.gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_out_ends_the_sign_in_and_sends_the_browser_to_the_provider() {
    let s = setup(|_| {}).await;
    let http = browser();
    let (_, res) = sign_in(&s, &http, "bob").await;
    let token = cookie_token(&res);
    let origin = format!("http://{}", s.gw.addr);
    let res = http
        .post(s.gw.http_url("/auth/logout"))
        .header("origin", &origin)
        .send()
        .await
        .expect("logout");
    assert_eq!(res.status(), StatusCode::OK);
    let body: Value = res.json().await.expect("json");
    let redirect = body["redirect"].as_str().expect("redirect");
    assert!(
        redirect.starts_with(&format!("{}/session/end?", s.provider.issuer))
            && redirect.contains(&format!("client_id={CLIENT_ID}"))
            && !redirect.contains("id_token_hint"),
        "{redirect}"
    );
    // The gateway's token of that sign-in no longer works anywhere, even held elsewhere.
    assert_eq!(me(&s, &token).await.status(), StatusCode::UNAUTHORIZED);
    s.gw.stop().await;
}

/// A token as the provider would sign it (with its real key), for the API.
fn provider_token(provider: &Provider, kid: &str, claims: Value) -> String {
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some(kid.to_string());
    let key = EncodingKey::from_rsa_pem(&provider.private_pem(kid)).expect("key");
    jsonwebtoken::encode(&header, &claims, &key).expect("sign")
}

fn claims(s: &Setup, sub: &str, tweak: impl FnOnce(&mut Value)) -> Value {
    let now = acp_gateway::infra::clock::now_secs();
    let mut c = json!({
        "iss": s.provider.issuer, "aud": CLIENT_ID, "sub": sub, "groups": ["devs"],
        "iat": now, "exp": now + 300,
    });
    tweak(&mut c);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_tokens_on_the_api_are_verified_against_its_keys() {
    let s = setup(|_| {}).await;
    let kid = s.provider.control("rotate", json!({"drop_old": false})).await["kid"]
        .as_str()
        .expect("kid")
        .to_string();
    let ok = provider_token(&s.provider, &kid, claims(&s, "alice", |_| {}));
    let res = me(&s, &ok).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.json::<Value>().await.expect("json")["user"], "alice");

    // Wrong audience, issuer, expired, outside the groups: refused.
    for (what, c) in [
        ("audience", claims(&s, "alice", |c| c["aud"] = json!("another-app"))),
        (
            "issuer",
            claims(&s, "alice", |c| c["iss"] = json!("http://127.0.0.1:1")),
        ),
        (
            "expired",
            claims(&s, "alice", |c| {
                c["exp"] = json!(acp_gateway::infra::clock::now_secs() - 600)
            }),
        ),
        ("group", claims(&s, "carol", |c| c["groups"] = json!(["sales"]))),
        (
            "no audience",
            claims(&s, "alice", |c| {
                c.as_object_mut().expect("object").remove("aud");
            }),
        ),
    ] {
        let t = provider_token(&s.provider, &kid, c);
        assert_eq!(me(&s, &t).await.status(), StatusCode::UNAUTHORIZED, "{what}");
    }
    // Algorithm confusion: HS256 with the provider's public key as the secret, and `none`.
    let public = s.provider.public_pem(&kid);
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some(kid.clone());
    let forged = jsonwebtoken::encode(
        &header,
        &claims(&s, "alice", |_| {}),
        &EncodingKey::from_secret(public.as_bytes()),
    )
    .expect("sign");
    assert_eq!(
        me(&s, &forged).await.status(),
        StatusCode::UNAUTHORIZED,
        "HS256 with the public key"
    );
    let body = ok.split('.').nth(1).expect("payload");
    let none = format!(
        "{}.{body}.",
        base64_url(&json!({"alg": "none", "kid": kid}).to_string())
    );
    assert_eq!(me(&s, &none).await.status(), StatusCode::UNAUTHORIZED, "alg none");

    // A flood of unknown kids costs the provider at most one fetch (refetch interval 30 s).
    let before = s.provider.jwks_requests().await;
    for i in 0..40 {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some(format!("random-{i}"));
        let key = EncodingKey::from_rsa_pem(&s.provider.private_pem(&kid)).expect("key");
        let t = jsonwebtoken::encode(&header, &claims(&s, "alice", |_| {}), &key).expect("sign");
        assert_eq!(me(&s, &t).await.status(), StatusCode::UNAUTHORIZED);
    }
    let fetched = s.provider.jwks_requests().await - before;
    assert!(fetched <= 1, "{fetched} JWKS fetches for 40 unknown kids");
    s.gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_key_is_taken_and_a_removed_one_refused_once_the_cache_expires() {
    let s = setup(|c| c.oidc.jwks_refetch_secs = 1).await;
    s.provider.control("jwks-cache", json!({"max_age": 1})).await;
    let old = s.provider.control("rotate", json!({"drop_old": false})).await["kid"]
        .as_str()
        .expect("kid")
        .to_string();
    let old_token = provider_token(&s.provider, &old, claims(&s, "alice", |_| {}));
    assert_eq!(me(&s, &old_token).await.status(), StatusCode::OK);
    // A new key: a token naming it is taken at once (an unknown kid fetches the set again).
    let new = s.provider.control("rotate", json!({"drop_old": true})).await["kid"]
        .as_str()
        .expect("kid")
        .to_string();
    let new_token = provider_token(&s.provider, &new, claims(&s, "alice", |_| {}));
    until("the new key to be taken", || async {
        me(&s, &new_token).await.status() == StatusCode::OK
    })
    .await;
    // The removed key is refused once the cached set has expired (max-age 1 s).
    until("the removed key to be refused", || async {
        me(&s, &old_token).await.status() == StatusCode::UNAUTHORIZED
    })
    .await;
    s.gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_provider_down_signed_in_people_keep_working() {
    let s = setup(|_| {}).await;
    let http = browser();
    let (_, res) = sign_in(&s, &http, "alice").await;
    let token = cookie_token(&res);
    let kid = s.provider.control("rotate", json!({"drop_old": false})).await["kid"]
        .as_str()
        .expect("kid")
        .to_string();
    let api_token = provider_token(&s.provider, &kid, claims(&s, "alice", |_| {}));
    assert_eq!(
        me(&s, &api_token).await.status(),
        StatusCode::OK,
        "its key is now cached"
    );
    let pem = s.provider.private_pem(&kid);
    let unknown_kid = {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some("a-key-after-the-outage".into());
        jsonwebtoken::encode(
            &header,
            &claims(&s, "alice", |_| {}),
            &EncodingKey::from_rsa_pem(&pem).expect("key"),
        )
        .expect("sign")
    };
    let Setup { provider, gw } = s;
    provider.stop().await;
    let me = |t: String| {
        let url = gw.http_url("/api/me");
        async move {
            reqwest::Client::new()
                .get(url)
                .bearer_auth(t)
                .send()
                .await
                .expect("me")
                .status()
        }
    };
    // The next check of alice's sign-in (every second here) cannot reach the provider:
    // /readyz stays 200 and says so, and she is not signed out for it.
    until("/readyz to name the provider degraded", || async {
        oidc_check(&gw).await.starts_with("degraded:")
    })
    .await;
    // People signed in, and tokens whose keys are cached, keep working.
    assert_eq!(me(token.clone()).await, StatusCode::OK, "signed-in people keep working");
    assert_eq!(me(api_token.clone()).await, StatusCode::OK, "cached keys keep working");
    // A key the gateway does not hold cannot be had: refused.
    assert_eq!(me(unknown_kid).await, StatusCode::UNAUTHORIZED);
    // A new login gets a page that says so.
    let res = http
        .get(gw.http_url("/auth/oidc/login"))
        .header("accept", "text/html")
        .send()
        .await
        .expect("login");
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    let page = res.text().await.expect("page");
    assert!(
        page.contains("cannot be reached") && page.contains("already signed in are not affected"),
        "{page}"
    );
    let metrics = acp_gateway::infra::telemetry::render_metrics();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("acp_gateway_oidc_provider_requests_total")
                && l.contains("outcome=\"error\"")
                && !l.ends_with(" 0")),
        "the outage is counted"
    );
    gw.stop().await;
}

/// With nobody signed in and no token on the way, an outage still shows: `/readyz` asks the
/// provider itself (a minute of rechecks apart, here and in production alike).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_notices_the_provider_going_away_by_itself() {
    let s = setup(|c| c.oidc.recheck_secs = 3600).await;
    let Setup { provider, gw } = s;
    assert_eq!(oidc_check(&gw).await, "ok");
    provider.stop().await;
    until("/readyz to name the provider degraded", || async {
        oidc_check(&gw).await.starts_with("degraded:")
    })
    .await;
    gw.stop().await;
}

/// `jwt.jwks_url` alone (no `[oidc]`): the provider's tokens are verified against that key set,
/// and `/readyz` names it when it cannot be fetched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_set_url_alone_is_checked_by_readyz() {
    let reg = ClientReg {
        id: CLIENT_ID,
        secret: CLIENT_SECRET,
        redirect: "http://127.0.0.1:9/cb".into(),
    };
    let provider = Provider::start(&reg, "http://127.0.0.1:9/").await;
    let discovery: Value = reqwest::get(format!("{}/.well-known/openid-configuration", provider.issuer))
        .await
        .expect("discovery")
        .json()
        .await
        .expect("json");
    let jwks_url = discovery["jwks_uri"].as_str().expect("jwks_uri").to_string();
    let issuer = provider.issuer.clone();
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.jwt.jwks_url = Some(jwks_url);
        c.jwt.issuer = Some(issuer);
        c.jwt.audience = Some(CLIENT_ID.into());
    })
    .await;
    let now = acp_gateway::infra::clock::now_secs();
    let claims = json!({"iss": provider.issuer, "aud": CLIENT_ID, "sub": "alice", "iat": now, "exp": now + 300});
    let token = provider_token(&provider, &provider.kid, claims);
    let me = reqwest::Client::new()
        .get(gw.http_url("/api/me"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("me");
    assert_eq!(me.status(), StatusCode::OK, "a provider token on the API");

    assert_eq!(oidc_check(&gw).await, "ok");
    provider.stop().await;
    until("/readyz to name the key set", || async {
        let check = oidc_check(&gw).await;
        check.starts_with("degraded:") && check.contains("/jwks")
    })
    .await;
    gw.stop().await;
}

/// `/readyz`'s `oidc` check (it must answer `200` whatever the provider does).
async fn oidc_check(gw: &TestGateway) -> String {
    let ready = reqwest::get(gw.http_url("/readyz")).await.expect("readyz");
    assert_eq!(ready.status(), StatusCode::OK);
    let body: Value = ready.json().await.expect("json");
    body["checks"]["oidc"].as_str().unwrap_or_default().to_string()
}

/// Asks `cond` until it holds (every 100 ms, at most [`WAIT`]).
async fn until<F: std::future::Future<Output = bool>>(what: &str, cond: impl Fn() -> F) {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
    loop {
        tick.tick().await;
        if cond().await {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
    }
}

/// With a PEM key (which only verifies) the gateway still signs sign-in cookies (with a key derived
/// from its secrets key), and a token under the PEM key that carries the gateway's own claim names
/// neither a sign-in nor an admin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pem_key_keeps_working_beside_the_provider() {
    let s = setup_with(|provider, c| {
        // The provider's first key doubles as the gateway's PEM key (it signs the tokens below).
        let pem_file = provider.keys_dir.path().join("gateway-public.pem");
        std::fs::write(&pem_file, provider.public_pem(&provider.kid)).expect("pem");
        c.jwt.secret = None;
        c.jwt.public_key = Some(pem_file);
        c.jwt.audience = Some("pem-audience".into());
        c.admin.groups = vec!["devs".into()];
        c.oidc.allowed_groups = Vec::new();
        c.oidc.recheck_secs = 900;
    })
    .await;
    let kid = s.provider.kid.clone();
    let http = browser();
    let (_, res) = sign_in(&s, &http, "alice").await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    let cookie = cookie_token(&res);
    let who: Value = me(&s, &cookie).await.json().await.expect("json");
    assert_eq!(
        (who["user"].clone(), who["admin"].clone()),
        (json!("alice"), json!(true)),
        "{who}"
    );
    // A PEM-signed token (no kid, the gateway's audience) works as before, and its `acp_sid` and
    // `acp_adm` claims mean nothing.
    let now = acp_gateway::infra::clock::now_secs();
    let key = EncodingKey::from_rsa_pem(&s.provider.private_pem(&kid)).expect("key");
    let pem_token = jsonwebtoken::encode(
        &Header::new(Algorithm::RS256),
        &json!({"sub": "mallory", "aud": "pem-audience", "exp": now + 300, "acp_sid": "forged", "acp_adm": true}),
        &key,
    )
    .expect("sign");
    let res = me(&s, &pem_token).await;
    assert_eq!(res.status(), StatusCode::OK);
    let who: Value = res.json().await.expect("json");
    assert_eq!(
        (who["user"].clone(), who["admin"].clone()),
        (json!("mallory"), json!(false)),
        "{who}"
    );
    s.gw.stop().await;
}

fn base64_url(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
}

/// Named by e-mail address (`user_claim = "email"`), only an address the provider verified names
/// anyone, and a name belongs to the provider account that first signed in with it: an account
/// that later carries the same address (typed into its profile unverified, or verified after it
/// was reused) is refused by name, in the browser and on the API alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_names_only_its_verified_first_account() {
    an_address_names_only_its_verified_first_account_on(Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_names_only_its_verified_first_account_postgres() {
    an_address_names_only_its_verified_first_account_on(Db::Postgres).await;
}

async fn an_address_names_only_its_verified_first_account_on(db: Db) {
    let s = setup_on(db, &[], |_, c| {
        c.oidc.user_claim = "email".into();
        c.oidc.allowed_groups = Vec::new();
    })
    .await;
    // Carol types alice's address into her profile; the provider does not verify it.
    s.provider
        .control(
            "email",
            json!({"user": "carol", "email": "alice@example.com", "email_verified": false}),
        )
        .await;
    let (_, res) = sign_in(&s, &browser(), "carol").await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    let page = res.text().await.expect("page");
    assert!(
        page.contains("You signed in as alice@example.com") && page.contains("email_verified"),
        "{page}"
    );
    // Alice herself: in, and her address is now bound to her account.
    let (_, res) = sign_in(&s, &browser(), "alice").await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER, "{:?}", res.text().await);
    let who: Value = me(&s, &cookie_token(&res)).await.json().await.expect("json");
    assert_eq!(who["user"], "alice@example.com");
    // The provider now verifies carol's copy of it (an address reused, a provider that trusts a
    // social login's address): still not alice.
    s.provider
        .control(
            "email",
            json!({"user": "carol", "email": "alice@example.com", "email_verified": true}),
        )
        .await;
    let http = browser();
    let (_, res) = sign_in(&s, &http, "carol").await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    let page = res.text().await.expect("page");
    assert!(page.contains("belongs to another account"), "{page}");
    assert_eq!(
        http.get(s.gw.http_url("/api/me")).send().await.expect("me").status(),
        StatusCode::UNAUTHORIZED
    );

    // The provider's tokens on the API go through the same rules.
    let kid = s.provider.kid.clone();
    let token = |sub: &str, verified: Value| {
        provider_token(
            &s.provider,
            &kid,
            claims(&s, sub, |c| {
                c["email"] = json!("alice@example.com");
                c["email_verified"] = verified;
            }),
        )
    };
    let res = me(&s, &token("alice", json!(true))).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.json::<Value>().await.expect("json")["user"], "alice@example.com");
    for (what, t) in [
        ("unverified", token("alice", json!(false))),
        ("no email_verified", token("alice", Value::Null)),
        ("another account", token("carol", json!(true))),
    ] {
        assert_eq!(me(&s, &t).await.status(), StatusCode::UNAUTHORIZED, "{what}");
    }
    s.gw.stop().await;
}

/// A user of the gateway's own tokens (`oidc.local_users`, default `local`) is never a provider
/// account's, whatever its claims say; the gateway's own token for that name keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_account_never_takes_a_local_users_name() {
    let s = setup(|c| c.oidc.local_users = vec!["local".into(), "bob".into()]).await;
    let (_, res) = sign_in(&s, &browser(), "bob").await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    let page = res.text().await.expect("page");
    assert!(page.contains("oidc.local_users"), "{page}");
    let local = provider_token(&s.provider, &s.provider.kid, claims(&s, "local", |_| {}));
    assert_eq!(me(&s, &local).await.status(), StatusCode::UNAUTHORIZED);
    let own = s.gw.token("local");
    let res = me(&s, &own).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.json::<Value>().await.expect("json")["user"], "local");
    s.gw.stop().await;
}

/// One forged login, as an attacker makes them: a fresh login (its state cookie and the `state` in
/// the provider URL), then its callback with a made-up code. The callback's status.
async fn forged_login(s: &Setup, http: &reqwest::Client) -> StatusCode {
    let res = http.get(s.gw.http_url("/auth/oidc/login")).send().await.expect("login");
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    let location = res.headers()[reqwest::header::LOCATION].to_str().expect("location");
    let state = reqwest::Url::parse(location)
        .expect("url")
        .query_pairs()
        .find(|(k, _)| k == "state")
        .map(|(_, v)| v.to_string())
        .expect("state");
    let cookie = res
        .headers()
        .get_all(reqwest::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|c| c.starts_with("acp_gateway_oidc="))
        .and_then(|c| c.split(';').next())
        .expect("state cookie")
        .to_string();
    let mut callback = reqwest::Url::parse(&s.gw.http_url("/auth/oidc/callback")).expect("url");
    callback
        .query_pairs_mut()
        .append_pair("code", "forged")
        .append_pair("state", &state);
    http.get(callback)
        .header(reqwest::header::COOKIE, cookie)
        .send()
        .await
        .expect("callback")
        .status()
}

/// A flood of forged login/callback pairs (each with its own fresh state cookie, as anyone can
/// get them) fills the memory of used `state`s, here lowered to 100 (default 50,000): a real
/// sign-in still gets in, and a replayed callback is still refused. The gateway used to refuse
/// every callback once the memory was full, for 10 minutes, for everyone.
/// `OIDC_FLOOD_PAIRS=60000` floods the default memory (50,000) instead (minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_forged_callbacks_locks_nobody_out() {
    let full = std::env::var("OIDC_FLOOD_PAIRS")
        .ok()
        .and_then(|n| n.parse::<usize>().ok());
    let pairs = full.unwrap_or(300);
    let s = setup(|c| {
        if full.is_none() {
            c.oidc.used_states_max = 100;
        }
        c.limits.auth_requests_per_minute_per_ip = 0;
    })
    .await;
    let attacker = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let started = std::time::Instant::now();
    let statuses = futures_util::future::join_all((0..8).map(|_| {
        let (s, attacker) = (&s, attacker.clone());
        async move {
            let mut statuses = Vec::new();
            for _ in 0..pairs.div_ceil(8) {
                statuses.push(forged_login(s, &attacker).await);
            }
            statuses
        }
    }))
    .await;
    let statuses: Vec<StatusCode> = statuses.into_iter().flatten().collect();
    eprintln!(
        "{} forged login/callback pairs in {:?}",
        statuses.len(),
        started.elapsed()
    );
    // Each was taken to the provider, which refused the made-up code.
    assert!(statuses.iter().all(|s| *s == StatusCode::BAD_GATEWAY), "{statuses:?}");
    let http = browser();
    let (callback, res) = sign_in(&s, &http, "alice").await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER, "{:?}", res.text().await);
    assert_eq!(
        http.get(&callback).send().await.expect("replay").status(),
        StatusCode::BAD_REQUEST,
        "a replay is still refused"
    );
    s.gw.stop().await;
}
