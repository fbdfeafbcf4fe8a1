//! `[admin]` (who administers the gateway) and `[audit]` (how long the audit log is kept).

use serde::{Deserialize, Serialize};

/// Who is an admin: named users, or members of named groups (the identity provider's groups
/// claim, `oidc.groups_claim`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Users who are admins (`ACP_GATEWAY_ADMIN_USERS`, comma-separated).
    pub users: Vec<String>,
    /// Groups whose members are admins (`ACP_GATEWAY_ADMIN_GROUPS`).
    pub groups: Vec<String>,
}

/// The audit log.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// Days an entry is kept (`ACP_GATEWAY_AUDIT_RETENTION_DAYS`); 0 keeps everything.
    pub retention_days: u64,
}

impl Default for AuditConfig {
    fn default() -> Self {
        Self { retention_days: 90 }
    }
}

/// Device sign-in (`acp-gateway login`: a code approved in the browser).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeviceConfig {
    /// How long a code may be approved and exchanged (seconds).
    pub code_ttl_secs: u64,
    /// How long a device's token lasts (seconds); it is revocable at once in the web UI.
    pub token_ttl_secs: u64,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self {
            code_ttl_secs: 600,
            token_ttl_secs: 30 * 24 * 3600,
        }
    }
}

/// What each person may spend, from their agents' `usage_update` costs (UTC days and months).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UsageConfig {
    /// Most a user may spend in a UTC day, in `currency` (none: no cap).
    pub daily_cost_cap: Option<f64>,
    /// Most a user may spend in a UTC month, in `currency` (none: no cap).
    pub monthly_cost_cap: Option<f64>,
    /// The currency the caps are in (what the agents report, e.g. `USD`).
    pub currency: String,
}

impl Default for UsageConfig {
    fn default() -> Self {
        Self {
            daily_cost_cap: None,
            monthly_cost_cap: None,
            currency: String::from("USD"),
        }
    }
}

/// Environment variables of `[admin]` that set a comma-separated list.
pub(super) const ENV_LISTS: &[(&str, &str)] = &[
    ("ACP_GATEWAY_ADMIN_USERS", "admin.users"),
    ("ACP_GATEWAY_ADMIN_GROUPS", "admin.groups"),
];

/// Environment variables of `[audit]` that set a number.
pub(super) const ENV_NUMBERS: &[(&str, &str)] = &[("ACP_GATEWAY_AUDIT_RETENTION_DAYS", "audit.retention_days")];
