//! The command line as an operator uses it: the real binary, real files.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> Command {
    let mut c = Command::new(common::gateway_bin());
    for var in [
        "ACP_GATEWAY_LISTEN",
        "DATABASE_URL",
        "ACP_GATEWAY_JWT_SECRET",
        "ACP_GATEWAY_JWT_PUBLIC_KEY",
        "ACP_GATEWAY_AGENT",
        "ACP_GATEWAY_JWT_AUDIENCE",
        "ACP_GATEWAY_JWT_ISSUER",
    ] {
        c.env_remove(var);
    }
    c
}

/// A configured secret of an acceptable length.
const SECRET: &str = "cli-test-secret-0123456789-0123456789";

#[test]
fn token_mints_a_jwt_for_the_configured_secret() {
    let out = bin()
        .args(["token", "--sub", "alice", "--ttl", "60"])
        .env("ACP_GATEWAY_JWT_SECRET", SECRET)
        .output()
        .expect("runs");
    assert!(out.status.success());
    let token = String::from_utf8(out.stdout).expect("utf8");
    let cfg = acp_gateway::infra::config::JwtConfig {
        secret: Some(SECRET.to_string().into()),
        ..Default::default()
    };
    let auth = acp_gateway::identity::auth::Authenticator::from_config(&cfg, std::path::Path::new("/nonexistent"))
        .expect("auth");
    let who = auth.verify(token.trim()).expect("verifies");
    assert_eq!(who.user, "alice");
    assert!(who.expires_at <= acp_gateway::infra::clock::now_secs() + 60);

    let out = bin()
        .args(["token", "--sub", "alice"])
        .env("ACP_GATEWAY_JWT_SECRET", "short")
        .output()
        .expect("runs");
    assert!(!out.status.success(), "a short secret is refused");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ACP_GATEWAY_JWT_SECRET") && err.contains("at least 32 bytes"),
        "{err}"
    );
}

#[test]
fn migrate_creates_the_database_and_a_bad_config_names_file_and_key() {
    let dir = tempfile::tempdir().expect("tmp");
    let db = dir.path().join("sub/gw.db");
    let out = bin()
        .arg("migrate")
        .env("DATABASE_URL", format!("sqlite://{}", db.display()))
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(db.exists());

    let file = dir.path().join("bad.toml");
    std::fs::write(&file, "[limits]\nclient_queue = \"lots\"\n").expect("write");
    let out = bin().args(["serve", "--config"]).arg(&file).output().expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.toml") && err.contains("limits.client_queue") && err.contains("expected"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_no_configuration_prints_a_one_time_login_url_and_keeps_its_secret() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut child = bin()
        .args(["serve", "--listen", "127.0.0.1:0"])
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + common::WAIT;
    let mut printed = Vec::new();
    let url = loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("a login URL in time");
        printed.push(line.clone());
        if let Some(url) = line.trim().strip_prefix("http://") {
            break format!("http://{url}");
        }
    };
    let printed = printed.join("\n");
    assert!(url.contains("/auth/login?code="), "{printed}");
    assert!(!printed.contains("token="), "no token on stdout: {printed}");

    // The code signs the browser in once: a cookie holding a JWT for `local`, then 303 to the UI.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let first = http.get(&url).send().await.expect("login");
    assert_eq!(first.status().as_u16(), 303);
    assert_eq!(first.headers()["location"], "/");
    let cookie = first.headers()["set-cookie"].to_str().expect("ascii").to_string();
    let token = cookie
        .strip_prefix("acp_gateway_token=")
        .and_then(|c| c.split(';').next())
        .expect("the cookie holds a token")
        .to_string();
    let second = http.get(&url).send().await.expect("login again");
    assert_eq!(second.status().as_u16(), 401, "a login code works once");
    assert!(second.headers().get("set-cookie").is_none());

    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let stopped = wait_timeout(&mut child, Duration::from_secs(20));
    assert!(stopped, "serve stops on SIGTERM");
    // The generated secret is kept in ./data and `token` (same directory) agrees with it.
    assert!(dir.path().join("data/jwt-secret").exists());
    assert!(dir.path().join("data/acp-gateway.db").exists());
    let cfg = acp_gateway::infra::config::JwtConfig::default();
    let auth = acp_gateway::identity::auth::Authenticator::from_config(&cfg, &dir.path().join("data")).expect("auth");
    assert_eq!(auth.verify(&token).expect("valid").user, "local");
}

fn wait_timeout(child: &mut std::process::Child, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().expect("wait").is_some() {
            return true;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
