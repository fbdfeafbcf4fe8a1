//! Logs (tracing, filtered by `RUST_LOG`) and metrics (a Prometheus recorder).

use std::io::IsTerminal;
use std::sync::OnceLock;

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer};

/// Installs the log subscriber, writing to stderr (stdout may be an ACP pipe), filtered by
/// `RUST_LOG` or `default_filter`.
pub fn init_logs(default_filter: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let _ = tracing_subscriber::registry()
        .with(log_layer().with_filter(filter))
        .try_init();
}

/// The environment variable that picks the log format.
pub const LOG_FORMAT: &str = "ACP_GATEWAY_LOG_FORMAT";

/// How log lines look: colours only when stderr is a terminal; one JSON object a line with
/// `ACP_GATEWAY_LOG_FORMAT=json` (for log shippers). An unknown format is named on stderr and
/// text is used.
pub fn log_layer<S>() -> Box<dyn Layer<S> + Send + Sync + 'static>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    let json = match std::env::var(LOG_FORMAT).as_deref() {
        Ok("json") => true,
        Ok("text" | "") | Err(_) => false,
        Ok(other) => {
            eprintln!("{LOG_FORMAT}={other:?} is not a log format (json or text); logging text");
            false
        }
    };
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    if json {
        layer.json().flatten_event(true).boxed()
    } else {
        layer.boxed()
    }
}

static METRICS: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// How often histogram samples are folded into their buckets when nobody scrapes (the exporter
/// keeps raw samples until then).
const METRICS_UPKEEP: std::time::Duration = std::time::Duration::from_secs(5);

/// Installs the Prometheus recorder once per process (tests build many gateways in one), with
/// the histograms' buckets, and describes every series ([`crate::infra::metrics`]).
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
    crate::infra::metrics::describe_and_zero([]);
}

fn install_recorder() -> Result<PrometheusHandle, BuildError> {
    let mut builder = PrometheusBuilder::new();
    for (name, buckets) in crate::infra::metrics::BUCKETS {
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
