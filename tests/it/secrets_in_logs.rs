//! Secrets stay out of the logs and the audit log: a real `serve` process (logging at `debug`)
//! is given a JWT secret, a secrets key and an OIDC client secret, a user signs in with a token
//! through the form, saves an agent key, prompts the agent that reads it and signs out; then
//! neither its whole stderr nor the audit table holds any of those values.

use crate::common;

use std::process::Stdio;

use common::{Client, WAIT, gateway_bin};
use reqwest::StatusCode;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

const JWT_SECRET: &str = "jwt-secret-for-the-log-test-0123456789abcdef";
const SECRETS_KEY: &str = "bG9nLXRlc3Qtc2VjcmV0cy1rZXktMDEyMzQ1Njc4OWE=";
const OIDC_SECRET: &str = "oidc-client-secret-never-in-a-log-7788";
const AGENT_KEY: &str = "sk-log-test-agent-key-value-5566";
const KEYS_AGENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/keys_agent.py");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_the_log_or_the_audit_table() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().canonicalize().expect("canon");
    let config = data.join("gateway.toml");
    std::fs::write(
        &config,
        format!("[agents.default]\ncommand = \"/usr/bin/python3\"\nargs = [\"{KEYS_AGENT}\"]\n"),
    )
    .expect("config");
    let stderr_file = data.join("stderr.log");
    let mut child = tokio::process::Command::new(gateway_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "debug")
        .env("ACP_GATEWAY_DATA_DIR", &data)
        .env("DATABASE_URL", format!("sqlite://{}/gw.db", data.display()))
        .env("ACP_GATEWAY_JWT_SECRET", JWT_SECRET)
        .env("ACP_GATEWAY_SECRETS_KEY", SECRETS_KEY)
        .env("ACP_GATEWAY_OIDC_ISSUER", "http://127.0.0.1:9")
        .env("ACP_GATEWAY_OIDC_CLIENT_ID", "acp-gateway")
        .env("ACP_GATEWAY_OIDC_CLIENT_SECRET", OIDC_SECRET)
        .env("ACP_GATEWAY_OIDC_REDIRECT_URL", "http://127.0.0.1:9/auth/oidc/callback")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr_file).expect("stderr file"))
        .kill_on_drop(true)
        .spawn()
        .expect("serve starts");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let addr = tokio::time::timeout(WAIT, async {
        while let Some(line) = lines.next_line().await.expect("stdout") {
            if let Some(rest) = line.split("http://").nth(1) {
                return rest.split('/').next().expect("addr").to_string();
            }
        }
        panic!("no address printed");
    })
    .await
    .expect("address in time");
    let drain = tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

    let mint = acp_gateway::identity::auth::Authenticator::from_config(
        &acp_gateway::infra::config::JwtConfig {
            secret: Some(JWT_SECRET.to_string().into()),
            ..Default::default()
        },
        std::path::Path::new("/nonexistent"),
    )
    .expect("authenticator");
    let token = mint.mint("alice", 3600).expect("mint");
    let http = reqwest::Client::builder()
        .cookie_store(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let origin = format!("http://{addr}");

    // The token through the sign-in form, then the cookie it set.
    let res = http
        .post(format!("{origin}/auth/login"))
        .header("origin", &origin)
        .form(&[("token", token.as_str())])
        .send()
        .await
        .expect("login");
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    // An agent key, used by the agent on a prompt.
    let res = http
        .put(format!("{origin}/api/agents/default/keys"))
        .header("origin", &origin)
        .json(&json!({"methodId": "openai-key", "vars": {"OPENAI_API_KEY": AGENT_KEY}}))
        .send()
        .await
        .expect("keys");
    assert_eq!(res.status(), StatusCode::NO_CONTENT, "{:?}", res.text().await);
    let mut alice = Client::connect(&format!("ws://{addr}/acp"), &token).await.expect("ws");
    alice.initialize().await;
    let session = alice.new_session().await;
    let r = alice.prompt(&session, "hello").await;
    assert!(r.get("result").is_some(), "{r}");
    // A wrong token, refused (its text must not be logged either).
    let forged = format!("{token}x");
    let res = reqwest::Client::new()
        .get(format!("{origin}/api/me"))
        .bearer_auth(&forged)
        .send()
        .await
        .expect("me");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let res = http
        .post(format!("{origin}/auth/logout"))
        .header("origin", &origin)
        .send()
        .await
        .expect("logout");
    assert!(res.status().is_success());
    drop(alice);

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id().expect("pid") as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    tokio::time::timeout(std::time::Duration::from_secs(30), child.wait())
        .await
        .expect("stops")
        .expect("reaped");
    drain.abort();

    let log = std::fs::read_to_string(&stderr_file).expect("log");
    // The log has what happened (at debug, sqlx and hyper included), just no secret.
    for event in [
        "agent sign-in",
        "action=\"agent_sign_in\"",
        "action=\"sign_in\"",
        "token refused",
        "DEBUG",
    ] {
        assert!(log.contains(event), "{event:?} is not in the log:\n{log}");
    }
    eprintln!("{} log lines read", log.lines().count());
    let audit: Vec<String> = {
        use sqlx::Connection;
        let mut db = sqlx::SqliteConnection::connect(&format!("sqlite://{}/gw.db", data.display()))
            .await
            .expect("db");
        sqlx::query_scalar("SELECT actor || action || COALESCE(target, '') || COALESCE(detail, '') FROM audit_log")
            .fetch_all(&mut db)
            .await
            .expect("audit rows")
    };
    assert!(audit.iter().any(|r| r.contains("agent_sign_in")), "{audit:?}");
    let audit = audit.join("\n");
    for (what, secret) in [
        ("the JWT secret", JWT_SECRET),
        ("the secrets key", SECRETS_KEY),
        ("the OIDC client secret", OIDC_SECRET),
        ("the agent key", AGENT_KEY),
        ("a user's token", token.as_str()),
        ("a forged token", forged.as_str()),
    ] {
        assert!(!log.contains(secret), "{what} is in the log");
        assert!(!audit.contains(secret), "{what} is in the audit log");
    }
}
