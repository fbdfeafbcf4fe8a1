//! The front door: how a browser signs in (one-time codes, the sign-in form), the cookie it gets,
//! which requests may ride that cookie, where `?access_token=` is accepted, the headers every
//! response carries, which keys the gateway refuses to start with, and the modes of its files.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use acp_gateway::app::Application;
use common::{Client, Db, TestGateway};
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// An HTTP client that shows us redirects instead of following them, and keeps no cookies.
fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

/// Every `Set-Cookie` of a response.
fn set_cookies(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().expect("ascii").to_string())
        .collect()
}

/// The value of cookie `name` set by a response.
fn cookie_value(headers: &HeaderMap, name: &str) -> Option<String> {
    set_cookies(headers).iter().find_map(|c| {
        let (n, rest) = c.split_once('=')?;
        (n == name).then(|| rest.split(';').next().unwrap_or_default().to_string())
    })
}

/// The attributes of a `Set-Cookie` value, lower-cased, without the name=value pair.
fn attributes(set_cookie: &str) -> Vec<String> {
    set_cookie
        .split(';')
        .skip(1)
        .map(|a| a.trim().to_ascii_lowercase())
        .collect()
}

/// `GET /api/me` with this `Cookie` header (and extra headers): status and body.
async fn me_with_cookie(gw: &TestGateway, cookie: &str, extra: &[(&str, &str)]) -> (StatusCode, Value) {
    let mut req = http().get(gw.http_url("/api/me")).header("cookie", cookie);
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    let res = req.send().await.expect("me");
    let status = res.status();
    (status, res.json().await.unwrap_or(Value::Null))
}

