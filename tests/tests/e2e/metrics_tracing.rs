//! Distributed tracing end to end: a local OTLP/gRPC receiver (tonic), the real
//! `tessera-router` binary exporting to it, and a shard (in this process, with the shard's
//! telemetry) exporting to it too. A request sent with a W3C `traceparent` must produce
//! router spans and shard spans in that trace, the shard's `Prefill` a child of the router's
//! `prefill` step, which the context reached only through the gRPC metadata.

use crate::metrics_support;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics_support::{fixture, start_shard};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use tessera_shard::telemetry;
use tessera_telemetry::{Process, TelemetryConfig};
use tokio_stream::wrappers::TcpListenerStream;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

/// A span as received, with its service.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
}

/// The OTLP receiver: keeps every span it is sent.
#[derive(Default, Clone)]
struct Receiver(Arc<Mutex<Vec<Received>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.0.lock().expect("receiver lock");
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref()?.value.as_ref())
                .map(|v| match v {
                    AnyValue::StringValue(s) => s.clone(),
                    other => format!("{other:?}"),
                })
                .unwrap_or_default();
            for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                spans.push(Received {
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                });
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Receiver {
    fn in_trace(&self) -> Vec<Received> {
        let spans = self.0.lock().expect("receiver lock");
        spans
            .iter()
            .filter(|s| s.trace_id == TRACE_ID)
            .cloned()
            .collect()
    }
}

async fn start_receiver() -> (Receiver, String) {
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
    let service = TraceServiceServer::new(receiver.clone());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    (receiver, endpoint)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// The real `tessera-router` binary on a free port, exporting spans to `endpoint`.
struct RouterProcess {
    child: tokio::process::Child,
    base: String,
    http: reqwest::Client,
}

/// Starts the router against the shard on `socket` and waits until it is healthy.
async fn start_router(socket: &str, endpoint: &str) -> RouterProcess {
    let port = free_port();
    let mut router = tokio::process::Command::new(tessera_e2e::binary("tessera-router"))
        .args(["--model-id", fixture().to_str().expect("utf-8 path")])
        .args(["--master-shard-uds-path", socket])
        .args(["--hostname", "127.0.0.1", "--port", &port.to_string()])
        .args(["--otlp-endpoint", endpoint])
        .args(["--otlp-service-name", "tessera-router"])
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env_remove("TESSERA_API_KEY")
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start tessera-router");

    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let health = http.get(format!("{base}/health")).send().await;
        if health.is_ok_and(|r| r.status().is_success()) {
            break;
        }
        if let Ok(Some(status)) = router.try_wait() {
            panic!("tessera-router exited early: {status}");
        }
        assert!(Instant::now() < deadline, "router not healthy within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    RouterProcess {
        child: router,
        base,
        http,
    }
}

/// The spans of the trace, once the router's and the shard's have all arrived.
async fn wait_for_spans(
    receiver: &Receiver,
    shard_telemetry: &tessera_telemetry::Telemetry,
) -> Vec<Received> {
    let wanted_router = ["POST /generate", "validation", "infer", "queue", "prefill"];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        shard_telemetry.flush();
        let spans = receiver.in_trace();
        let has = |service: &str, name: &str| {
            spans.iter().any(|s| s.service == service && s.name == name)
        };
        // Every decode step of the router has its shard span (3 tokens: 2 decode steps).
        let decodes_complete = spans
            .iter()
            .filter(|s| s.service == "tessera-router" && s.name == "decode")
            .all(|d| {
                spans
                    .iter()
                    .any(|s| s.name == "shard.Step" && s.parent_span_id == d.span_id)
            });
        if wanted_router.iter().all(|n| has("tessera-router", n))
            && has("tessera-router", "decode")
            && decodes_complete
            && has("tessera-shard", "shard.Step")
        {
            return spans;
        }
        assert!(
            Instant::now() < deadline,
            "spans of trace {TRACE_ID} after 30 s: {spans:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_and_shard_spans_share_the_callers_trace() {
    let (receiver, endpoint) = start_receiver().await;
    let shard_telemetry = tessera_telemetry::init(
        &TelemetryConfig {
            json: false,
            otlp_endpoint: Some(endpoint.clone()),
            service_name: "tessera-shard".into(),
        },
        Process::Shard { rank: 0 },
    )
    .expect("shard telemetry");
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = start_shard(&dir.path().join("shard"), Some(telemetry::grpc_span)).await;
    let RouterProcess {
        child: mut router,
        base,
        http,
    } = start_router(&socket, &endpoint).await;

    let r = http
        .post(format!("{base}/generate"))
        .header("traceparent", format!("00-{TRACE_ID}-{PARENT_ID}-01"))
        .json(&serde_json::json!({"inputs": "The", "parameters": {"max_new_tokens": 3}}))
        .send()
        .await
        .expect("generate");
    assert_eq!(r.status(), 200);

    let spans = wait_for_spans(&receiver, &shard_telemetry).await;
    let find = |service: &str, name: &str| {
        spans
            .iter()
            .find(|s| s.service == service && s.name == name)
            .unwrap_or_else(|| panic!("{service} span {name}"))
    };
    let http_span = find("tessera-router", "POST /generate");
    assert_eq!(
        http_span.parent_span_id, PARENT_ID,
        "the router's root span continues the caller's span"
    );
    assert_eq!(
        find("tessera-router", "validation").parent_span_id,
        http_span.span_id
    );
    let infer = find("tessera-router", "infer");
    assert_eq!(infer.parent_span_id, http_span.span_id);
    assert_eq!(
        find("tessera-router", "queue").parent_span_id,
        infer.span_id
    );
    let prefill = find("tessera-router", "prefill");
    assert_eq!(prefill.parent_span_id, infer.span_id);
    assert!(
        spans.iter().any(|s| s.service == "tessera-shard"
            && s.name == "shard.Step"
            && s.parent_span_id == prefill.span_id),
        "the shard's span is a child of the router's step, through the gRPC metadata"
    );
    for decode in spans.iter().filter(|s| s.name == "decode") {
        assert_eq!(
            decode.parent_span_id, infer.span_id,
            "decode step under the request"
        );
    }

    router.kill().await.expect("stop router");
}
