//! Compute primitives that know nothing of models: matrix products, normalisation, rotary
//! embeddings, activations, attention over paged KV blocks, and GGUF quantized blocks.
#![deny(missing_docs)]

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod quant;
