//! The span of each gRPC call to a shard, a child of the router's batch step through the
//! W3C `traceparent` the router puts in the call's metadata (the subscriber and the exporter
//! are `tessera-telemetry`'s).

use tonic::codegen::http;
use tracing::Span;

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
    tessera_telemetry::set_remote_parent(&span, request.headers());
    span
}
