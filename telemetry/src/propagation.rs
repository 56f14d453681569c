//! W3C trace context across processes: a caller's `traceparent` read from HTTP headers (the
//! router's HTTP requests, a shard's gRPC calls) and the current span's written into gRPC
//! metadata (the router's calls to the shards).

use http::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tonic::metadata::{MetadataKey, MetadataMap};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

struct MetadataInjector<'a>(&'a mut MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        let key = MetadataKey::from_bytes(key.as_bytes());
        if let (Ok(key), Ok(value)) = (key, value.parse()) {
            self.0.insert(key, value);
        }
    }
}

/// Makes `span` a child of the caller's span when `headers` carry a valid W3C
/// `traceparent`; otherwise leaves it as it is.
pub fn set_remote_parent(span: &Span, headers: &HeaderMap) {
    let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
}

/// Writes the current span's context into `metadata` as W3C `traceparent` (nothing when no
/// span is exported).
pub fn inject_current(metadata: &mut MetadataMap) {
    let cx = Span::current().context();
    TraceContextPropagator::new().inject_context(&cx, &mut MetadataInjector(metadata));
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{TraceId, TracerProvider as _};
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// Runs `f` under a subscriber that gives spans OpenTelemetry contexts (none exported).
    fn traced(f: impl FnOnce()) {
        let tracer = SdkTracerProvider::builder().build().tracer("test");
        let subscriber =
            tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(tracer));
        tracing::subscriber::with_default(subscriber, f);
    }

    fn trace_id(span: &Span) -> TraceId {
        span.context().span().span_context().trace_id()
    }

    #[test]
    fn the_current_span_travels_through_metadata_to_the_callee() {
        traced(|| {
            let caller = tracing::info_span!("caller");
            let mut metadata = MetadataMap::new();
            caller.in_scope(|| inject_current(&mut metadata));
            let headers = metadata.into_headers();
            assert!(headers.contains_key("traceparent"), "{headers:?}");
            let callee = tracing::info_span!(parent: None, "callee");
            set_remote_parent(&callee, &headers);
            assert_eq!(trace_id(&callee), trace_id(&caller));
        });
    }

    #[test]
    fn a_call_without_a_valid_traceparent_keeps_its_own_trace() {
        traced(|| {
            let caller = tracing::info_span!("caller");
            let mut headers = HeaderMap::new();
            headers.insert("traceparent", "00-not-a-trace-01".parse().expect("ascii"));
            for headers in [HeaderMap::new(), headers] {
                let callee = tracing::info_span!(parent: None, "callee");
                set_remote_parent(&callee, &headers);
                assert_ne!(trace_id(&callee), trace_id(&caller));
                assert_ne!(trace_id(&callee), TraceId::INVALID);
            }
        });
    }
}
