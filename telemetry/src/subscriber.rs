//! The process-wide `tracing` subscriber and the span exporter behind it.

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, fmt};

/// How to log and trace (each process's command-line flags).
#[derive(Debug, Clone, Default)]
pub struct TelemetryConfig {
    /// JSON lines instead of text.
    pub json: bool,
    /// OTLP/gRPC collector endpoint, e.g. `http://otel-collector:4317`; `None`: no export.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the exported spans.
    pub service_name: String,
}

/// The process being set up, which names its tracer, picks its log stream and labels its
/// spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Process {
    /// The router: logs on stdout.
    Router,
    /// A shard: logs on stderr, spans carry its rank (`tessera.rank`).
    Shard {
        /// The shard's rank.
        rank: u32,
    },
}

impl Process {
    /// The name of the process's OpenTelemetry tracer (its instrumentation scope).
    pub fn tracer(self) -> &'static str {
        match self {
            Process::Router => "tessera-router",
            Process::Shard { .. } => "tessera-shard",
        }
    }

    /// The resource attributes of the process's spans besides `service.name`.
    fn attributes(self) -> Vec<KeyValue> {
        match self {
            Process::Router => Vec::new(),
            Process::Shard { rank } => vec![KeyValue::new("tessera.rank", i64::from(rank))],
        }
    }

    /// Whether the process logs on stderr (a shard) rather than stdout (the router).
    fn logs_to_stderr(self) -> bool {
        matches!(self, Process::Shard { .. })
    }
}

/// Why telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// The OTLP exporter could not be built for the endpoint.
    #[error("OTLP span exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    /// A global `tracing` subscriber is already installed.
    #[error("tracing subscriber: {0}")]
    Subscriber(#[from] tracing_subscriber::util::TryInitError),
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
/// JSON lines on the process's log stream, and the OpenTelemetry layer when an endpoint is
/// given (also made the global tracer provider). Must run inside a tokio runtime when
/// exporting (the OTLP client is tonic).
pub fn init(config: &TelemetryConfig, process: Process) -> Result<Telemetry, TelemetryError> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let writer = || {
        if process.logs_to_stderr() {
            BoxMakeWriter::new(std::io::stderr)
        } else {
            BoxMakeWriter::new(std::io::stdout)
        }
    };
    let text = (!config.json).then(|| fmt::layer().with_writer(writer()));
    let json = config.json.then(|| {
        fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(writer())
    });
    let provider = config
        .otlp_endpoint
        .as_deref()
        .map(|endpoint| provider(endpoint, &config.service_name, process))
        .transpose()?;
    let otel = provider.as_ref().map(|p| {
        opentelemetry::global::set_tracer_provider(p.clone());
        tracing_opentelemetry::layer().with_tracer(p.tracer(process.tracer()))
    });
    tracing_subscriber::registry()
        .with(filter)
        .with(text)
        .with(json)
        .with(otel)
        .try_init()?;
    Ok(Telemetry { provider })
}

fn provider(
    endpoint: &str,
    service_name: &str,
    process: Process,
) -> Result<SdkTracerProvider, TelemetryError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()?;
    let resource = Resource::builder()
        .with_service_name(service_name.to_owned())
        .with_attributes(process.attributes())
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_name_their_tracer_and_label_their_spans() {
        assert_eq!(Process::Router.tracer(), "tessera-router");
        assert_eq!(Process::Shard { rank: 3 }.tracer(), "tessera-shard");
        assert!(Process::Router.attributes().is_empty());
        assert_eq!(
            Process::Shard { rank: 3 }.attributes(),
            [KeyValue::new("tessera.rank", 3i64)]
        );
        assert!(Process::Shard { rank: 0 }.logs_to_stderr() && !Process::Router.logs_to_stderr());
    }

    #[test]
    fn the_subscriber_is_installed_once_per_process() {
        let config = TelemetryConfig {
            json: true,
            service_name: "test".into(),
            ..Default::default()
        };
        let first = init(&config, Process::Shard { rank: 1 }).expect("first install");
        first.flush();
        let second = init(&config, Process::Router);
        assert!(matches!(second, Err(TelemetryError::Subscriber(_))));
    }
}
