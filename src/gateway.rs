//! The state every request handler reaches: built at start-up (`app`), used by the HTTP routes and
//! the WebSocket bridge. It sits below both, so neither imports the other through it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::agents::pool::Pools;
use crate::identity::auth::{Authenticator, LoginCodes};
use crate::infra::config::Config;
use crate::session::Sessions;
use crate::settings::secrets::Keys;
use crate::tenancy::Tenancy;
use crate::usage::quota::Quotas;

/// Everything a request handler can reach.
#[derive(Debug)]
pub struct Gateway {
    /// The loaded configuration.
    pub config: Config,
    /// Token verification.
    pub auth: Authenticator,
    /// One-time login codes (`GET /auth/login?code=`), such as the one `serve` prints.
    pub login_codes: LoginCodes,
    /// Sessions: stored, being written, in memory (the only door to the store).
    pub sessions: Sessions,
    /// Sessions shared with teammates, and the clients they let in.
    pub shares: Arc<crate::sharing::Shares>,
    /// Agent processes.
    pub pools: Arc<Pools>,
    /// Each user's home, workspace roots and agent sandbox.
    pub tenancy: Arc<Tenancy>,
    /// Fired when shutdown starts.
    pub shutdown: CancellationToken,
    /// Every connection, request and agent task (axum does not wait for WebSocket tasks).
    pub tracker: TaskTracker,
    /// Set while draining: `/readyz` answers 503, upgrades and new requests are refused (a flag
    /// for the checks on every request; [`Gateway::drain`] is the same to wait on).
    pub draining: AtomicBool,
    /// Fired when draining starts.
    pub drain: CancellationToken,
    /// Caps concurrent WebSocket connections.
    pub connection_slots: Arc<Semaphore>,
    /// Per-user caps.
    pub quotas: Arc<Quotas>,
    /// Prefix of connection ids, unique per replica run.
    pub replica: String,
    /// Keys users give their agents, sealed at rest.
    pub keys: Arc<Keys>,
    /// Users' own MCP servers, sealed at rest.
    pub user_mcp: Arc<crate::settings::user_mcp::UserMcp>,
    /// Pushes to users' devices.
    pub push: Arc<crate::push::Push>,
    /// Sign-ins under way (one per user and agent).
    pub signins: Arc<crate::signin::Running>,
    /// The team's identity provider, when `[oidc]` is configured.
    pub oidc: Option<Arc<crate::identity::oidc::Oidc>>,
    /// An identity provider's keys named by `jwt.jwks_url` (without `[oidc]`, or beside it).
    pub jwks: Option<Arc<crate::identity::auth::jwks::Jwks>>,
    /// Who did what.
    pub audit: Arc<crate::audit::Audit>,
    /// What each person spends.
    pub usage: Arc<crate::usage::Usage>,
}

impl Gateway {
    /// Whether `who` administers this gateway: a user `[admin].users` names, or one whose token
    /// said they are in an `[admin].groups` group.
    pub fn is_admin(&self, who: &crate::identity::auth::Identity) -> bool {
        who.admin || self.config.admin.users.contains(&who.user)
    }

    /// The keys provider tokens on the API are verified with, once known.
    pub fn provider_keys(&self) -> Option<Arc<crate::identity::auth::jwks::Jwks>> {
        self.jwks
            .clone()
            .or_else(|| self.oidc.as_ref().and_then(|o| o.api_keys()))
    }

    /// Whether the gateway is draining (for `/readyz`).
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Starts draining (the application's shutdown drives it).
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
        self.drain.cancel();
    }
}
