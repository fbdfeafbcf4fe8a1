//! OpenTelemetry traces, exported over OTLP/HTTP (protobuf) when `OTEL_EXPORTER_OTLP_ENDPOINT`
//! (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; off otherwise, and then nothing here runs on
//! a request's path but one relaxed atomic load ([`enabled`]).
//!
//! Two kinds of span, both on target [`TARGET`] (only they are exported; the logs never see them):
//! - `client_request`, one per request a client sends (`otel.kind = server`): method,
//!   connection, user, session. A client's `_meta.traceparent` (and `tracestate`) is its parent.
//! - `agent_request`, one per request the gateway sends an agent (`otel.kind = client`), a child
//!   of the client request it serves: method, agent, process, pid, session. It lasts until the
//!   agent answers, and the agent gets its W3C `traceparent` (and `tracestate`) in the request's
//!   `_meta`, replacing whatever the client sent under those keys.
//!
//! The standard `OTEL_*` variables apply (endpoint, headers, timeout, sampler, batch processor,
//! resource attributes, `OTEL_SDK_DISABLED`); `service.name` is `acp-gateway` unless
//! `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` names another. The exporter speaks plain
//! HTTP through hyper on the gateway's own runtime (no TLS: point it at a collector beside the
//! gateway).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde::Deserialize;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::prelude::*;

/// The target of every exported span.
pub const TARGET: &str = "acp_gateway::infra::traces";

/// The export timeout when `OTEL_EXPORTER_OTLP_TIMEOUT` says nothing (the specification's).
const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Set once the exporter is installed; read before any span is made.
static ON: AtomicBool = AtomicBool::new(false);

/// Whether traces are being exported (checked before making a span, so that a gateway without
/// them pays one atomic load per request and nothing else).
#[inline]
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The installed exporter: [`Traces::shutdown`] sends what is still buffered.
#[derive(Debug)]
pub struct Traces {
    provider: SdkTracerProvider,
}

impl Traces {
    /// Stops making spans, and exports the buffered ones (at exit).
    pub async fn shutdown(self) {
        ON.store(false, Ordering::Relaxed);
        let provider = self.provider;
        // The batch processor's thread sends through our runtime: block elsewhere.
        let done = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        if let Ok(Err(e)) = done {
            tracing::warn!(error = %e, "could not export the last spans");
        }
    }
}

/// When an OTLP endpoint is configured, installs the global subscriber: the logs (stderr,
/// `RUST_LOG` or `default_filter`, as [`crate::infra::telemetry::init_logs`]) and the span exporter.
/// `None` (nothing installed) when traces are not configured or cannot be set up (said on
/// stderr); call `init_logs` then. Must run inside the Tokio runtime the gateway serves on.
pub fn init(default_filter: &str) -> Option<Traces> {
    let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
    if disabled || !(set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) {
        return None;
    }
    let provider = match provider() {
        Ok(provider) => provider,
        Err(e) => {
            // The logs are not set up yet.
            eprintln!("warning: OpenTelemetry traces are off: {e}");
            return None;
        }
    };
    let logs = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(default_filter))
        .add_directive(format!("{TARGET}=off").parse().ok()?);
    let spans = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("acp-gateway"))
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_filter(filter_fn(|meta| meta.target() == TARGET));
    let installed = tracing_subscriber::registry()
        .with(crate::infra::telemetry::log_layer().with_filter(logs))
        .with(spans)
        .try_init()
        .is_ok();
    if !installed {
        let _ = provider.shutdown();
        return None;
    }
    ON.store(true, Ordering::Relaxed);
    tracing::info!("exporting OpenTelemetry traces over OTLP/HTTP");
    Some(Traces { provider })
}

fn provider() -> anyhow::Result<SdkTracerProvider> {
    let runtime = tokio::runtime::Handle::try_current()?;
    let protocol = std::env::var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_default();
    if !protocol.is_empty() && protocol != "http/protobuf" {
        eprintln!("warning: OTEL_EXPORTER_OTLP_PROTOCOL={protocol} is not supported; sending http/protobuf");
    }
    let client = OnRuntime {
        client: opentelemetry_http::hyper::HyperClient::with_default_connector(export_timeout(), None),
        runtime,
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .build()?;
    let detected = Resource::builder().build();
    let named = detected
        .get(&opentelemetry::Key::from_static_str("service.name"))
        .is_some_and(|name| !name.as_str().starts_with("unknown_service"));
    let mut resource = Resource::builder().with_attribute(opentelemetry::KeyValue::new(
        "service.version",
        env!("CARGO_PKG_VERSION"),
    ));
    if !named {
        resource = resource.with_service_name("acp-gateway");
    }
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build())
}

/// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, else `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds).
fn export_timeout() -> Duration {
    ["OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"]
        .iter()
        .find_map(|name| std::env::var(name).ok()?.trim().parse().ok())
        .map_or(DEFAULT_EXPORT_TIMEOUT, Duration::from_millis)
}

/// hyper's client on the gateway's runtime: the SDK's batch processor exports from a thread of
/// its own, where hyper (which needs a Tokio reactor) could not run.
#[derive(Debug, Clone)]
struct OnRuntime {
    client: opentelemetry_http::hyper::HyperClient,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        self.runtime
            .spawn(async move { client.send_bytes(request).await })
            .await?
    }
}

/// What a span reads of a request's params: the session it names and the W3C context a client
/// sent in `_meta`.
#[derive(Deserialize, Default)]
struct Params<'a> {
    #[serde(rename = "sessionId", borrow, default)]
    session_id: Option<Cow<'a, str>>,
    #[serde(rename = "_meta", borrow, default)]
    meta: Option<Meta<'a>>,
}

#[derive(Deserialize, Default)]
struct Meta<'a> {
    #[serde(borrow, default)]
    traceparent: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tracestate: Option<Cow<'a, str>>,
}

/// Longest client-chosen text a span keeps (a gateway session id is 36 bytes): spans wait in the
/// exporter's queue, and a client may send megabytes.
const MAX_ATTRIBUTE: usize = 64;

/// A client's method as a span name: as it is when it could be a method (short, plain
/// characters), else `other`, so that what a client invents is not kept.
fn span_name(method: &str) -> &str {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/_$.-".contains(c);
    if method.len() <= MAX_ATTRIBUTE && method.chars().all(plain) {
        method
    } else {
        "other"
    }
}

/// `s` cut to at most `max` bytes, at a character boundary.
fn cut(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn read(params: Option<&str>) -> Params<'_> {
    params.and_then(|p| serde_json::from_str(p).ok()).unwrap_or_default()
}

/// The span of one client request: a child of the client's `_meta.traceparent` when it sent
/// one, else a new trace. Call only when [`enabled`].
pub fn client_request(method: &str, connection: &str, user: &str, params: Option<&str>) -> Span {
    let params = read(params);
    let method = span_name(method);
    let span = tracing::info_span!(
        target: TARGET,
        "client_request",
        otel.name = method,
        otel.kind = "server",
        rpc.system = "jsonrpc",
        rpc.method = method,
        connection,
        user,
        session = tracing::field::Empty,
    );
    if let Some(session) = &params.session_id {
        span.record("session", cut(session, MAX_ATTRIBUTE));
    }
    if let Some(Meta {
        traceparent: Some(traceparent),
        tracestate,
    }) = params.meta
    {
        let mut carrier = HashMap::with_capacity(2);
        carrier.insert("traceparent".to_string(), traceparent.into_owned());
        if let Some(tracestate) = tracestate {
            carrier.insert("tracestate".to_string(), tracestate.into_owned());
        }
        let _ = span.set_parent(TraceContextPropagator::new().extract(&carrier));
    }
    span
}

/// The span of one request to an agent process, a child of the current span (the client
/// request it serves, if any). `session` is the gateway's session, when known; the agent's own
/// session id is read from `params`. Call only when [`enabled`].
pub fn agent_request(method: &str, agent: &str, process: u64, pid: u32, session: Option<&str>, params: &str) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "agent_request",
        otel.name = method,
        otel.kind = "client",
        rpc.system = "jsonrpc",
        rpc.method = method,
        agent,
        process,
        pid,
        session = session,
        agent_session = tracing::field::Empty,
    );
    if let Some(agent_session) = read(Some(params)).session_id {
        span.record("agent_session", &*agent_session);
    }
    span
}

/// `params` with the W3C context of `span` in its `_meta` (`traceparent`, and `tracestate` when
/// there is one; a client's values under those keys are replaced). `params` as they are when
/// they are not an object or the span is not exported.
pub fn with_context<'a>(span: &Span, params: &'a str) -> Cow<'a, str> {
    let mut carrier: HashMap<String, String> = HashMap::with_capacity(2);
    TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
    let Some(traceparent) = carrier.get("traceparent") else {
        return Cow::Borrowed(params);
    };
    let tracestate = carrier.get("tracestate").map(String::as_str);
    crate::protocol::with_meta_strings(
        params,
        &[("traceparent", Some(traceparent)), ("tracestate", tracestate)],
    )
    .map_or(Cow::Borrowed(params), Cow::Owned)
}
