//! The configuration file, as agents could see it: the gateway reads it as its own OS user, so
//! an agent running as that user could too. Sandboxed agents find it covered by a `/dev/null` they cannot open
//! ([`super::Sight`]); what this module adds is the warning when secrets are written in it and
//! something could still read it (an unsandboxed agent, another user of the host).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use figment::Figment;
use figment::providers::{Format, Toml};

/// Settings whose value is a secret, with the environment variable that can carry it instead.
const SECRET_KEYS: [(&str, &str); 3] = [
    ("jwt.secret", "ACP_GATEWAY_JWT_SECRET"),
    ("secrets_key", "ACP_GATEWAY_SECRETS_KEY"),
    ("oidc.client_secret", "ACP_GATEWAY_OIDC_CLIENT_SECRET"),
];

/// The secret settings written in `file`: the keys of [`SECRET_KEYS`], a `database_url` or
/// `request_database_url` with a password, an agent's `env`.
fn secrets_in(file: &Path) -> Vec<String> {
    let figment = Figment::from(Toml::file_exact(file));
    let mut found: Vec<String> = SECRET_KEYS
        .iter()
        .filter(|(key, _)| figment.find_value(key).is_ok())
        .map(|(key, var)| format!("{key} (use {var})"))
        .collect();
    for (key, var) in [
        ("database_url", "DATABASE_URL"),
        ("request_database_url", "ACP_GATEWAY_REQUEST_DATABASE_URL"),
    ] {
        if let Ok(url) = figment.extract_inner::<String>(key)
            && url::Url::parse(&url).is_ok_and(|u| u.password().is_some())
        {
            found.push(format!("a password in {key} (use {var})"));
        }
    }
    if let Ok(agents) = figment.extract_inner::<std::collections::BTreeMap<String, figment::value::Value>>("agents") {
        for (name, agent) in agents {
            if agent.find_ref("env").is_some() {
                found.push(format!("agents.{name}.env (use pass_env)"));
            }
        }
    }
    found
}

/// Checks `file` (the `--config` file) at start: logs where its secrets stand and returns a
/// warning for `/readyz` when `unsandboxed` agents (which can read it) or other users of the
/// host can read the secrets written in it.
pub(super) fn check(file: Option<&Path>, unsandboxed: &[&str]) -> Option<String> {
    let file = file?;
    let secrets = secrets_in(file);
    if secrets.is_empty() {
        return None;
    }
    let open = std::fs::metadata(file).is_ok_and(|m| m.permissions().mode() & 0o044 != 0);
    let mut readers = Vec::new();
    if !unsandboxed.is_empty() {
        readers.push(format!("unsandboxed agents ({})", unsandboxed.join(", ")));
    }
    if open {
        readers.push(String::from("other users of this host (chmod 600 it)"));
    }
    if readers.is_empty() {
        tracing::info!(file = %file.display(), "the configuration file holds secrets; sandboxed agents cannot read it");
        return None;
    }
    tracing::warn!(
        file = %file.display(),
        secrets = %secrets.join(", "),
        "the configuration file holds secrets that {} can read; keep secrets in the environment or in the data directory",
        readers.join(" and ")
    );
    // For `/readyz`, which anyone may read: what to look at, not where or which.
    let warning = format!(
        "the configuration file holds secrets that {} can read (the log names them); keep secrets in the environment or in the data directory",
        readers.join(" and ")
    );
    Some(warning)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_written_in_the_file_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("config.toml");
        std::fs::write(
            &file,
            "database_url = \"postgres://gw:pw@db/acp\"\nrequest_database_url = \"postgres://web:pw@db/acp\"\n[jwt]\nsecret = \"0123456789abcdef0123456789abcdef\"\n[agents.x]\ncommand = \"a\"\nenv = { K = \"v\" }\n",
        )
        .expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let found = secrets_in(&file);
        assert_eq!(found.len(), 4, "{found:?}");
        assert!(
            found.contains(&String::from(
                "a password in request_database_url (use ACP_GATEWAY_REQUEST_DATABASE_URL)"
            )),
            "{found:?}"
        );
        assert!(
            check(Some(&file), &[]).is_none(),
            "hidden from sandboxed agents, private to the gateway"
        );
        let warning = check(Some(&file), &["default"]).expect("an unsandboxed agent can read it");
        assert!(
            warning.contains("unsandboxed agents (default)") && !warning.contains("jwt.secret"),
            "{warning}"
        );
        std::fs::write(&file, "listen = \"127.0.0.1:1\"\n").expect("write");
        assert!(check(Some(&file), &["default"]).is_none(), "no secrets in it");
    }
}
