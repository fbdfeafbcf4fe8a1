//! A real OpenID provider for tests: `tests/oidc/provider.mjs` (panva's `oidc-provider` from npm)
//! on loopback, with its control routes (`/__test/*`), and a browser-less walk through its login
//! pages for the authorization code flow.

use std::path::PathBuf;
use std::process::Stdio;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Longest wait for the provider's start line.
const PROVIDER_START: std::time::Duration = std::time::Duration::from_secs(90);

/// A running provider (stopped when dropped).
pub struct Provider {
    /// Its issuer, `http://127.0.0.1:PORT`.
    pub issuer: String,
    /// Where it writes its signing keys (`<kid>.pem`, `<kid>.json`).
    pub keys_dir: tempfile::TempDir,
    /// Its first signing key's id.
    pub kid: String,
    child: Child,
}

/// A client registered at the provider.
pub struct ClientReg {
    pub id: &'static str,
    pub secret: &'static str,
    pub redirect: String,
}

impl Provider {
    /// Starts the provider with `client` registered (and `post_logout_redirect_uris` of `back`).
    pub async fn start(client: &ClientReg, back: &str) -> Self {
        Self::start_with(client, back, &[]).await
    }

    /// [`Provider::start`] with more of `provider.mjs`'s settings in its environment.
    pub async fn start_with(client: &ClientReg, back: &str, env: &[(&str, &str)]) -> Self {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/oidc");
        assert!(
            dir.join("node_modules/oidc-provider").exists(),
            "tests/oidc/node_modules is missing: run `cd tests/oidc && npm ci` (scripts/test.sh does)"
        );
        let keys_dir = tempfile::tempdir().expect("keys dir");
        let clients = json!([{
            "client_id": client.id,
            "client_secret": client.secret,
            "redirect_uris": [client.redirect],
            "post_logout_redirect_uris": [back],
        }]);
        let mut child = Command::new("node")
            .arg("provider.mjs")
            .current_dir(&dir)
            .env("OIDC_CLIENTS", clients.to_string())
            .env("OIDC_KEYS_DIR", keys_dir.path())
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            // Its log only when asked for (TEST_LOG), like the gateway's.
            .stderr(if std::env::var_os("TEST_LOG").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .kill_on_drop(true)
            .spawn()
            .expect("node runs tests/oidc/provider.mjs");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        // Node loading oidc-provider cold, with the other tests' providers and gateways starting on
        // the same two cores, took over 20 s once in CI: its start is not what is tested.
        let line = tokio::time::timeout(PROVIDER_START, lines.next_line())
            .await
            .expect("the provider starts in time")
            .expect("read")
            .expect("a line");
        let started: Value = serde_json::from_str(&line).expect("the provider's start line");
        Self {
            issuer: started["issuer"].as_str().expect("issuer").to_string(),
            kid: started["kid"].as_str().expect("kid").to_string(),
            keys_dir,
            child,
        }
    }

    /// POSTs a control route.
    pub async fn control(&self, path: &str, body: Value) -> Value {
        reqwest::Client::new()
            .post(format!("{}/__test/{path}", self.issuer.trim_end_matches('/')))
            .json(&body)
            .send()
            .await
            .expect("control route")
            .json()
            .await
            .expect("json")
    }

    /// How often its JWKS has been fetched.
    pub async fn jwks_requests(&self) -> u64 {
        let stats: Value = reqwest::get(format!("{}/__test/stats", self.issuer.trim_end_matches('/')))
            .await
            .expect("stats")
            .json()
            .await
            .expect("json");
        stats["jwks_requests"].as_u64().expect("count")
    }

    /// The private key (PKCS#8 PEM) of `kid`.
    pub fn private_pem(&self, kid: &str) -> Vec<u8> {
        std::fs::read(self.keys_dir.path().join(format!("{kid}.pem"))).expect("key file")
    }

    /// The public key (SPKI PEM) of `kid`.
    pub fn public_pem(&self, kid: &str) -> String {
        let v: Value =
            serde_json::from_slice(&std::fs::read(self.keys_dir.path().join(format!("{kid}.json"))).expect("key json"))
                .expect("json");
        v["publicPem"].as_str().expect("publicPem").to_string()
    }

    /// Stops it (as if the provider went down).
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// An HTTP client that keeps cookies (both the gateway's and the provider's: they are named
/// apart) and follows no redirect by itself.
pub fn browser() -> reqwest::Client {
    reqwest::Client::builder()
        .cookie_store(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

/// Follows redirects from `url` until one leads to `stop_prefix`; returns that URL. Pages on the
/// way that are the provider's login form are filled with `login`.
pub async fn walk(http: &reqwest::Client, url: &str, stop_prefix: &str, login: &str) -> String {
    let mut next = url.to_string();
    for _ in 0..20 {
        if next.starts_with(stop_prefix) {
            return next;
        }
        let res = http.get(&next).send().await.expect("GET");
        let base = res.url().clone();
        if let Some(location) = res.headers().get(reqwest::header::LOCATION) {
            next = base
                .join(location.to_str().expect("location"))
                .expect("url")
                .to_string();
            continue;
        }
        let page = res.text().await.expect("page");
        assert!(page.contains("name=\"login\""), "not a login page at {next}: {page}");
        // The login form posts to the page's own path + /login.
        let action = format!("{}/login", base.path());
        let res = http
            .post(base.join(&action).expect("action"))
            .form(&[("login", login), ("password", "any-password")])
            .send()
            .await
            .expect("POST login");
        let location = res
            .headers()
            .get(reqwest::header::LOCATION)
            .unwrap_or_else(|| panic!("the login was not accepted ({})", res.status()))
            .to_str()
            .expect("location")
            .to_string();
        next = base.join(&location).expect("url").to_string();
    }
    panic!("too many redirects from {url}");
}
