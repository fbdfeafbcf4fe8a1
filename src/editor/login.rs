//! `acp-gateway login URL` and `logout`: a machine signed in by device code (RFC 8628), approved
//! in a browser anywhere the person is signed in to the gateway; the token kept per base URL in
//! the user's config directory ([`super::token`]).

use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;

use super::token;

/// The grant type of RFC 8628 §3.4.
const DEVICE_GRANT: &str = "urn:ietf:params:oauth:grant-type:device_code";

#[derive(Deserialize)]
struct Started {
    device_code: String,
    user_code: String,
    verification_uri: String,
    verification_uri_complete: Option<String>,
    expires_in: u64,
    interval: Option<u64>,
}

#[derive(Deserialize)]
struct Issued {
    access_token: String,
}

#[derive(Deserialize)]
struct OAuthError {
    error: String,
    #[serde(default)]
    error_description: Option<String>,
}

/// This machine's name, as the approver sees it.
fn device_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "this computer".into());
    let user = std::env::var("USER").unwrap_or_default();
    match user.is_empty() {
        true => format!("acp-gateway on {host}"),
        false => format!("acp-gateway on {host} ({user})"),
    }
}

/// Signs this machine in to the gateway at `base`: shows the code and link on stderr, waits for
/// the approval, keeps the token.
pub async fn login(base: &url::Url) -> anyhow::Result<()> {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(15)).build()?;
    let response = http
        .post(base.join("auth/device")?)
        .form(&[("client_id", "acp-gateway"), ("client_name", device_name().as_str())])
        .send()
        .await
        .with_context(|| format!("asking {base} for a sign-in code"))?;
    if !response.status().is_success() {
        bail!(
            "{base} refused to start a sign-in: {}",
            response.text().await.unwrap_or_default()
        );
    }
    let started: Started = response.json().await.context("reading the sign-in code")?;
    let link = started
        .verification_uri_complete
        .as_deref()
        .unwrap_or(&started.verification_uri);
    eprintln!(
        "To sign this device in, open this link in a browser where you are signed in to the gateway:\n\n  {link}\n\nand check that it shows the code {}. Waiting for your approval…",
        started.user_code
    );
    let mut interval = Duration::from_secs(started.interval.unwrap_or(5).max(1));
    let until = tokio::time::Instant::now() + Duration::from_secs(started.expires_in);
    loop {
        if tokio::time::Instant::now() >= until {
            bail!("the code expired before it was approved; run `acp-gateway login {base}` again");
        }
        tokio::time::sleep(interval).await;
        let response = http
            .post(base.join("auth/device/token")?)
            .form(&[
                ("grant_type", DEVICE_GRANT),
                ("device_code", started.device_code.as_str()),
            ])
            .send()
            .await;
        let response = match response {
            Ok(r) => r,
            Err(e) => {
                eprintln!("(cannot reach {base}: {e}; trying again)");
                continue;
            }
        };
        if response.status().is_success() {
            let issued: Issued = response.json().await.context("reading the token")?;
            token::save(base, &issued.access_token)?;
            eprintln!(
                "Signed in to {base}. The token is kept in {}.",
                token::path()?.display()
            );
            return Ok(());
        }
        let error: OAuthError = response.json().await.context("reading the gateway's answer")?;
        match error.error.as_str() {
            "authorization_pending" => {}
            "slow_down" => interval += Duration::from_secs(5),
            "access_denied" => bail!("the sign-in was denied in the browser"),
            "expired_token" => bail!("the code expired; run `acp-gateway login {base}` again"),
            other => bail!(
                "the gateway refused the sign-in: {other} ({})",
                error.error_description.unwrap_or_default()
            ),
        }
    }
}

/// The gateways this machine keeps a token for.
pub fn signed_in() -> anyhow::Result<Vec<url::Url>> {
    token::urls()
}

/// Forgets this machine's token for `base` and revokes it on the gateway (when it answers).
pub async fn logout(base: &url::Url) -> anyhow::Result<()> {
    let Some(kept) = token::stored(base)? else {
        eprintln!("Not signed in to {base}.");
        return Ok(());
    };
    let revoked = reqwest::Client::new()
        .delete(base.join("api/devices/current")?)
        .bearer_auth(&kept)
        .timeout(Duration::from_secs(10))
        .send()
        .await;
    token::forget(base)?;
    match revoked {
        Ok(r) if r.status().is_success() => eprintln!("Signed out of {base}; the token is revoked."),
        Ok(r) => eprintln!(
            "Signed out of {base} here; the gateway answered {} to the revocation.",
            r.status()
        ),
        Err(e) => eprintln!(
            "Signed out of {base} here; the gateway could not be told ({e}): revoke the device in its web UI."
        ),
    }
    Ok(())
}
