//! Logs (tracing, filtered by `RUST_LOG`) and metrics (a Prometheus recorder).

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

/// Installs the log subscriber, writing to stderr (stdout may be an ACP pipe).
pub fn init_logs(default_filter: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

static METRICS: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the Prometheus recorder once per process (tests build many gateways in one).
pub fn init_metrics() {
    METRICS.get_or_init(|| PrometheusBuilder::new().install_recorder().ok());
}

/// The current metrics in Prometheus text format.
pub fn render_metrics() -> String {
    init_metrics();
    METRICS
        .get()
        .and_then(Option::as_ref)
        .map(PrometheusHandle::render)
        .unwrap_or_default()
}
