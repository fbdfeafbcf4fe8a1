//! OpenTelemetry traces: a real `serve` process (tracing is set up from the environment, once per
//! process) exporting over OTLP/HTTP to a receiver inside the test, a probe agent that records
//! every line it gets, and a client that sends its own W3C `traceparent`.

// Tests and benchmarks spawn freely: their runtime ends with them.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};

use common::serve_process::ServeProcess;
use common::{SECRET, WAIT};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use serde_json::{Value, json};
use tokio::sync::Notify;

const PROBE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/probe_agent.py");

/// One span as the receiver got it.
#[derive(Debug, Clone)]
struct Got {
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    name: String,
    kind: i32,
    attributes: Vec<(String, String)>,
    service: String,
}

impl Got {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

/// A tiny OTLP/HTTP collector: `POST /v1/traces` with a protobuf body.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Got>>>,
    arrived: Arc<Notify>,
}

impl Receiver {
    /// Serves on 127.0.0.1:0; returns its base URL.
    async fn start(&self) -> String {
        let me = self.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let me = me.clone();
                async move {
                    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf export");
                    me.take(request);
                    ([("content-type", "application/x-protobuf")], Vec::<u8>::new())
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await.expect("receiver") });
        format!("http://{addr}")
    }

    fn take(&self, request: ExportTraceServiceRequest) {
        let mut got = self.spans.lock().expect("lock");
        for resource in request.resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .map(|kv| text(kv.value.as_ref()))
                .unwrap_or_default();
            for span in resource.scope_spans.into_iter().flat_map(|s| s.spans) {
                got.push(Got {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    name: span.name.clone(),
                    kind: span.kind,
                    attributes: span
                        .attributes
                        .iter()
                        .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
                        .collect(),
                    service: service.clone(),
                });
            }
        }
        self.arrived.notify_waiters();
    }

    /// Waits until the spans received satisfy `done`; returns them.
    async fn wait_for(&self, what: &str, done: impl Fn(&[Got]) -> bool) -> Vec<Got> {
        tokio::time::timeout(WAIT, async {
            loop {
                let arrived = self.arrived.notified();
                {
                    let spans = self.spans.lock().expect("lock");
                    if done(&spans) {
                        return spans.clone();
                    }
                }
                arrived.await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}: {:#?}", self.spans.lock().expect("lock")))
    }
}

/// Every line the gateway sent `user`'s probe agent.
fn probe_stdin(data: &Path, user: &str) -> Vec<Value> {
    std::fs::read_to_string(data.join("homes").join(user).join("probe-stdin.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_and_agent_requests_are_traced_and_the_agent_gets_the_gateways_traceparent() {
    let receiver = Receiver::default();
    let endpoint = receiver.start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().canonicalize().expect("canon").join("data");
    let config = dir.path().join("gw.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {data:?}\n[agents.default]\ncommand = \"/usr/bin/python3\"\nargs = [{PROBE:?}]\nsandbox = \"none\"\n"
        ),
    )
    .expect("config");
    let db = format!("sqlite://{}", data.join("gw.db").display());
    let gateway = ServeProcess::start_with_env(
        &config,
        &db,
        SECRET,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            // Export within 50 ms rather than the default 5 s.
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    )
    .await;
    let mut alice = gateway.client("alice").await;
    let session = alice.new_session().await;

    let trace_id = uuid::Uuid::new_v4().simple().to_string();
    let client_span = &uuid::Uuid::new_v4().simple().to_string()[..16];
    let traceparent = format!("00-{trace_id}-{client_span}-01");
    let answer = alice
        .request(
            "session/prompt",
            json!({
                "sessionId": session,
                "prompt": [{"type": "text", "text": "hello"}],
                "_meta": {"traceparent": traceparent, "tracestate": "vendor=1"},
            }),
        )
        .await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");

    // The client's request, a child of the client's span; the agent's, a child of it.
    let spans = receiver
        .wait_for("the prompt's client and agent spans", |spans| {
            let prompt = |kind: SpanKind| {
                spans
                    .iter()
                    .any(|s| s.trace_id == trace_id && s.name == "session/prompt" && s.kind == kind as i32)
            };
            prompt(SpanKind::Server) && prompt(SpanKind::Client)
        })
        .await;
    let of_trace: Vec<&Got> = spans.iter().filter(|s| s.trace_id == trace_id).collect();
    let server = of_trace
        .iter()
        .find(|s| s.kind == SpanKind::Server as i32)
        .expect("client request span");
    let client = of_trace
        .iter()
        .find(|s| s.kind == SpanKind::Client as i32)
        .expect("agent request span");
    assert_eq!(
        server.parent_span_id, client_span,
        "the client's traceparent is the parent"
    );
    assert_eq!(
        client.parent_span_id, server.span_id,
        "the agent request is a child of the client's"
    );
    assert_eq!(server.service, "acp-gateway");
    assert_eq!(server.attribute("rpc.method"), Some("session/prompt"));
    assert_eq!(server.attribute("user"), Some("alice"));
    assert_eq!(server.attribute("session"), Some(session.as_str()));
    assert!(
        server
            .attribute("connection")
            .is_some_and(|c| Some(c) == alice.connection_id.as_deref()),
        "{server:?}"
    );
    assert_eq!(client.attribute("agent"), Some("default"));
    assert_eq!(client.attribute("session"), Some(session.as_str()));
    assert!(
        client.attribute("pid").is_some_and(|p| p.parse::<u32>().is_ok()),
        "{client:?}"
    );
    assert!(client.attribute("process").is_some(), "{client:?}");

    // What the agent got: the gateway's own span as its parent, in the same trace.
    let lines = probe_stdin(&data, "alice");
    let prompt = lines
        .iter()
        .find(|l| l["method"] == "session/prompt")
        .expect("the probe got the prompt");
    let got = prompt["params"]["_meta"]["traceparent"]
        .as_str()
        .unwrap_or_else(|| panic!("no traceparent in {prompt}"));
    let parts: Vec<&str> = got.split('-').collect();
    assert_eq!(parts.len(), 4, "{got}");
    assert_eq!(parts[1], trace_id, "same trace");
    assert_ne!(parts[2], client_span, "the gateway's span, not the client's");
    assert_eq!(parts[2], client.span_id, "the agent request's own span");
    assert_eq!(prompt["params"]["_meta"]["tracestate"], "vendor=1", "{prompt}");

    // A request without a traceparent starts a trace of its own, agent request included.
    let new = receiver
        .wait_for("session/new's spans", |spans| {
            spans
                .iter()
                .any(|s| s.name == "session/new" && s.kind == SpanKind::Client as i32)
        })
        .await;
    let agent_new = new
        .iter()
        .find(|s| s.name == "session/new" && s.kind == SpanKind::Client as i32)
        .expect("span");
    let client_new = new
        .iter()
        .find(|s| s.span_id == agent_new.parent_span_id)
        .expect("its parent was exported");
    assert_eq!(
        (client_new.name.as_str(), client_new.kind),
        ("session/new", SpanKind::Server as i32)
    );
    let new_line = lines
        .iter()
        .find(|l| l["method"] == "session/new")
        .expect("the probe got session/new");
    assert!(
        new_line["params"]["_meta"]["traceparent"]
            .as_str()
            .is_some_and(|t| t.contains(&agent_new.span_id)),
        "{new_line}"
    );

    // What a client names is cut before a span keeps it: a 1 MiB method or session id would
    // otherwise sit in the exporter's queue (2,048 spans) as it was sent.
    let trace_id = uuid::Uuid::new_v4().simple().to_string();
    let huge = "m".repeat(1 << 20);
    let answer = alice
        .request(
            &huge,
            json!({"sessionId": huge, "_meta": {"traceparent": format!("00-{trace_id}-{client_span}-01")}}),
        )
        .await;
    assert_eq!(answer["error"]["code"], -32601, "{answer}");
    let spans = receiver
        .wait_for("the unknown method's span", |spans| {
            spans.iter().any(|s| s.trace_id == trace_id)
        })
        .await;
    let span = spans.iter().find(|s| s.trace_id == trace_id).expect("span");
    assert_eq!(span.name, "other");
    assert_eq!(span.attribute("rpc.method"), Some("other"));
    assert!(
        span.attributes.iter().all(|(_, v)| v.len() <= 64),
        "{:?}",
        span.attributes.iter().map(|(k, v)| (k, v.len())).collect::<Vec<_>>()
    );
    gateway.stop().await;
}
