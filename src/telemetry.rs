//! Logs (tracing, filtered by `RUST_LOG`) and metrics (a Prometheus recorder).

use std::sync::OnceLock;

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
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

/// How often histogram samples are folded into their buckets when nobody scrapes (the exporter
/// keeps raw samples until then).
const METRICS_UPKEEP: std::time::Duration = std::time::Duration::from_secs(5);

/// Installs the Prometheus recorder once per process (tests build many gateways in one), with
/// the histograms' buckets, and describes every series ([`crate::metrics`]).
pub fn init_metrics() {
    METRICS.get_or_init(|| {
        let handle = install_recorder()
            .map_err(|e| tracing::warn!(error = %e, "cannot install the Prometheus recorder"))
            .ok()?;
        // A plain thread for the life of the process: upkeep must run whether or not a runtime
        // is there, and it never blocks on anything but its timer.
        let upkeep = handle.clone();
        let _ = std::thread::Builder::new()
            .name("metrics-upkeep".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(METRICS_UPKEEP);
                    upkeep.run_upkeep();
                }
            });
        Some(handle)
    });
    crate::metrics::describe_and_zero([]);
}

fn install_recorder() -> Result<PrometheusHandle, BuildError> {
    let mut builder = PrometheusBuilder::new();
    for (name, buckets) in crate::metrics::BUCKETS {
        builder = builder.set_buckets_for_metric(Matcher::Full((*name).to_string()), buckets)?;
    }
    builder.install_recorder()
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
