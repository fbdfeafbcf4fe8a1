//! Start-up and shutdown: builds every part from a [`Config`], binds the listener, serves until a
//! signal, then drains ([`drain`]) and stops: connections closed with 1001, the agents' process
//! groups stopped (TERM, then KILL), the transcript flushed.

use std::net::SocketAddr;
use std::sync::Arc;

pub use crate::gateway::Gateway;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::agents::pool::Pools;
use crate::identity::auth::{Authenticator, LoginCodes};
use crate::infra::config::Config;
use crate::session::{SessionOptions, Sessions};
use crate::store;
use crate::store::cursor::CursorCodec;
use crate::store::persister::Persister;
use crate::tenancy::Tenancy;
use crate::usage::quota::Quotas;

/// Without an identity provider, how often the sign-ins with open connections here are looked
/// up, so that one ended on another replica (a device revoked, a sign-out) closes them here too.
const SIGN_INS_CHECKED_EVERY: Duration = Duration::from_secs(2);

/// Transcript items queued before publishers wait for the database. The queue is one line for
/// every session of the replica, so an update waits behind at most this many (and the batch
/// being committed): it bounds what a stream that outruns the database (a stuck tab's, fed from
/// the store) costs everyone else's round trip. Measured on Postgres (`benches/gateway/stuck.rs`,
/// 2 cores): 65,536 items left another tab waiting up to 113-270 ms, 2,048 up to 19-47 ms, with
/// the same streaming throughput.
const PERSIST_QUEUE: usize = 2_048;

/// A built, bound gateway, ready to run.
pub struct Application {
    /// The bound listener.
    listener: TcpListener,
    /// Shared state.
    gateway: Gateway,
    /// The transcript writer's task, awaited at shutdown.
    persister_task: tokio::task::JoinHandle<()>,
    /// Stops the transcript writer at the end of shutdown.
    persister_cancel: CancellationToken,
    /// The audit log's writer (stops with the persister, after the connections).
    audit_task: tokio::task::JoinHandle<()>,
    /// The usage recorder's writer (stops with the persister).
    usage_task: tokio::task::JoinHandle<()>,
}

