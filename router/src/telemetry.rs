//! The router's spans (the subscriber and the exporter are `tessera-telemetry`'s). The spans
//! of one request, in the router process unless said otherwise:
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

use axum::http::Request;
use opentelemetry::trace::{TraceContextExt, Tracer};
use tessera_telemetry::Process;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Batch steps link to at most this many requests besides their parent.
const MAX_STEP_LINKS: usize = 64;

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
    tessera_telemetry::set_remote_parent(&span, request.headers());
    span
}

/// A gRPC request carrying the current span's context as W3C `traceparent` metadata.
pub(crate) fn grpc_request<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    tessera_telemetry::inject_current(request.metadata_mut());
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
    let tracer = opentelemetry::global::tracer(Process::Router.tracer());
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
