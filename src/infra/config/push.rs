//! `[push]`: Web Push to the devices users opt in (the push module).

use serde::{Deserialize, Serialize};

/// Web Push.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PushConfig {
    /// Whether users may opt devices in (default `true`).
    pub enabled: bool,
    /// Who push services may contact about this gateway's pushes (VAPID `sub`): a `mailto:` or
    /// `https:` URL.
    pub contact: String,
    /// Whether subscriptions may name plain `http://` endpoints (a local push service in tests;
    /// browsers' are all HTTPS). Default `false`.
    pub allow_http_endpoints: bool,
    /// At most one push per session in this many seconds (a permission request always goes).
    pub min_interval_secs: u64,
    /// The push services a subscription may name (`*.example.com` for subdomains): the browser
    /// vendors' by default, so the gateway posts only where browsers receive pushes. Empty: any.
    pub endpoint_hosts: Vec<String>,
}

impl Default for PushConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            contact: String::from("mailto:admin@localhost"),
            allow_http_endpoints: false,
            min_interval_secs: 10,
            endpoint_hosts: [
                "fcm.googleapis.com",
                "*.push.services.mozilla.com",
                "*.notify.windows.com",
                "*.push.apple.com",
            ]
            .map(String::from)
            .to_vec(),
        }
    }
}

impl PushConfig {
    /// Whether a subscription may name `host`.
    pub fn endpoint_allowed(&self, host: &str) -> bool {
        self.endpoint_hosts.is_empty() || super::mcp::host_matches(&self.endpoint_hosts, host)
    }

    pub(super) fn validate(&self) -> Result<(), super::ConfigError> {
        super::mcp::check_host_patterns("push.endpoint_hosts", &self.endpoint_hosts)?;
        if !self.contact.starts_with("mailto:") && !self.contact.starts_with("https://") {
            return Err(super::ConfigError::Invalid(format!(
                "push.contact: {:?} must be a mailto: or https: URL (push services use it to reach the operator)",
                self.contact
            )));
        }
        Ok(())
    }
}
