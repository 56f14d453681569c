//! Logs and traces: the `tracing` subscriber (text or JSON lines), an optional OpenTelemetry
//! layer that exports spans over OTLP/gRPC, and W3C trace-context propagation.
//!
//! The spans of one request, in the router process unless said otherwise:
//!
//! ```text
//! http_request            parent: the client's `traceparent` header, when it sends one
//! ├─ validation           tokenization, chat template, parameter checks
//! └─ infer                from queueing until the batcher lets go of the request
//!    ├─ queue             from queueing to the first prefill
//!    └─ prefill / decode  each batch step the request is the oldest member of; the other
//!       │                 members' `infer` spans are linked (at most MAX_STEP_LINKS)
//!       └─ shard.Step     in each shard process: the context travels as `traceparent` in
//!                         the gRPC metadata ([`grpc_request`])
//! ```

use std::time::{Instant, SystemTime};

use axum::http::{HeaderMap, Request};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, Tracer, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, fmt};

/// Name of the OpenTelemetry tracer (instrumentation scope) of the router.
const TRACER: &str = "tessera-router";

/// Batch steps link to at most this many requests besides their parent.
const MAX_STEP_LINKS: usize = 64;

/// How to log and trace.
#[derive(Debug, Clone, Default)]
pub struct TelemetryConfig {
    /// JSON lines instead of text.
    pub json: bool,
    /// OTLP/gRPC collector endpoint, e.g. `http://otel-collector:4317`; `None`: no export.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the exported spans.
    pub service_name: String,
}

/// Keeps the span exporter alive; dropping it flushes and stops it.
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports the spans finished so far (no-op without an exporter).
    pub fn flush(&self) {
        if let Some(Err(e)) = self.provider.as_ref().map(SdkTracerProvider::force_flush) {
            tracing::warn!(error = %e, "flushing spans failed");
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            let _ = p.shutdown();
        }
    }
}

/// Installs the global `tracing` subscriber: `RUST_LOG` filter (default `info`), text or
/// JSON lines on stdout, and the OpenTelemetry layer when an endpoint is given. Must run
/// inside a tokio runtime when exporting (the OTLP client is tonic).
pub fn init(config: &TelemetryConfig) -> anyhow::Result<Telemetry> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let text = (!config.json).then(fmt::layer);
    let json = config.json.then(|| {
        fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(false)
    });
    let provider = config
        .otlp_endpoint
        .as_deref()
        .map(|endpoint| provider(endpoint, &config.service_name))
        .transpose()?;
    let otel = provider.as_ref().map(|p| {
        opentelemetry::global::set_tracer_provider(p.clone());
        tracing_opentelemetry::layer().with_tracer(p.tracer(TRACER))
    });
    tracing_subscriber::registry()
        .with(filter)
        .with(text)
        .with(json)
        .with(otel)
        .try_init()?;
    Ok(Telemetry { provider })
}

fn provider(endpoint: &str, service_name: &str) -> anyhow::Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            Resource::builder()
                .with_service_name(service_name.to_owned())
                .build(),
        )
        .build())
}

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

struct MetadataInjector<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        let key = tonic::metadata::MetadataKey::from_bytes(key.as_bytes());
        if let (Ok(key), Ok(value)) = (key, value.parse()) {
            self.0.insert(key, value);
        }
    }
}

/// The span of one HTTP request (tower-http's `TraceLayer` calls this): a child of the
/// client's W3C `traceparent` when it sends a valid one.
pub(crate) fn http_span<B>(request: &Request<B>) -> Span {
    let span = tracing::info_span!(
        "http_request",
        otel.name = %format!("{} {}", request.method(), request.uri().path()),
        otel.kind = "server",
        http.request.method = %request.method(),
        url.path = %request.uri().path(),
    );
    let parent = TraceContextPropagator::new().extract(&HeaderExtractor(request.headers()));
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
    span
}

/// A gRPC request carrying the current span's context as W3C `traceparent` metadata.
pub(crate) fn grpc_request<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let cx = Span::current().context();
    TraceContextPropagator::new()
        .inject_context(&cx, &mut MetadataInjector(request.metadata_mut()));
    request
}

/// The span of a request while the batcher holds it.
pub(crate) fn infer_span(input_tokens: usize, max_new_tokens: u32) -> Span {
    tracing::info_span!("infer", input_tokens, max_new_tokens)
}

/// Exports a `queue` span under `parent` from `queued` to now (the batcher calls this when
/// the request leaves the queue). No-op when spans are not exported.
pub(crate) fn queue_span(parent: &Span, queued: Instant) {
    let cx = parent.context();
    if !cx.span().span_context().is_valid() {
        return;
    }
    let start = SystemTime::now()
        .checked_sub(queued.elapsed())
        .unwrap_or_else(SystemTime::now);
    let tracer = opentelemetry::global::tracer(TRACER);
    let mut span = tracer
        .span_builder("queue")
        .with_start_time(start)
        .start_with_context(&tracer, &cx);
    opentelemetry::trace::Span::end(&mut span);
}

/// The span of one batch step (`method` is `prefill` or `decode`): a child of the first
/// request's span, linked to the others'.
pub(crate) fn step_span<'a>(
    method: &'static str,
    requests: impl IntoIterator<Item = &'a Span>,
) -> Span {
    let mut requests = requests.into_iter();
    let span = match requests.next() {
        Some(first) => tracing::info_span!(parent: first, "batch_step", otel.name = method, method),
        None => tracing::info_span!(parent: None, "batch_step", otel.name = method, method),
    };
    for other in requests.take(MAX_STEP_LINKS) {
        span.follows_from(other);
    }
    span
}
