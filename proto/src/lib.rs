//! The router↔shard gRPC contract (`v1/generate.proto`, package `tessera.v1`), compiled at
//! build time without a system `protoc`, and the conversions between the request parameters
//! of `tessera-params` and their messages (`From` impls, both ways).

mod params;

/// Generated messages, client and server of `tessera.v1`.
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod v1 {
    tonic::include_proto!("tessera.v1");
}
