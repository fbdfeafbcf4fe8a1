//! The state every request handler reaches: built at start-up (`app`), used by the HTTP routes and
//! the WebSocket bridge. It sits below both, so neither imports the other through it.
//!
//! [`Gateway`] is a handful of substates, each behind an `Arc` so that the whole is cheap to clone
//! (axum clones the state for every request). A route asks for the substates it uses, not the
//! world: `State<Arc<Sessions>>`, `State<Arc<Push>>`, … through axum's
//! [`axum::extract::FromRef`], implemented here for each of them. The ACP connection,
//! which drives sessions, agents and most features at once, keeps the whole.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::FromRef;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::agents::pool::Pools;
use crate::audit::Audit;
use crate::identity::auth::jwks::Jwks;
use crate::identity::auth::{Authenticator, Identity, LoginCodes};
use crate::identity::oidc::Oidc;
use crate::infra::config::{AdminConfig, Config};
use crate::push::Push;
use crate::session::Sessions;
use crate::settings::secrets::Keys;
use crate::settings::user_mcp::UserMcp;
use crate::sharing::Shares;
use crate::tenancy::Tenancy;
use crate::usage::Usage;
use crate::usage::quota::Quotas;

/// Everything a request handler can reach, in substates.
#[derive(Debug, Clone)]
pub struct Gateway {
    /// The loaded configuration.
    pub config: Arc<Config>,
    /// Start, drain and shutdown: the tasks, the connection slots, this replica's name.
    pub life: Arc<Life>,
    /// Who a caller is: tokens, login codes, the team's identity provider.
    pub identity: Arc<Identities>,
    /// Sessions: stored, being written, in memory (the only door to the store).
    pub sessions: Arc<Sessions>,
    /// Agent processes, the sandboxes they run in, the caps they count against, their sign-ins.
    pub agents: Arc<Agents>,
    /// What a user keeps sealed for their agents: keys and their own MCP servers.
    pub settings: Arc<Settings>,
    /// Sessions shared with teammates, and the clients they let in.
    pub shares: Arc<Shares>,
    /// Pushes to users' devices.
    pub push: Arc<Push>,
    /// Who did what.
    pub audit: Arc<Audit>,
    /// What each person spends.
    pub usage: Arc<Usage>,
}

/// The gateway's life: what start-up spawns and shutdown waits for.
#[derive(Debug)]
pub struct Life {
    /// Fired when shutdown starts.
    pub shutdown: CancellationToken,
    /// Every connection, request and agent task (axum does not wait for WebSocket tasks).
    pub tracker: TaskTracker,
    /// Set while draining: `/readyz` answers 503, upgrades and new requests are refused (a flag
    /// for the checks on every request; [`Life::drain`] is the same to wait on).
    draining: AtomicBool,
    /// Fired when draining starts.
    pub drain: CancellationToken,
    /// Caps concurrent WebSocket connections.
    pub connection_slots: Arc<Semaphore>,
    /// Prefix of connection ids, unique per replica run.
    pub replica: String,
    /// This replica's leases and bus, when several share a Postgres database.
    pub bus: Option<Arc<crate::replica::Replica>>,
}

impl Life {
    /// A life that has not started draining, with `max_connections` connection slots.
    pub fn new(
        tracker: TaskTracker,
        max_connections: usize,
        replica: String,
        bus: Option<Arc<crate::replica::Replica>>,
    ) -> Self {
        Self {
            shutdown: CancellationToken::new(),
            tracker,
            draining: AtomicBool::new(false),
            drain: CancellationToken::new(),
            connection_slots: Arc::new(Semaphore::new(max_connections)),
            replica,
            bus,
        }
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

/// Who a caller is: what verifying a token, a login code or a provider's sign-in needs.
#[derive(Debug)]
pub struct Identities {
    /// The gateway's own tokens.
    pub auth: Authenticator,
    /// One-time login codes (`GET /auth/login?code=`), such as the one `serve` prints.
    pub login_codes: LoginCodes,
    /// The team's identity provider, when `[oidc]` is configured.
    pub oidc: Option<Arc<Oidc>>,
    /// An identity provider's keys named by `jwt.jwks_url` (without `[oidc]`, or beside it).
    pub jwks: Option<Arc<Jwks>>,
    /// Who administers the gateway (`[admin]`).
    pub admin: AdminConfig,
    /// Where sign-ins through the provider are kept (a cookie is good only while its sign-in is).
    pub store: crate::identity::WebSessions,
    /// Device sign-in codes and the devices they signed in (`acp-gateway login`).
    pub devices: crate::identity::Devices,
    /// The sign-ins with open connections on this replica: ending one (sign-out, a device
    /// revoked, here or on another replica) closes them.
    pub watched: Arc<crate::identity::oidc::Watched>,
    /// How long device codes and tokens last (`[device]`).
    pub device: crate::infra::config::DeviceConfig,
    /// Refused tokens are recorded.
    pub audit: Arc<Audit>,
}

impl Identities {
    /// Whether `who` administers this gateway: a user `[admin].users` names, or one whose token
    /// said they are in an `[admin].groups` group.
    pub fn is_admin(&self, who: &Identity) -> bool {
        who.admin || self.admin.users.contains(&who.user)
    }

    /// The keys provider tokens on the API are verified with, once known.
    pub fn provider_keys(&self) -> Option<Arc<Jwks>> {
        self.jwks
            .clone()
            .or_else(|| self.oidc.as_ref().and_then(|o| o.api_keys()))
    }
}

/// Agent processes and what they run under.
#[derive(Debug)]
pub struct Agents {
    /// Agent processes.
    pub pools: Arc<Pools>,
    /// Each user's home, workspace roots and agent sandbox.
    pub tenancy: Arc<Tenancy>,
    /// Per-user caps.
    pub quotas: Arc<Quotas>,
    /// Sign-ins under way (one per user and agent).
    pub signins: Arc<crate::signin::Running>,
}

/// What a user keeps sealed for their agents.
#[derive(Debug)]
pub struct Settings {
    /// Keys users give their agents, sealed at rest.
    pub keys: Arc<Keys>,
    /// Users' own MCP servers, sealed at rest.
    pub user_mcp: Arc<UserMcp>,
}

/// `FromRef<Gateway>` for each substate a route may ask for.
macro_rules! substates {
    ($($ty:ty => |$gw:ident| $get:expr;)*) => {
        $(impl FromRef<Gateway> for $ty {
            fn from_ref($gw: &Gateway) -> Self {
                $get.clone()
            }
        })*
    };
}

substates! {
    Arc<Config> => |gw| gw.config;
    Arc<Life> => |gw| gw.life;
    Arc<Identities> => |gw| gw.identity;
    Arc<Sessions> => |gw| gw.sessions;
    Arc<Pools> => |gw| gw.agents.pools;
    Arc<Tenancy> => |gw| gw.agents.tenancy;
    Arc<Settings> => |gw| gw.settings;
    Arc<Keys> => |gw| gw.settings.keys;
    Arc<UserMcp> => |gw| gw.settings.user_mcp;
    Arc<Shares> => |gw| gw.shares;
    Arc<Push> => |gw| gw.push;
    Arc<Audit> => |gw| gw.audit;
    Arc<Usage> => |gw| gw.usage;
}