impl Application {
    /// Connects the store (migrating it), sets up keys and pools, and binds the listener.
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        // Before anything takes a metric handle (one taken earlier would never record), and so
        // that every series, per configured agent too, is on `/metrics` from the start.
        crate::infra::telemetry::init_metrics();
        crate::infra::metrics::describe_and_zero(config.agents.keys().map(String::as_str));
        // Agents run as our OS user: without this, any of them could read our environment (the
        // JWT secret, DATABASE_URL) from /proc/<gateway>/environ, or ptrace us.
        if let Err(e) = nix::sys::prctl::set_dumpable(false) {
            tracing::warn!(error = %e, "cannot make the gateway undumpable; agents may read its /proc entries");
        }
        let tenancy =
            Arc::new(Tenancy::new(&config).context("setting up user homes, workspaces and the agent sandbox")?);
        tenancy
            .check_network(&config)
            .await
            .context("setting up the agents' network")?;
        let auth = Authenticator::from_config(&config.jwt, &config.data_dir).context("setting up JWT verification")?;
        let store::Database { sessions: store, db } =
            store::open(&config.database_url, config.request_database_url.as_deref())
                .await
                .with_context(|| format!("opening database {}", redact(&config.database_url)))?;
        // The features' tables a request waits on answer in time, as sessions' do.
        let request_db = db.bounded(store::CALL_LIMIT);
        let cursors = CursorCodec::new(store.cursor_key().await.context("loading the cursor key")?);
        let replica = config
            .replica_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string()[..8].to_string());
        // Several replicas may share a Postgres database: sessions are leased, and updates
        // committed by one reach clients of the others (SQLite is one process's).
        let shared = if config.database_url.starts_with("postgres") {
            let ttl = Duration::from_secs(config.limits.lease_ttl_secs.max(1));
            let shared = crate::replica::Replica::connect(&config.database_url, &replica, ttl)
                .await
                .context("connecting the replica bus")?;
            // Two processes under one id would take each other's messages and leases.
            if shared.is_alive(&replica).await.context("checking the replica id")? {
                anyhow::bail!(
                    "another running replica already uses replica id {replica:?} on this database (it holds that id's advisory lock); give each replica its own ACP_GATEWAY_REPLICA_ID (replica_id)"
                );
            }
            Some(shared)
        } else {
            None
        };
        let persister_cancel = CancellationToken::new();
        let (persister, persister_task) = Persister::spawn_leased(
            store.clone(),
            PERSIST_QUEUE,
            config.limits.transcript_queue_bytes,
            persister_cancel.clone(),
            shared.as_ref().map(|r| r.id.clone()),
        );
        let tracker = TaskTracker::new();
        let quotas = Quotas::new(&config.limits);
        let sealer = crate::infra::sealing::Sealer::from_config(config.secrets_key.as_ref(), tenancy.data_dir())
            .context("the secrets key (ACP_GATEWAY_SECRETS_KEY)")?;
        let rows = store::SealedRows::new(db.clone());
        let keys = Arc::new(crate::settings::secrets::Keys::new(rows.clone(), sealer.clone()));
        let user_mcp = Arc::new(crate::settings::user_mcp::UserMcp::new(
            rows.clone(),
            sealer.clone(),
            config.mcp.clone(),
        ));
        let push = Arc::new(crate::push::Push::new(
            config.push.clone(),
            store.clone(),
            rows,
            sealer.clone(),
            tracker.clone(),
        ));
        let (oidc, jwks) =
            crate::identity::oidc::build(&config, &auth, sealer, &crate::identity::WebSessions::new(db.clone()))?;
        let pools = Arc::new(Pools::new(
            &config,
            tenancy.clone(),
            quotas.clone(),
            tracker.clone(),
            Some(keys.clone()),
        ));
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("binding {}", config.listen))?;
        let (usage, usage_task) = crate::usage::Usage::spawn(
            crate::usage::UsageLog::new(db.clone()),
            config.usage.clone(),
            persister_cancel.clone(),
        );
        let options = SessionOptions {
            usage: Some(usage.clone()),
            persister,
            permission_wait: Duration::from_secs(config.limits.permission_wait_secs),
            tracker: tracker.clone(),
            asks: shared
                .clone()
                .map(|replica| crate::session::asks::Asks::new(replica, tracker.clone())),
            replica: shared.clone().map(|r| r as Arc<dyn crate::session::Replicas>),
            user_mcp: Some(user_mcp.clone()),
            push: Some(push.clone()),
        };
        let (audit, audit_task) = crate::audit::Audit::spawn(
            crate::audit::AuditLog::new(db.clone()),
            replica.clone(),
            config.audit.retention_days,
            persister_cancel.clone(),
        );
        let sessions = Sessions::new(store, options, cursors);
        let shares = Arc::new(crate::sharing::Shares::new(crate::sharing::ShareStore::new(
            request_db.clone(),
        )));
        let gateway = Gateway {
            life: Arc::new(crate::gateway::Life::new(
                tracker,
                config.limits.max_connections,
                replica,
                shared,
            )),
            identity: Arc::new(crate::gateway::Identities {
                auth,
                login_codes: LoginCodes::default(),
                watched: oidc.as_ref().map(|o| o.watched.clone()).unwrap_or_default(),
                oidc,
                jwks,
                admin: config.admin.clone(),
                store: crate::identity::WebSessions::new(request_db.clone()),
                devices: crate::identity::Devices::new(request_db.clone()),
                device: config.device.clone(),
                audit: audit.clone(),
            }),
            sessions: Arc::new(sessions),
            agents: Arc::new(crate::gateway::Agents {
                pools,
                tenancy,
                quotas,
                signins: Arc::default(),
            }),
            settings: Arc::new(crate::gateway::Settings { keys, user_mcp }),
            shares,
            push,
            audit,
            usage,
            config: Arc::new(config),
        };
        Ok(Self {
            listener,
            gateway,
            persister_task,
            persister_cancel,
            audit_task,
            usage_task,
        })
    }

    /// The address actually bound (port 0 resolved).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or(self.gateway.config.listen)
    }

    /// Shared state (for tests and the CLI).
    pub fn gateway(&self) -> &Gateway {
        &self.gateway
    }

    /// Serves until `stop` resolves, then drains.
    pub async fn run_until_stopped(
        self,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let gw = self.gateway.clone();
        #[expect(clippy::disallowed_methods, reason = "awaited at the end of shutdown")]
        let maintenance = tokio::spawn(
            gw.agents
                .pools
                .clone()
                .run_maintenance(Duration::from_secs(1), gw.life.shutdown.clone()),
        );
        // The bus and lease renewals outlive the connections: they stop after the last flush.
        let replica_stop = CancellationToken::new();
        #[expect(clippy::disallowed_methods, reason = "awaited after the last flush")]
        let replica_tasks = gw.life.bus.clone().map(|replica| {
            let handler: Arc<dyn crate::replica::Handler> = crate::connection::remote::BusHandler::new(&gw);
            (
                replica.clone(),
                tokio::spawn(replica.clone().run_bus(handler.clone(), replica_stop.clone())),
                tokio::spawn(replica.run_renewals(handler, replica_stop.clone())),
            )
        });
        #[expect(clippy::disallowed_methods, reason = "awaited at the end of shutdown")]
        let sweeper = {
            let gw = gw.clone();
            tokio::spawn(async move {
                let every = Duration::from_secs(gw.config.limits.sweep_interval_secs.max(1));
                let mut tick = tokio::time::interval(every);
                loop {
                    tokio::select! {
                        _ = tick.tick() => {
                            gw.sessions.sweep();
                            gw.agents.quotas.sweep();
                        }
                        () = gw.life.shutdown.cancelled() => return,
                    }
                }
            })
        };
        if gw.config.retention.enabled() {
            gw.life.tracker.spawn(
                crate::retention::Retention {
                    config: gw.config.retention.clone(),
                    sessions: gw.sessions.clone(),
                    audit: gw.audit.clone(),
                    shutdown: gw.life.shutdown.clone(),
                }
                .run(),
            );
        }
        gw.life.tracker.spawn(
            crate::sharing::ShareWatch {
                sessions: gw.sessions.clone(),
                shares: gw.shares.clone(),
                audit: gw.audit.clone(),
                shutdown: gw.life.shutdown.clone(),
                tracker: gw.life.tracker.clone(),
                cadence: crate::sharing::Cadence::default(),
            }
            .run(),
        );
        if let Some(oidc) = gw.identity.oidc.clone() {
            // Discovery now, so that a provider down at start is named in /readyz at once.
            let first = oidc.clone();
            gw.life.tracker.spawn(async move {
                let _ = first.discover().await;
            });
            gw.life
                .tracker
                .spawn(crate::identity::oidc::recheck::run(oidc, gw.life.shutdown.clone()));
        } else {
            gw.life.tracker.spawn(crate::identity::oidc::recheck::watch_ended(
                gw.identity.watched.clone(),
                gw.identity.store.clone(),
                SIGN_INS_CHECKED_EVERY,
                gw.life.shutdown.clone(),
            ));
        }
        let router = crate::http::router(gw.clone());
        let signal_gw = gw.clone();
        let grace = Duration::from_secs(gw.config.limits.shutdown_grace_secs);
        // Drains on the signal, then says when the rest of shutdown must be done.
        #[expect(
            clippy::disallowed_methods,
            reason = "awaited: it says when the rest of shutdown must be done"
        )]
        let signal = tokio::spawn(async move {
            tokio::select! {
                () = stop => {
                    tracing::info!("shutting down: draining connections");
                    let deadline = drain(&signal_gw).await;
                    signal_gw.life.shutdown.cancel();
                    deadline
                }
                () = signal_gw.life.shutdown.cancelled() => tokio::time::Instant::now() + grace,
            }
        });
        // The listener stays open while draining: `/readyz` answers 503, upgrades are refused.
        crate::http::serve(
            self.listener,
            router,
            &gw.config.limits,
            gw.life.shutdown.clone(),
            grace,
        )
        .await;
        let deadline = signal.await.unwrap_or_else(|_| tokio::time::Instant::now() + grace);
        gw.life.shutdown.cancel();
        // WebSocket tasks are ours to wait for (axum's graceful shutdown does not).
        gw.life.tracker.close();
        gw.agents.pools.stop_all();
        if tokio::time::timeout_at(deadline, gw.life.tracker.wait()).await.is_err() {
            tracing::warn!("some connections or agent processes did not finish within the grace period");
        }
        let _ = maintenance.await;
        let _ = sweeper.await;
        // Everything acknowledged is written before we exit.
        if tokio::time::timeout_at(deadline, gw.sessions.flush()).await.is_err() {
            tracing::error!("the transcript writer could not flush within the grace period");
        }
        self.persister_cancel.cancel();
        if let Some((replica, bus, renewals)) = replica_tasks {
            replica_stop.cancel();
            let _ = bus.await;
            let _ = renewals.await;
            // Other replicas may take this one's sessions at once.
            if let Err(e) = replica.release_all().await {
                tracing::warn!(error = %e, "cannot give up session leases; they expire by themselves");
            }
        }
        drop(gw);
        let _ = tokio::time::timeout(grace, self.persister_task).await;
        let _ = tokio::time::timeout(grace, self.audit_task).await;
        let _ = tokio::time::timeout(grace, self.usage_task).await;
        tracing::info!("stopped");
        Ok(())
    }
}