/// `POST /auth/login` with the sign-in form's body and these headers.
async fn post_login(gw: &TestGateway, token: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = http()
        .post(gw.http_url("/auth/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={token}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.expect("post login")
}

/// A WebSocket upgrade on `/acp` (path and query given) with these headers: 101, or the refusal's status.
async fn upgrade_status(gw: &TestGateway, path_and_query: &str, headers: &[(&str, &str)]) -> u16 {
    let mut req = format!("ws://{}{path_and_query}", gw.addr)
        .into_client_request()
        .expect("request");
    for (k, v) in headers {
        let name = tokio_tungstenite::tungstenite::http::HeaderName::from_bytes(k.as_bytes()).expect("name");
        req.headers_mut().insert(name, v.parse().expect("header value"));
    }
    match Client::connect_request(req).await {
        Ok(c) => {
            c.close().await;
            101
        }
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => resp.status().as_u16(),
        Err(e) => panic!("unexpected error {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_code_signs_in_once() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let code = gw.gw.identity.login_codes.issue("alice");
    let url = gw.http_url(&format!("/auth/login?code={code}"));

    let res = http().get(&url).send().await.expect("login");
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert_eq!(res.headers()["location"], "/");
    assert_eq!(res.headers()["cache-control"], "no-store");
    let token = cookie_value(res.headers(), "acp_gateway_token").expect("the cookie");
    let who = gw.gw.identity.auth.verify(&token).expect("the cookie holds a JWT");
    assert_eq!(who.user, "alice");
    let ttl = gw.gw.config.jwt.default_ttl_secs;
    assert!(
        who.expires_at + 60 >= acp_gateway::infra::clock::now_secs() + ttl,
        "minted with jwt.default_ttl_secs"
    );
    let (status, me) = me_with_cookie(&gw, &format!("acp_gateway_token={token}"), &[]).await;
    assert_eq!((status, me["user"].as_str()), (StatusCode::OK, Some("alice")));

    let again = http().get(&url).send().await.expect("login again");
    assert_eq!(again.status(), StatusCode::UNAUTHORIZED, "a code works once");
    assert!(set_cookies(again.headers()).is_empty());

    // A browser gets a page, anything else JSON; an unknown code and no code are the same 401.
    let page = http()
        .get(gw.http_url("/auth/login?code=made-up"))
        .header("accept", "text/html,application/xhtml+xml")
        .send()
        .await
        .expect("unknown code");
    assert_eq!(page.status(), StatusCode::UNAUTHORIZED);
    assert!(
        page.headers()["content-type"]
            .to_str()
            .expect("ascii")
            .starts_with("text/html")
    );
    assert!(page.text().await.expect("body").contains("expired or already used"));
    let old_style = http()
        .get(gw.http_url(&format!("/auth/login?token={token}")))
        .send()
        .await
        .expect("token in URL");
    assert_eq!(old_style.status(), StatusCode::UNAUTHORIZED, "tokens in URLs are gone");
    assert!(set_cookies(old_style.headers()).is_empty());
    let body: Value = old_style.json().await.expect("json");
    assert!(body["error"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_code_is_refused() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let code = gw
        .gw
        .identity
        .login_codes
        .issue_at("alice", Duration::ZERO, Instant::now());
    let res = http()
        .get(gw.http_url(&format!("/auth/login?code={code}")))
        .send()
        .await
        .expect("login");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert!(set_cookies(res.headers()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_link_from_another_site_is_refused() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let code = gw.gw.identity.login_codes.issue("mallory");
    let url = gw.http_url(&format!("/auth/login?code={code}"));
    let res = http()
        .get(&url)
        .header("sec-fetch-site", "cross-site")
        .send()
        .await
        .expect("login");
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert!(set_cookies(res.headers()).is_empty());
    // Opened by the person it was given to (typed or pasted: `none`), it still works.
    let res = http()
        .get(&url)
        .header("sec-fetch-site", "none")
        .send()
        .await
        .expect("login");
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sign_in_form_works_only_from_our_own_pages() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mallory = gw.token("mallory");
    let ours = format!("http://{}", gw.addr);

    for (what, headers) in [
        ("another site", vec![("origin", "https://evil.example")]),
        (
            "our host over https",
            vec![("origin", &*format!("https://{}", gw.addr))],
        ),
        ("an opaque origin", vec![("origin", "null")]),
        ("no Origin, same-site", vec![("sec-fetch-site", "same-site")]),
        ("no Origin, cross-site", vec![("sec-fetch-site", "cross-site")]),
    ] {
        let res = post_login(&gw, &mallory, &headers).await;
        assert_eq!(res.status(), StatusCode::FORBIDDEN, "{what}");
        assert!(set_cookies(res.headers()).is_empty(), "{what}");
    }

    let res = post_login(&gw, &mallory, &[("origin", &ours), ("sec-fetch-site", "same-origin")]).await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert_eq!(res.headers()["location"], "/");
    assert_eq!(res.headers()["cache-control"], "no-store");
    // The cookie is a sign-in of its own (sign-out ends it), for the token's user.
    let cookie = cookie_value(res.headers(), "acp_gateway_token").expect("the cookie");
    assert_ne!(cookie, mallory);
    let who = gw.gw.identity.auth.verify(&cookie).expect("the gateway's own token");
    assert_eq!((who.user.as_str(), who.session.is_some()), ("mallory", true));

    let res = post_login(&gw, "not-a-token", &[("origin", &ours)]).await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert!(set_cookies(res.headers()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookie_flags_follow_the_scheme_the_browser_used() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let token = gw.token("alice");

    // Plain HTTP: HttpOnly, SameSite=Strict, Path=/, not Secure (the browser would drop it).
    let res = post_login(&gw, &token, &[("origin", &format!("http://{}", gw.addr))]).await;
    let cookies = set_cookies(res.headers());
    assert_eq!(cookies.len(), 1, "{cookies:?}");
    assert!(cookies[0].starts_with("acp_gateway_token="), "{cookies:?}");
    let attrs = attributes(&cookies[0]);
    for want in ["httponly", "samesite=strict", "path=/"] {
        assert!(attrs.iter().any(|a| a == want), "{want} in {cookies:?}");
    }
    assert!(!attrs.iter().any(|a| a == "secure"), "{cookies:?}");
    assert!(!attrs.iter().any(|a| a.starts_with("domain")), "{cookies:?}");

    // HTTPS behind a proxy, told by X-Forwarded-Proto or Forwarded: the __Host- cookie, Secure.
    let https_origin = format!("https://{}", gw.addr);
    let via_x = post_login(
        &gw,
        &token,
        &[("origin", &https_origin), ("x-forwarded-proto", "https")],
    )
    .await;
    let code = gw.gw.identity.login_codes.issue("alice");
    let via_forwarded = http()
        .get(gw.http_url(&format!("/auth/login?code={code}")))
        .header("forwarded", "for=192.0.2.60;proto=https")
        .send()
        .await
        .expect("code login");
    for res in [via_x, via_forwarded] {
        assert_eq!(res.status(), StatusCode::SEE_OTHER);
        let cookies = set_cookies(res.headers());
        assert_eq!(cookies.len(), 1, "{cookies:?}");
        assert!(cookies[0].starts_with("__Host-acp_gateway_token="), "{cookies:?}");
        let attrs = attributes(&cookies[0]);
        for want in ["secure", "httponly", "samesite=strict", "path=/"] {
            assert!(attrs.iter().any(|a| a == want), "{want} in {cookies:?}");
        }
        assert!(!attrs.iter().any(|a| a.starts_with("domain")), "{cookies:?}");
    }

    // Both names are read; over HTTPS only the __Host- one (a plain one may have been planted).
    let host_cookie = format!("__Host-acp_gateway_token={token}");
    let plain_cookie = format!("acp_gateway_token={token}");
    let https = [("x-forwarded-proto", "https")];
    assert_eq!(me_with_cookie(&gw, &host_cookie, &https).await.0, StatusCode::OK);
    assert_eq!(me_with_cookie(&gw, &host_cookie, &[]).await.0, StatusCode::OK);
    assert_eq!(me_with_cookie(&gw, &plain_cookie, &[]).await.0, StatusCode::OK);
    assert_eq!(
        me_with_cookie(&gw, &plain_cookie, &https).await.0,
        StatusCode::UNAUTHORIZED
    );

    // Signing out clears both names; only our own pages may do it.
    let logout = |origin: String| http().post(gw.http_url("/auth/logout")).header("origin", origin).send();
    let res = logout("https://evil.example".into()).await.expect("logout");
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert!(set_cookies(res.headers()).is_empty());
    let res = logout(format!("http://{}", gw.addr)).await.expect("logout");
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let cleared = set_cookies(res.headers());
    for name in ["acp_gateway_token", "__Host-acp_gateway_token"] {
        let c = cleared
            .iter()
            .find(|c| c.starts_with(&format!("{name}=;")))
            .unwrap_or_else(|| panic!("{name} cleared in {cleared:?}"));
        assert!(attributes(c).iter().any(|a| a == "max-age=0"), "{c}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_rides_a_websocket_only_from_the_same_origin() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let token = gw.token("alice");
    let plain = format!("acp_gateway_token={token}");
    let host = format!("__Host-acp_gateway_token={token}");
    let http_origin = format!("http://{}", gw.addr);
    let https_origin = format!("https://{}", gw.addr);

    assert_eq!(
        upgrade_status(&gw, "/acp", &[("cookie", &plain), ("origin", &http_origin)]).await,
        101,
        "our own page"
    );
    assert_eq!(
        upgrade_status(&gw, "/acp", &[("cookie", &plain), ("origin", "https://evil.example")]).await,
        401,
        "cross-site WebSocket hijacking"
    );
    assert_eq!(
        upgrade_status(&gw, "/acp", &[("cookie", &plain), ("origin", &https_origin)]).await,
        401,
        "an https page may not ride the cookie of an http request"
    );
    let behind_tls = [("cookie", &*host), ("x-forwarded-proto", "https")];
    assert_eq!(
        upgrade_status(&gw, "/acp", &[behind_tls[0], behind_tls[1], ("origin", &https_origin)]).await,
        101,
        "our own page behind a TLS proxy"
    );
    assert_eq!(
        upgrade_status(&gw, "/acp", &[behind_tls[0], behind_tls[1], ("origin", &http_origin)]).await,
        401,
        "an http page may not ride the cookie of an https request"
    );
    // Same-origin REST calls with the cookie work; other origins' do not.
    assert_eq!(
        me_with_cookie(&gw, &plain, &[("origin", &http_origin)]).await.0,
        StatusCode::OK
    );
    assert_eq!(
        me_with_cookie(&gw, &plain, &[("origin", "https://evil.example")])
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        me_with_cookie(&gw, &plain, &[("sec-fetch-site", "same-site")]).await.0,
        StatusCode::UNAUTHORIZED,
        "no Origin, but another site's subresource"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_token_in_the_query_is_for_acp_only() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let token = gw.token("alice");
    assert_eq!(
        upgrade_status(&gw, &format!("/acp?access_token={token}"), &[]).await,
        101
    );
    for path in ["/api/me", "/api/sessions", "/api/agents"] {
        let res = http()
            .get(gw.http_url(&format!("{path}?access_token={token}")))
            .send()
            .await
            .expect("get");
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
    let res = http()
        .get(gw.http_url("/api/me"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("get");
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_response_forbids_framing_and_inline_code() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    for path in [
        "/",
        "/app.js",
        "/api/me",
        "/auth/login?code=x",
        "/healthz",
        "/no-such-file",
    ] {
        let res = http().get(gw.http_url(path)).send().await.expect("get");
        let csp = res
            .headers()
            .get("content-security-policy")
            .unwrap_or_else(|| panic!("{path}: no CSP"))
            .to_str()
            .expect("ascii")
            .to_string();
        let directives: Vec<&str> = csp.split(';').map(str::trim).collect();
        for want in [
            "default-src 'self'",
            "script-src 'self'",
            "style-src 'self'",
            "object-src 'none'",
            "base-uri 'none'",
            "form-action 'self'",
            "frame-ancestors 'none'",
        ] {
            assert!(directives.contains(&want), "{path}: {want} in {csp}");
        }
        assert_eq!(res.headers()["x-frame-options"], "DENY", "{path}");
        assert_eq!(res.headers()["x-content-type-options"], "nosniff", "{path}");
    }
    // The page itself has nothing inline for the policy to block.
    let page = http()
        .get(gw.http_url("/"))
        .send()
        .await
        .expect("get")
        .text()
        .await
        .expect("body");
    assert!(
        !page.contains("<style") && !page.contains(" style=") && !page.contains("<script>"),
        "{page}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weak_keys_are_refused_at_start() {
    // The rules are checked where keys are set up: every command that needs a key refuses to
    // start (the CLI test checks `token` the same way).
    let dir = tempfile::tempdir().expect("tmp");
    let db = format!("sqlite://{}/gw.db", dir.path().display());
    let mut config = common::test_config(dir.path(), &db);
    config.jwt.secret = Some("0123456789012345678901234567890".to_string().into());
    let err = Application::build(config).await.err().expect("a 31-byte secret");
    assert!(format!("{err:#}").contains("31 bytes"), "{err:#}");
    let pem = dir.path().join("jwt.pub");
    std::fs::write(&pem, "not read before the audience check").expect("write");
    let mut config = common::test_config(dir.path(), &db);
    config.jwt.secret = None;
    config.jwt.public_key = Some(pem);
    let err = Application::build(config)
        .await
        .err()
        .expect("a public key without an audience");
    assert!(
        format!("{err:#}").contains("ACP_GATEWAY_JWT_AUDIENCE) is required"),
        "{err:#}"
    );
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_directory_and_database_are_private() {
    let root = common::DataDir::new();
    let data = root.path().join("data");
    let db = data.join("gw.db");
    let url = format!("sqlite://{}", db.display());
    let (data_dir, db_url) = (data.clone(), url.clone());
    let gw = TestGateway::start_in(root.clone(), Db::Url(url.clone()), move |c| {
        c.data_dir = data_dir;
        c.jwt.secret = None; // generated into the data directory
        c.database_url = db_url;
    })
    .await;
    // Write something, so the WAL has content.
    let mut alice = gw.client("alice").await;
    let session = alice.new_session().await;
    alice.prompt(&session, "hello").await;
    assert_eq!(mode(&data), 0o700, "data directory");
    assert_eq!(mode(&db), 0o600, "database");
    assert_eq!(mode(&data.join("gw.db-wal")), 0o600, "WAL");
    assert_eq!(mode(&data.join("gw.db-shm")), 0o600, "shared memory index");
    assert_eq!(mode(&data.join("jwt-secret")), 0o600, "generated secret");
    alice.close().await;
    gw.stop().await;

    // Files an older version (or a careless copy) left readable are made private at start.
    for file in ["gw.db", "gw.db-wal", "gw.db-shm", "jwt-secret"] {
        let path = data.join(file);
        if path.exists() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        }
    }
    let gw = TestGateway::start_in(root.clone(), Db::Url(url.clone()), {
        let data = data.clone();
        move |c| {
            c.data_dir = data;
            c.jwt.secret = None;
            c.database_url = url;
        }
    })
    .await;
    assert_eq!(mode(&db), 0o600, "database");
    assert_eq!(mode(&data.join("jwt-secret")), 0o600, "generated secret");
    for file in ["gw.db-wal", "gw.db-shm"] {
        let path = data.join(file);
        if path.exists() {
            assert_eq!(mode(&path), 0o600, "{file}");
        }
    }
    let mut bob = gw.client("bob").await;
    let listed = bob.request("session/list", json!({})).await;
    assert!(listed["result"]["sessions"].is_array(), "{listed}");
    bob.close().await;
    gw.stop().await;
}

/// `/auth/*` needs no token, so each client address may call it only so often
/// (`limits.auth_requests_per_minute_per_ip`): past it `429` with `Retry-After`, for that address
/// alone; behind a trusted proxy, for the client the proxy names, not for the proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_routes_are_rate_limited_per_client_address() {
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.limits.auth_requests_per_minute_per_ip = 5;
    })
    .await;
    let from = |ip: &str| {
        reqwest::Client::builder()
            .local_address(ip.parse::<std::net::IpAddr>().expect("ip"))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client")
    };
    let one = from("127.0.0.1");
    for _ in 0..5 {
        let res = one
            .get(gw.http_url("/auth/login?code=nope"))
            .send()
            .await
            .expect("login");
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    }
    let res = one
        .get(gw.http_url("/auth/login?code=nope"))
        .send()
        .await
        .expect("login");
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = res.headers()["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((1..=60).contains(&retry), "{retry}");
    let res = one
        .post(gw.http_url("/auth/login"))
        .form(&[("token", "x")])
        .send()
        .await
        .expect("form");
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "every /auth/ route");
    // The rest of the API, and another address, are not affected.
    let res = one
        .get(gw.http_url("/api/me"))
        .bearer_auth(gw.token("alice"))
        .send()
        .await
        .expect("me");
    assert_eq!(res.status(), StatusCode::OK);
    let res = from("127.0.0.2")
        .get(gw.http_url("/auth/login?code=nope"))
        .send()
        .await
        .expect("login");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    gw.stop().await;

    // Behind a trusted proxy (here 127.0.0.1), each client it names has its own allowance.
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.limits.auth_requests_per_minute_per_ip = 2;
        c.limits.trusted_proxies = vec!["127.0.0.1".parse().expect("ip")];
    })
    .await;
    let via = |client: &'static str| {
        let url = gw.http_url("/auth/login?code=nope");
        let proxy = one.clone();
        async move {
            proxy
                .get(url)
                .header("x-forwarded-for", client)
                .send()
                .await
                .expect("login")
                .status()
        }
    };
    assert_eq!(via("192.0.2.1").await, StatusCode::UNAUTHORIZED);
    assert_eq!(via("192.0.2.1").await, StatusCode::UNAUTHORIZED);
    assert_eq!(via("192.0.2.1").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        via("192.0.2.2").await,
        StatusCode::UNAUTHORIZED,
        "another client of the proxy"
    );
    gw.stop().await;
}

/// Sign-out ends the sign-in of a login link or of the token form on the server (review F11 L3):
/// its cookie, copied before, no longer works anywhere; the token pasted into the form is the
/// user's own and keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_out_ends_a_login_link_or_token_sign_in_for_good() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let ours = format!("http://{}", gw.addr);
    let code = gw.gw.identity.login_codes.issue("alice");
    let res = http()
        .get(gw.http_url(&format!("/auth/login?code={code}")))
        .send()
        .await
        .expect("login");
    let link_cookie = cookie_value(res.headers(), "acp_gateway_token").expect("the cookie");
    let pasted = gw.token("bob");
    let res = post_login(&gw, &pasted, &[("origin", &ours)]).await;
    let form_cookie = cookie_value(res.headers(), "acp_gateway_token").expect("the cookie");
    for (cookie, user) in [(&link_cookie, "alice"), (&form_cookie, "bob")] {
        let (status, me) = me_with_cookie(&gw, &format!("acp_gateway_token={cookie}"), &[]).await;
        assert_eq!((status, me["user"].as_str()), (StatusCode::OK, Some(user)));
        let res = http()
            .post(gw.http_url("/auth/logout"))
            .header("origin", &ours)
            .header("cookie", format!("acp_gateway_token={cookie}"))
            .send()
            .await
            .expect("logout");
        assert_eq!(res.status(), StatusCode::NO_CONTENT);
        // A copy of the cookie, as a cookie or as a bearer token: refused.
        let (status, _) = me_with_cookie(&gw, &format!("acp_gateway_token={cookie}"), &[]).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{user}'s cookie after sign-out");
        let res = http()
            .get(gw.http_url("/api/me"))
            .bearer_auth(cookie)
            .send()
            .await
            .expect("me");
        assert_eq!(
            res.status(),
            StatusCode::UNAUTHORIZED,
            "{user}'s cookie as a bearer token"
        );
    }
    let res = http()
        .get(gw.http_url("/api/me"))
        .bearer_auth(&pasted)
        .send()
        .await
        .expect("me");
    assert_eq!(res.status(), StatusCode::OK, "the pasted token is bob's own");
    gw.stop().await;
}
