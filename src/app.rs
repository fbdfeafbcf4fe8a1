//! Start-up and shutdown: builds every part from a [`Config`], binds the listener, serves until a
//! signal, then drains (stops accepting, closes connections, flushes the transcript, stops the
//! agents) within the grace period.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

pub use crate::gateway::Gateway;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::{Authenticator, LoginCodes};
use crate::config::Config;
use crate::pool::Pools;
use crate::quota::Quotas;
use crate::session::{SessionOptions, Sessions};
use crate::store;
use crate::store::cursor::CursorCodec;
use crate::store::persister::Persister;
use crate::tenancy::Tenancy;

/// Transcript items queued before publishers wait for the database.
const PERSIST_QUEUE: usize = 65_536;

/// A built, bound gateway, ready to run.
pub struct Application {
    /// The bound listener.
    listener: TcpListener,
    /// Shared state.
    gateway: Arc<Gateway>,
    /// The transcript writer's task, awaited at shutdown.
    persister_task: tokio::task::JoinHandle<()>,
    /// Stops the transcript writer at the end of shutdown.
    persister_cancel: CancellationToken,
}

impl Application {
    /// Connects the store (migrating it), sets up keys and pools, and binds the listener.
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        // Before anything takes a metric handle (one taken earlier would never record), and so
        // that every series, per configured agent too, is on `/metrics` from the start.
        crate::telemetry::init_metrics();
        crate::metrics::describe_and_zero(config.agents.keys().map(String::as_str));
        // Agents run as our OS user: without this, any of them could read our environment (the
        // JWT secret, DATABASE_URL) from /proc/<gateway>/environ, or ptrace us.
        if let Err(e) = nix::sys::prctl::set_dumpable(false) {
            tracing::warn!(error = %e, "cannot make the gateway undumpable; agents may read its /proc entries");
        }
        let tenancy =
            Arc::new(Tenancy::new(&config).context("setting up user homes, workspaces and the agent sandbox")?);
        let auth = Authenticator::from_config(&config.jwt, &config.data_dir).context("setting up JWT verification")?;
        let store = store::connect(&config.database_url)
            .await
            .with_context(|| format!("opening database {}", redact(&config.database_url)))?;
        let cursors = CursorCodec::new(store.cursor_key().await.context("loading the cursor key")?);
        let persister_cancel = CancellationToken::new();
        let (persister, persister_task) = Persister::spawn(
            store.clone(),
            PERSIST_QUEUE,
            config.limits.transcript_queue_bytes,
            persister_cancel.clone(),
        );
        let tracker = TaskTracker::new();
        let quotas = Quotas::new(&config.limits);
        let pools = Arc::new(Pools::new(&config, tenancy.clone(), quotas.clone(), tracker.clone()));
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("binding {}", config.listen))?;
        let replica = config
            .replica_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string()[..8].to_string());
        let options = SessionOptions {
            persister,
            permission_wait: Duration::from_secs(config.limits.permission_wait_secs),
            catch_up_bytes: config.limits.client_queue_bytes,
        };
        let gateway = Arc::new(Gateway {
            connection_slots: Arc::new(Semaphore::new(config.limits.max_connections)),
            quotas,
            config,
            auth,
            login_codes: LoginCodes::default(),
            sessions: Sessions::new(store, options, cursors),
            pools,
            tenancy,
            shutdown: CancellationToken::new(),
            tracker,
            draining: AtomicBool::new(false),
            replica,
        });
        Ok(Self {
            listener,
            gateway,
            persister_task,
            persister_cancel,
        })
    }

    /// The address actually bound (port 0 resolved).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or(self.gateway.config.listen)
    }

    /// Shared state (for tests and the CLI).
    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.gateway
    }

    /// Serves until `stop` resolves, then drains.
    pub async fn run_until_stopped(
        self,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let gw = self.gateway.clone();
        let maintenance = tokio::spawn(
            gw.pools
                .clone()
                .run_maintenance(Duration::from_secs(1), gw.shutdown.clone()),
        );
        let sweeper = {
            let gw = gw.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(30));
                loop {
                    tokio::select! {
                        _ = tick.tick() => {
                            gw.sessions.sweep();
                            gw.quotas.sweep();
                        }
                        () = gw.shutdown.cancelled() => return,
                    }
                }
            })
        };
        let router = crate::http::router(gw.clone());
        let signal_gw = gw.clone();
        let signal = tokio::spawn(async move {
            tokio::select! {
                () = stop => {
                    tracing::info!("shutting down: draining connections");
                    signal_gw.draining.store(true, Ordering::Release);
                    signal_gw.shutdown.cancel();
                }
                () = signal_gw.shutdown.cancelled() => {}
            }
        });
        let grace = Duration::from_secs(gw.config.limits.shutdown_grace_secs);
        crate::http::serve(self.listener, router, &gw.config.limits, gw.shutdown.clone(), grace).await;
        let _ = signal.await;
        gw.shutdown.cancel();
        // WebSocket tasks are ours to wait for (axum's graceful shutdown does not).
        gw.tracker.close();
        gw.pools.stop_all();
        if tokio::time::timeout(grace, gw.tracker.wait()).await.is_err() {
            tracing::warn!("some connections or agent processes did not finish within the grace period");
        }
        let _ = maintenance.await;
        let _ = sweeper.await;
        // Everything acknowledged is written before we exit.
        if tokio::time::timeout(grace, gw.sessions.flush()).await.is_err() {
            tracing::error!("the transcript writer could not flush within the grace period");
        }
        self.persister_cancel.cancel();
        drop(gw);
        let _ = tokio::time::timeout(grace, self.persister_task).await;
        tracing::info!("stopped");
        Ok(())
    }
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
