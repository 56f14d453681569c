//! Logs and traces of a shard: the `tracing` subscriber (text or JSON lines on stderr), an
//! optional OpenTelemetry layer exporting spans over OTLP/gRPC, and the span of each gRPC
//! call, a child of the router's batch step through the W3C `traceparent` the router puts
//! in the call's metadata.

use opentelemetry::KeyValue;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tonic::codegen::http;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, fmt};

/// How to log and trace.
#[derive(Debug, Clone, Default)]
pub struct TelemetryConfig {
    /// JSON lines instead of text.
    pub json: bool,
    /// OTLP/gRPC collector endpoint, e.g. `http://otel-collector:4317`; `None`: no export.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the exported spans.
    pub service_name: String,
    /// This shard's rank (a resource attribute of its spans).
    pub rank: u32,
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
/// JSON lines on stderr, and the OpenTelemetry layer when an endpoint is given. Must run
/// inside a tokio runtime when exporting (the OTLP client is tonic).
pub fn init(config: &TelemetryConfig) -> anyhow::Result<Telemetry> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let text = (!config.json).then(|| fmt::layer().with_writer(std::io::stderr));
    let json = config.json.then(|| {
        fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(std::io::stderr)
    });
    let provider = match &config.otlp_endpoint {
        Some(endpoint) => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint)
                .build()?;
            let resource = Resource::builder()
                .with_service_name(config.service_name.clone())
                .with_attribute(KeyValue::new("tessera.rank", i64::from(config.rank)))
                .build();
            Some(
                SdkTracerProvider::builder()
                    .with_batch_exporter(exporter)
                    .with_resource(resource)
                    .build(),
            )
        }
        None => None,
    };
    let otel = provider
        .as_ref()
        .map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer("tessera-shard")));
    tracing_subscriber::registry()
        .with(filter)
        .with(text)
        .with(json)
        .with(otel)
        .try_init()?;
    Ok(Telemetry { provider })
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// The span of one gRPC call (give it to tonic's `Server::trace_fn`): named
/// `shard.<Method>`, a child of the `traceparent` in the call's metadata when there is one.
pub fn grpc_span(request: &http::Request<()>) -> Span {
    let method = request.uri().path().rsplit('/').next().unwrap_or_default();
    let span = tracing::info_span!(
        "grpc",
        otel.name = %format!("shard.{method}"),
        otel.kind = "server",
        rpc.method = method,
    );
    let parent = TraceContextPropagator::new().extract(&HeaderExtractor(request.headers()));
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
    span
}