/// Drains the gateway before it stops. At once: `/readyz` answers 503, upgrades and new requests
/// are refused, and every connection with nothing in flight is closed (1001, after what was
/// queued for it). A connection with requests in flight (a prompt streaming) closes the same way
/// once they are answered, for up to `drain_grace_secs`; then every prompt still running is
/// cancelled (`session/cancel` to its agent) and the agents' `cancelled` answers have up to half
/// of `shutdown_grace_secs` to reach their clients. Returns the deadline for the rest of
/// shutdown: the end of `shutdown_grace_secs` from then.
async fn drain(gw: &Gateway) -> tokio::time::Instant {
    gw.life.start_draining();
    let limits = &gw.config.limits;
    let grace = Duration::from_secs(limits.shutdown_grace_secs);
    // Every connection holds one of these slots until its socket is closed.
    let every = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let all_closed = || async {
        let _ = gw.life.connection_slots.acquire_many(every).await;
    };
    let drain_grace = Duration::from_secs(limits.drain_grace_secs);
    if tokio::time::timeout(drain_grace, all_closed()).await.is_ok() {
        tracing::info!("drained: every connection has closed");
        return tokio::time::Instant::now() + grace;
    }
    let deadline = tokio::time::Instant::now() + grace;
    let cancelled = async {
        let prompts = gw.agents.pools.cancel_prompts().await;
        tracing::info!(
            prompts,
            drain_grace_secs = limits.drain_grace_secs,
            "drain grace over: prompts still running are cancelled"
        );
        all_closed().await;
    };
    if tokio::time::timeout(grace / 2, cancelled).await.is_err() {
        tracing::warn!("connections still busy after their prompts were cancelled are closed now");
    }
    deadline
}

/// A database URL with its password hidden, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &url[scheme + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn redacts_passwords() {
        assert_eq!(super::redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(super::redact("sqlite://data/x.db"), "sqlite://data/x.db");
    }
}
