//! The router↔shard gRPC contract (`v1/generate.proto`, package `tessera.v1`), compiled at
//! build time without a system `protoc`, and the conversions between its messages and the
//! domain types they carry, both ways: the request parameters of `tessera-params`
//! (`params.rs`, `From` impls) and a tokenizer's `TokenizerSource` (`tokenizer.rs`).

mod params;
mod tokenizer;

pub use tokenizer::MissingTokenizerSource;

/// Generated messages, client and server of `tessera.v1`.
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod v1 {
    tonic::include_proto!("tessera.v1");
}
